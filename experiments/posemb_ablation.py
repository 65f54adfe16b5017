"""The paper's position-embedding ablation on Fashion-MNIST: `python -m experiments.posemb_ablation`.

Trains the README's small ViT with no position embedding, learned 1D, fixed 2D
sine-cosine, the paper's relative attention over 1D offsets (`relative`) and a learned
per-head bias over 2D offsets (`relative_bias`), at equal steps
and seeds, and writes a table of test top-1 (mean ± std over seeds) and plots into
--output_dir. Finished runs are read back, so a stopped experiment continues.
The paper (Table 8): no embedding is clearly worse; the kinds of embedding are close.
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import app, flags

from experiments import common

FLAGS = flags.FLAGS
flags.DEFINE_list("kinds", ["none", "learned", "sincos2d", "relative", "relative_bias"],
                  "Position embeddings to compare.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; every kind runs with each.")
flags.DEFINE_integer("steps", 400, "Optimizer steps per run.")
flags.DEFINE_integer("batch_size", 128, "Batch size.")
flags.DEFINE_string("dataset", "fashion_mnist_local",
                    "TFDS name; the default reads the Debian package offline.")
flags.DEFINE_string("train_split", "train", "Training split (e.g. 'train[:10000]').")
flags.DEFINE_string("output_dir", "reports/posemb_ablation", "Where the table, plots and runs go.")


def _plots(results, output_dir):
    from keras_vit.visualize.plots import pyplot, save_figure

    plt = pyplot()
    kinds = list(results)
    acc = [100 * np.asarray(results[k]["top1"]) for k in kinds]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(kinds, [a.mean() for a in acc], yerr=[a.std(ddof=1) if len(a) > 1 else 0 for a in acc], capsize=4)
    for i, a in enumerate(acc):
        ax.scatter(np.full(len(a), i), a, color="black", s=10, zorder=3)
    lo = min(a.min() for a in acc)
    ax.set_ylim(max(lo - 3, 0), min(max(a.max() for a in acc) + 1, 100))
    ax.set_ylabel("test top-1 (%)")
    ax.set_title("Position embedding ablation")
    return os.path.basename(save_figure(fig, os.path.join(output_dir, "accuracy.png")))


def _similarity_figure(run_dir, output_dir, kind):
    import keras

    import keras_vit  # noqa: F401  (registers the model for loading)
    from keras_vit import visualize

    model = keras.saving.load_model(os.path.join(run_dir, "model.keras"), compile=False)
    path = os.path.join(output_dir, f"similarity_{kind}.png")
    visualize.plot_position_similarity(visualize.position_embedding_similarity(model), path)
    return os.path.basename(path)


def main(argv):
    del argv
    from keras_vit.data import quiet_info_logs

    quiet_info_logs()
    seeds = [int(s) for s in FLAGS.seeds]
    total = len(FLAGS.kinds) * len(seeds)
    results, done, start = {}, 0, time.time()
    for kind in FLAGS.kinds:
        results[kind] = {"top1": [], "seeds": seeds, "train_seconds": []}
        for seed in seeds:
            run_dir = os.path.join(FLAGS.output_dir, "runs", f"{kind}_seed{seed}")
            m = common.run_once(run_dir, FLAGS.steps, FLAGS.batch_size, seed, FLAGS.train_split,
                                model_overrides={"position_embedding": kind}, dataset=FLAGS.dataset)
            results[kind]["top1"].append(m["eval_top1"])
            results[kind]["train_seconds"].append(m["train_seconds"])
            done += 1
            print(f"[{done}/{total}] {kind:9s} seed {seed}: test top-1 {100 * m['eval_top1']:.2f}% "
                  f"({m['train_seconds']:.0f} s; {time.time() - start:.0f} s so far)", flush=True)
    rows = [[k, common.mean_std(r["top1"]), ", ".join(f"{100 * v:.2f}" for v in r["top1"])]
            for k, r in results.items()]
    table = common.markdown_table(["position embedding", "test top-1 (mean ± std)", "per seed"], rows)
    figures = [_plots(results, FLAGS.output_dir)]
    for kind in ("learned", "sincos2d"):
        if kind in results:
            run_dir = os.path.join(FLAGS.output_dir, "runs", f"{kind}_seed{seeds[0]}")
            figures.append(_similarity_figure(run_dir, FLAGS.output_dir, kind))
    intro = (f"The README's small ViT (4 layers, width 64, 4x4 patches, 7x7 tokens) on Fashion-MNIST "
             f"`{FLAGS.train_split}`, tested on the 10k test images: {FLAGS.steps} steps of batch "
             f"{FLAGS.batch_size} per run, seeds {', '.join(map(str, seeds))}. Command: "
             f"`python -m experiments.posemb_ablation --steps={FLAGS.steps} --batch_size={FLAGS.batch_size} "
             f"--seeds={','.join(map(str, seeds))} --train_split='{FLAGS.train_split}'`.")
    path = common.write_report(FLAGS.output_dir, "Position embedding ablation", intro, table, results,
                               figures)
    print(table)
    print(f"Report: {path}\nFigures: {', '.join(os.path.join(FLAGS.output_dir, f) for f in figures)}")


if __name__ == "__main__":
    app.run(main)
