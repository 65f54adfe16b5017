"""The paper's figures from a trained model or a checkpoint: `python -m keras_vit.visualize`.

    python -m keras_vit.visualize rollout  --model=runs/fmnist/model.keras \\
        --images=dataset:fashion_mnist_local:test
    python -m keras_vit.visualize posemb   --model=ViT-B_16.npz
    python -m keras_vit.visualize filters  --model=ViT-B_16.npz --num_filters=28
    python -m keras_vit.visualize distance --model=ViT-B_16.npz --images=skimage:astronaut,skimage:chelsea

Several commands may be given at once (`rollout posemb filters distance`).
--model is a `.keras` file or a checkpoint (official `.npz` or a Hugging Face
directory). Each command writes a PNG and the numbers behind it (`.npy`) to
--output_dir and prints where.
"""

from __future__ import annotations

import io

import numpy as np
from absl import app, flags

COMMANDS = ("rollout", "posemb", "filters", "distance")
NEED_IMAGES = ("rollout", "distance")

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "A .keras file, an official .npz or a Hugging Face ViT directory.")
flags.DEFINE_integer("image_size", None,
                     "Resolution for a checkpoint (position embeddings are interpolated).")
flags.DEFINE_list("images", [], "Image files, folders, globs, skimage:<name> or dataset:<tfds name>:<split>.")
flags.DEFINE_integer("max_images", 8, "Use at most this many images.")
flags.DEFINE_integer("num_filters", 28, "Principal components to show for `filters`.")
flags.DEFINE_string("output_dir", "reports/visualize", "Where the PNGs and .npy files go.")
flags.DEFINE_integer("batch_size", 16, "Images per forward pass.")


def _images(model):
    from keras_vit.visualize.images import load_images

    cfg = model.config
    images, names = load_images(FLAGS.images, cfg.image_size, cfg.num_channels, FLAGS.max_images)
    print(f"Read {len(images)} image(s) at {cfg.image_size[0]}x{cfg.image_size[1]}", flush=True)
    return images, names


def _write(stem: str, numbers: np.ndarray, figure) -> None:
    from keras_vit import storage

    buffer = io.BytesIO()
    np.save(buffer, numbers)
    npy = storage.write_bytes(storage.join(FLAGS.output_dir, f"{stem}.npy"), buffer.getvalue())
    png = figure(storage.join(FLAGS.output_dir, f"{stem}.png"))
    print(f"Wrote {png}\n      {npy} {list(numbers.shape)}")


def _check_usage(commands) -> None:
    """Every problem with the command line at once, before a model is loaded."""
    unknown = [c for c in commands if c not in COMMANDS]
    problems = []
    if not commands or unknown:
        problems.append(f"usage: python -m keras_vit.visualize {{{','.join(COMMANDS)}}}... --model=..."
                        + (f" (unknown: {' '.join(unknown)})" if unknown else ""))
    if not FLAGS.model:
        problems.append("--model is required")
    needing = [c for c in commands if c in NEED_IMAGES]
    if needing and not FLAGS.images:
        problems.append(f"{' and '.join(needing)} need{'s' if len(needing) == 1 else ''} --images")
    if problems:
        raise app.UsageError("; ".join(problems))


def main(argv):
    commands = argv[1:]
    _check_usage(commands)  # before the imports below, which load TensorFlow
    from keras_vit import visualize as vis
    from keras_vit.cli import load_model_or_exit
    from keras_vit.data import quiet_info_logs

    quiet_info_logs()
    model = load_model_or_exit(FLAGS.model, FLAGS.image_size)
    cfg = model.config
    print(f"Model {cfg.name}: {cfg.num_layers} blocks x {cfg.num_heads} heads, grid {cfg.grid_size[0]}x"
          f"{cfg.grid_size[1]}, position embedding {cfg.position_embedding}", flush=True)
    images = names = attention = None
    if set(NEED_IMAGES) & set(commands):
        images, names = _images(model)
        # One forward pass serves both figures.
        attention = vis.attention_weights(model, images, FLAGS.batch_size)
    for command in commands:
        _run(vis, command, model, images, names, attention)


def _run(vis, command, model, images, names, attention):
    cfg = model.config
    if command == "rollout":
        maps = vis.rollout_maps(attention, cfg.grid_size, cfg.num_prefix_tokens)
        _write("rollout", maps, lambda p: vis.plot_rollout(images, maps, p, titles=names))
    elif command == "posemb":
        sim = vis.position_embedding_similarity(model)
        _write("posemb_similarity", sim, lambda p: vis.plot_position_similarity(sim, p))
    elif command == "filters":
        filters = vis.embedding_filters(model, FLAGS.num_filters)
        _write("embedding_filters", filters, lambda p: vis.plot_filters(filters, p))
    else:
        dist = vis.attention_distance(attention, cfg.grid_size, cfg.total_stride, cfg.num_prefix_tokens)
        for layer, row in enumerate(dist):
            print(f"  block {layer:2d}: " + " ".join(f"{d:6.1f}" for d in row))
        _write("attention_distance", dist,
               lambda p: vis.plot_attention_distance(dist, p, image_extent=float(max(cfg.image_size))))


def run():
    from keras_vit.cli import run_app

    run_app(main)


if __name__ == "__main__":
    run()
