"""Inductive bias at small data, the paper's Figure 3/4 in miniature: `python -m experiments.inductive_bias`.

Trains a BiT ResNet (StdConv + GroupNorm), the README's small ViT and a hybrid
(one ResNet stage, then the same ViT on its 7x7 feature map) on the first 1k, 5k
and 60k Fashion-MNIST training images, each size for its own number of epochs (a
small set needs more passes before its test accuracy stops improving). Models are
of close cost (their forward MACs are in the table). Writes a table of test top-1
and 10-shot linear accuracy (mean ± std over seeds), the learning curves and a plot
into --output_dir.
"""

from __future__ import annotations

import time

from absl import app, flags

from experiments import common, paper
from keras_vit import storage

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["resnet", "vit", "hybrid"], "Which of resnet, vit, hybrid to train.")
flags.DEFINE_list("train_sizes", ["1000", "5000", "60000"],
                  "Training images: the first N of the train split.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; every model and size runs with each.")
flags.DEFINE_list("epochs", ["200", "120", "20"],
                  "Passes over the training images, one per --train_sizes entry.")
flags.DEFINE_integer("steps", None, "Optimizer steps per run, the same for every size (overrides --epochs).")
flags.DEFINE_integer("batch_size", 128, "Batch size.")
flags.DEFINE_enum("precision", common.PRECISION, ["float32", "mixed_bfloat16"],
                  "Dtype policy of every run (a report's runs share one).")
flags.DEFINE_string("dataset", "fashion_mnist_local",
                    "TFDS name; the default reads the Debian package offline.")
flags.DEFINE_string("output_dir", "reports/inductive_bias", "Where the table, plot and runs go.")
flags.DEFINE_bool("finished_only", False, "Report the finished runs and train none, for a look at an "
                  "experiment still under way; the report names the runs still to train.")
flags.DEFINE_string("longer", None, "--output_dir of the same experiment trained for longer (a few of its "
                    "models, sizes and seeds suffice): the report compares the runs in both, to show "
                    "whether these budgets suffice.")

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


def _run_dir(kind, size, seed):
    return storage.join(FLAGS.output_dir, "runs", f"{kind}_{size}_seed{seed}")


def _run(kind, size, steps, seed):
    run_dir = _run_dir(kind, size, seed)
    split = "train" if size >= common.TRAIN_IMAGES else f"train[:{size}]"
    if kind == "resnet":
        return common.run_once(run_dir, steps, FLAGS.batch_size, seed, split, build_model=build_resnet,
                               dataset=FLAGS.dataset, precision=FLAGS.precision)
    return common.run_once(run_dir, steps, FLAGS.batch_size, seed, split,
                           model_overrides=HYBRID if kind == "hybrid" else None, dataset=FLAGS.dataset,
                           precision=FLAGS.precision)


def _plot(results, sizes, output_dir):
    import numpy as np

    from keras_vit.visualize.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for kind, by_size in results.items():
        ran = [s for s in sizes if str(s) in by_size]
        ax.plot(ran, [100 * np.mean(by_size[str(s)]["top1"]) for s in ran], marker="o", label=kind)
    ax.set_xscale("log")
    ax.set_xlabel("training images")
    ax.set_ylabel("test top-1 (%)")
    ax.set_title("ResNet vs ViT vs hybrid by data size")
    ax.legend()
    return storage.basename(save_figure(fig, storage.join(output_dir, "accuracy_by_size.png")))


def _label(kind, size):
    return f"{kind}, {int(size):,} images"


def _by_label(results):
    """{model: {size: cell}} as {"model, N images": cell}."""
    return {_label(kind, size): cell for kind, by_size in results.items() for size, cell in by_size.items()}


