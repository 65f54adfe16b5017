"""Inductive bias at small data, the paper's Figure 3/4 in miniature: `python -m experiments.inductive_bias`.

Trains a BiT ResNet (StdConv + GroupNorm), the README's small ViT and a hybrid
(one ResNet stage, then the same ViT on its 7x7 feature map) on the first 1k, 5k
and 60k Fashion-MNIST training images. Compute is equal across data sizes (the
same steps and batch, so the same images seen) and close across models (their
forward MACs are in the table). Writes a table and a plot into --output_dir.
The paper's finding: the CNN wins with little data and the gap closes as data grows.
"""

from __future__ import annotations

import os
import time

from absl import app, flags

from experiments import common

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["resnet", "vit", "hybrid"], "Which of resnet, vit, hybrid to train.")
flags.DEFINE_list("train_sizes", ["1000", "5000", "60000"],
                  "Training images: the first N of the train split.")
flags.DEFINE_list("seeds", ["0"], "Seeds; every model and size runs with each.")
flags.DEFINE_integer("steps", 400, "Optimizer steps per run, the same for every model and size.")
flags.DEFINE_integer("batch_size", 128, "Batch size.")
flags.DEFINE_string("dataset", "fashion_mnist_local",
                    "TFDS name; the default reads the Debian package offline.")
flags.DEFINE_string("output_dir", "reports/inductive_bias", "Where the table, plot and runs go.")

# Two BiT stages of three units at half width (the second at stride 2): 28 px -> 4x4 x 256.
RESNET = {"num_layers": (3, 3), "width_factor": 0.5}
# One stage (stride 4: 28 px -> 7x7 x 128), then the small ViT on 1x1 "patches".
HYBRID = {"resnet": {"num_layers": [1], "width_factor": 0.5}, "patch_size": 1}


def build_resnet(num_classes, image_size):
    """The BiT ResNet stem, global average pooling and a zero-initialised head."""
    import keras

    from keras_vit.layers import ResNetStem

    images = keras.Input((image_size, image_size, 3), name="images")
    x = ResNetStem(RESNET["num_layers"], RESNET["width_factor"], name="resnet")(images)
    x = keras.layers.GlobalAveragePooling2D()(x)
    logits = keras.layers.Dense(num_classes, kernel_initializer="zeros", dtype="float32", name="head")(x)
    return keras.Model(images, logits, name="bit_resnet")


def model_macs(kind: str, num_classes: int = 10) -> int:
    from keras_vit import flops
    from keras_vit.configs import ResNetConfig, model_config

    if kind == "resnet":
        stem = ResNetConfig(RESNET["num_layers"], RESNET["width_factor"])
        return sum(flops.resnet_macs(stem, common.IMAGE_SIZE).values()) + stem.out_channels * num_classes
    overrides = HYBRID if kind == "hybrid" else {}
    cfg = model_config(common.MODEL).replace(image_size=common.IMAGE_SIZE, num_classes=num_classes,
                                             **overrides)
    return flops.forward_macs(cfg)


def _run(kind, size, seed):
    run_dir = os.path.join(FLAGS.output_dir, "runs", f"{kind}_{size}_seed{seed}")
    split = "train" if size >= 60000 else f"train[:{size}]"
    if kind == "resnet":
        return common.run_once(run_dir, FLAGS.steps, FLAGS.batch_size, seed, split, build_model=build_resnet,
                               dataset=FLAGS.dataset)
    return common.run_once(run_dir, FLAGS.steps, FLAGS.batch_size, seed, split,
                           model_overrides=HYBRID if kind == "hybrid" else None, dataset=FLAGS.dataset)


def _plot(results, sizes, output_dir):
    import numpy as np

    from keras_vit.visualize.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for kind, by_size in results.items():
        acc = [100 * np.mean(by_size[str(s)]["top1"]) for s in sizes]
        ax.plot(sizes, acc, marker="o", label=kind)
    ax.set_xscale("log")
    ax.set_xlabel("training images")
    ax.set_ylabel("test top-1 (%)")
    ax.set_title("ResNet vs ViT vs hybrid by data size")
    ax.legend()
    return os.path.basename(save_figure(fig, os.path.join(output_dir, "accuracy_by_size.png")))


def main(argv):
    del argv
    for kind in FLAGS.models:
        if kind not in ("resnet", "vit", "hybrid"):
            raise app.UsageError(f"--models takes resnet, vit and hybrid, got {kind!r}")
    from keras_vit.data import quiet_info_logs

    quiet_info_logs()
    sizes = [int(s) for s in FLAGS.train_sizes]
    seeds = [int(s) for s in FLAGS.seeds]
    total = len(FLAGS.models) * len(sizes) * len(seeds)
    results, done, start = {}, 0, time.time()
    for kind in FLAGS.models:
        results[kind] = {}
        for size in sizes:
            entry = results[kind][str(size)] = {"top1": [], "train_seconds": []}
            for seed in seeds:
                m = _run(kind, size, seed)
                entry["top1"].append(m["eval_top1"])
                entry["train_seconds"].append(m["train_seconds"])
                done += 1
                print(f"[{done}/{total}] {kind:6s} {size:6d} images, seed {seed}: test top-1 "
                      f"{100 * m['eval_top1']:.2f}% ({m['train_seconds']:.0f} s; {time.time() - start:.0f} s "
                      "so far)", flush=True)
    macs = {kind: model_macs(kind) for kind in FLAGS.models}
    header = ["model", "MMACs / image"] + [f"{s:,} images" for s in sizes]
    rows = [[kind, f"{macs[kind] / 1e6:.1f}"]
            + [common.mean_std(results[kind][str(s)]["top1"]) for s in sizes]
            for kind in FLAGS.models]
    table = common.markdown_table(header, rows)
    figures = [_plot(results, sizes, FLAGS.output_dir)]
    intro = (f"Test top-1 on the 10k Fashion-MNIST test images after {FLAGS.steps} steps of batch "
             f"{FLAGS.batch_size} for every model and training-set size (the first N train images), seeds "
             f"{', '.join(map(str, seeds))}. ResNet: BiT stages {list(RESNET['num_layers'])} at width factor "
             f"{RESNET['width_factor']}. ViT: 4 layers, width 64, 4x4 patches. Hybrid: one BiT stage, "
             f"then the same ViT on the 7x7 feature map. Command: `python -m experiments.inductive_bias "
             f"--steps={FLAGS.steps} --batch_size={FLAGS.batch_size} --seeds={','.join(map(str, seeds))}`.")
    path = common.write_report(FLAGS.output_dir, "Inductive bias at small data", intro, table,
                               {"results": results, "macs": macs}, figures)
    print(table)
    print(f"Report: {path}\nFigure: {os.path.join(FLAGS.output_dir, figures[0])}")


if __name__ == "__main__":
    app.run(main)