def main(argv):
    del argv
    for kind in FLAGS.models:
        if kind not in ("resnet", "vit", "hybrid"):
            raise app.UsageError(f"--models takes resnet, vit and hybrid, got {kind!r}")
    sizes = [min(int(s), common.TRAIN_IMAGES) for s in FLAGS.train_sizes]
    if not FLAGS.steps and len(FLAGS.epochs) != len(sizes):
        raise app.UsageError(f"--epochs needs one value per --train_sizes entry ({len(sizes)}), "
                             f"got {len(FLAGS.epochs)}")
    try:
        common.check_longer(FLAGS.longer)
    except ValueError as e:
        raise app.UsageError(str(e))
    budgets = {size: common.budget(float(FLAGS.epochs[i]) if not FLAGS.steps else 0, FLAGS.steps, size,
                                   FLAGS.batch_size) for i, size in enumerate(sizes)}
    from keras_vit.data import quiet_info_logs

    quiet_info_logs()
    seeds = [int(s) for s in FLAGS.seeds]
    total = len(FLAGS.models) * len(sizes) * len(seeds)
    results, runs, missing, done, start = {}, [], [], 0, time.time()
    for kind in FLAGS.models:
        for size in sizes:
            for seed in seeds:
                if FLAGS.finished_only and not common.finished(_run_dir(kind, size, seed)):
                    missing.append(f"{kind} on {size:,} images seed {seed}")
                    continue
                m = _run(kind, size, budgets[size][0], seed)
                runs.append(m)
                entry = results.setdefault(kind, {}).setdefault(str(size), {"seeds": []})
                entry["seeds"].append(seed)
                common.record(entry, m)
                done += 1
                common.progress(done, total, f"{kind:6s} {size:6d} images, seed {seed}", m, start)
    if not results:
        raise app.UsageError(f"no finished runs in {FLAGS.output_dir} of these models, sizes and seeds")
    kinds = list(results)  # the models with a run (a cell without one reads "-")
    macs = {kind: model_macs(kind) for kind in kinds}
    header = ["model", "MMACs / image"] + [f"{s:,} images" for s in sizes]

    def cells(kind, text):
        return [text(results[kind][str(s)]) if str(s) in results[kind] else "-" for s in sizes]

    rows = [[kind, f"{macs[kind] / 1e6:.1f}"]
            + cells(kind, lambda c: f"{common.mean_std(c['top1'])} ({common.mean_std(c['fewshot'])})")
            for kind in kinds]
    gains = [[kind] + cells(kind, lambda c: common.mean_std([common.late_gain(k) for k in c["curves"]]))
             for kind in kinds]
    table = (common.markdown_table(header, rows) + "\nTest top-1 gained over the last fifth of each run "
             "(as the learning rate decays to 0; `--longer` tells whether a budget suffices):\n\n"
             + common.markdown_table(["model"] + header[2:], gains))
    if FLAGS.longer:
        longer = common.read_results(FLAGS.longer)["results"]
        lines = common.budget_check(_by_label(results), _by_label(longer), FLAGS.batch_size,
                                    {_label(kind, size): size for kind in kinds for size in sizes})
        table += common.longer_section(lines, FLAGS.longer, FLAGS.output_dir)
    figures = [_plot(results, sizes, FLAGS.output_dir)]
    for size in sizes:
        ran = [kind for kind in kinds if str(size) in results[kind]]
        if ran:
            figures.append(common.curves_figure(
                {kind: results[kind][str(size)]["curves"] for kind in ran}, {kind: size for kind in ran},
                FLAGS.batch_size, storage.join(FLAGS.output_dir, f"learning_curves_{size}.png"),
                f"Test top-1 during training on {size:,} images"))
    command = (f"python -m experiments.inductive_bias --models={','.join(FLAGS.models)} "
               f"--train_sizes={','.join(map(str, sizes))} "
               + (f"--steps={FLAGS.steps}" if FLAGS.steps else f"--epochs={','.join(FLAGS.epochs)}")
               + f" --batch_size={FLAGS.batch_size} --seeds={','.join(map(str, seeds))} "
               f"--precision={FLAGS.precision}" + common.output_flags(FLAGS))
    intro = (f"Test top-1 on the 10k Fashion-MNIST test images, and in brackets the 10-shot linear accuracy "
             f"of the frozen features (the paper's other metric), mean ± std over seeds "
             f"{', '.join(map(str, seeds))}; batch {FLAGS.batch_size}; the first N train images, for "
             + "; ".join(f"{s:,} images: {budgets[s][1]}" for s in sizes)
             + f". ResNet: BiT stages {list(RESNET['num_layers'])} at width factor {RESNET['width_factor']}. "
             f"ViT: 4 layers, width 64, 4x4 patches. Hybrid: one BiT stage, then the same ViT on the 7x7 "
             f"feature map. Command: `{command}`; {common.provenance(runs)}{common.still_to_train(missing)}"
             f"\n\n{paper.INDUCTIVE_BIAS}")
    path = common.write_report(FLAGS.output_dir, "Inductive bias at small data", intro, table,
                               paper.inductive_bias_findings(results, sizes),
                               {"results": results, "macs": macs}, figures)
    print(table)
    print(f"Report: {path}\nFigures: {', '.join(storage.join(FLAGS.output_dir, f) for f in figures)}")


if __name__ == "__main__":
    app.run(main)
