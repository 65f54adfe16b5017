"""The paper's position-embedding ablation on Fashion-MNIST: `python -m experiments.posemb_ablation`.

Trains the README's small ViT with no position embedding, learned 1D, fixed 2D
sine-cosine, the paper's relative attention over 1D offsets (`relative`) and a learned
per-head bias over 2D offsets (`relative_bias`), for the same epochs and seeds, and
writes a table of test top-1 and 10-shot linear accuracy of the frozen features (mean ±
std over seeds), the learning curves and plots into --output_dir. Finished runs are read
back, so a stopped experiment continues.
"""

from __future__ import annotations

import json
import time

import numpy as np
from absl import app, flags

from experiments import common, paper
from keras_vit import storage

# Kinds whose trained embedding's similarity is plotted (of the first finished seed's run).
SIMILARITY_KINDS = ("learned", "sincos2d")

FLAGS = flags.FLAGS
flags.DEFINE_list("kinds", ["none", "learned", "sincos2d", "relative", "relative_bias"],
                  "Position embeddings to compare.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; every kind runs with each.")
flags.DEFINE_float("epochs", 20, "Passes over the training split per run.")
flags.DEFINE_integer("steps", None, "Optimizer steps per run (overrides --epochs).")
flags.DEFINE_integer("batch_size", 128, "Batch size.")
flags.DEFINE_enum("precision", common.PRECISION, ["float32", "mixed_bfloat16"],
                  "Dtype policy of every run (a report's runs share one).")
flags.DEFINE_string("dataset", "fashion_mnist_local",
                    "TFDS name; the default reads the Debian package offline.")
flags.DEFINE_string("train_split", "train", "Training split (e.g. 'train[:10000]').")
flags.DEFINE_string("output_dir", "reports/posemb_ablation", "Where the table, plots and runs go.")
flags.DEFINE_bool("finished_only", False, "Report the finished runs and train none, for a look at an "
                  "experiment still under way; the report names the runs still to train.")
flags.DEFINE_string("longer", None, "--output_dir of the same experiment trained for longer (a few of its "
                    "kinds and seeds suffice): the report compares the runs in both, to show whether this "
                    "budget suffices.")


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
    return storage.basename(save_figure(fig, storage.join(output_dir, "accuracy.png")))


def _similarity_figure(run_dir, output_dir, kind, seed):
    """The trained embedding's similarity plot, of the run in `run_dir`, or None if it has
    neither its model nor its similarities. The similarities are kept in the run as
    `similarity.json` (git keeps them, as it keeps the run's metrics, not its model), so the
    figure always shows the run in the table."""
    from keras_vit import visualize

    sim_path = storage.join(run_dir, "similarity.json")
    model_path = storage.join(run_dir, "model.keras")
    if storage.exists(sim_path):
        sim = np.asarray(json.loads(storage.read_text(sim_path)), dtype="float32")
    elif storage.exists(model_path):
        import keras

        model = keras.saving.load_model(model_path, compile=False)
        sim = visualize.position_embedding_similarity(model)
        storage.write_text(sim_path, json.dumps(np.round(sim.astype("float64"), 4).tolist()))
    else:
        return None
    path = storage.join(output_dir, f"similarity_{kind}.png")
    title = f"{kind} position embedding, seed {seed}: cosine similarity"
    visualize.plot_position_similarity(sim, path, title=title)
    return storage.basename(path)


def main(argv):
    del argv
    from keras_vit.data import quiet_info_logs

    quiet_info_logs()
    seeds = [int(s) for s in FLAGS.seeds]
    try:
        images = common.split_images(FLAGS.train_split)
        common.check_longer(FLAGS.longer)
    except ValueError as e:
        raise app.UsageError(str(e))
    steps, budget = common.budget(FLAGS.epochs, FLAGS.steps, images, FLAGS.batch_size)
    total = len(FLAGS.kinds) * len(seeds)
    results, runs, similarities, missing, done, start = {}, [], {}, [], 0, time.time()
    for kind in FLAGS.kinds:
        for seed in seeds:
            run_dir = storage.join(FLAGS.output_dir, "runs", f"{kind}_seed{seed}")
            if FLAGS.finished_only and not common.finished(run_dir):
                missing.append(f"{kind} seed {seed}")
                continue
            m = common.run_once(run_dir, steps, FLAGS.batch_size, seed, FLAGS.train_split,
                                model_overrides={"position_embedding": kind}, dataset=FLAGS.dataset,
                                precision=FLAGS.precision)
            runs.append(m)
            if kind in SIMILARITY_KINDS and kind not in similarities:
                similarity = _similarity_figure(run_dir, FLAGS.output_dir, kind, seed)
                if similarity:
                    similarities[kind] = similarity
            r = results.setdefault(kind, {"seeds": []})
            r["seeds"].append(seed)
            common.record(r, m)
            done += 1
            common.progress(done, total, f"{kind:13s} seed {seed}", m, start)
    if not results:
        raise app.UsageError(f"no finished runs in {FLAGS.output_dir} of these kinds and seeds")
    rows = [[k, common.mean_std(r["top1"]), common.mean_std(r["fewshot"]),
             common.mean_std([common.late_gain(c) for c in r["curves"]]),
             ", ".join(f"{seed}: {100 * v:.2f}" for seed, v in zip(r["seeds"], r["top1"]))]
            for k, r in results.items()]
    header = ["position embedding", "test top-1", f"{common.FEWSHOT_SHOTS[0]}-shot linear",
              "top-1 gained in the last fifth", "top-1 per seed"]
    table = common.markdown_table(header, rows)
    if FLAGS.longer:
        lines = common.budget_check(results, common.read_results(FLAGS.longer), FLAGS.batch_size,
                                    {kind: images for kind in results})
        table += common.longer_section(lines, FLAGS.longer, FLAGS.output_dir)
    figures = [_plots(results, FLAGS.output_dir),
               common.curves_figure({k: r["curves"] for k, r in results.items()},
                                    {k: images for k in results}, FLAGS.batch_size,
                                    storage.join(FLAGS.output_dir, "learning_curves.png"),
                                    "Test top-1 during training (mean over seeds)")]
    figures += similarities.values()
    command = (f"python -m experiments.posemb_ablation --kinds={','.join(FLAGS.kinds)} "
               + (f"--steps={FLAGS.steps}" if FLAGS.steps else f"--epochs={FLAGS.epochs:g}")
               + f" --batch_size={FLAGS.batch_size} --seeds={','.join(map(str, seeds))} "
               f"--train_split='{FLAGS.train_split}' --precision={FLAGS.precision}"
               + common.output_flags(FLAGS))
    intro = (f"The README's small ViT (4 layers, width 64, 4x4 patches, 7x7 tokens) on Fashion-MNIST "
             f"`{FLAGS.train_split}`, tested on the 10k test images after {budget} of batch "
             f"{FLAGS.batch_size} per run, seeds {', '.join(map(str, seeds))}; mean ± std over seeds. "
             f"{common.FEWSHOT_SHOTS[0]}-shot linear: a ridge classifier on the frozen features of "
             f"{common.FEWSHOT_SHOTS[0]} training images per class, scored on 1,000 test images, the paper's "
             f"other metric. Command: `{command}`; {common.provenance(runs)}{common.still_to_train(missing)}"
             f"\n\n{paper.POSEMB}")
    path = common.write_report(FLAGS.output_dir, "Position embedding ablation", intro, table,
                               paper.posemb_findings(results), results, figures)
    print(table)
    print(f"Report: {path}\nFigures: {', '.join(storage.join(FLAGS.output_dir, f) for f in figures)}")


if __name__ == "__main__":
    app.run(main)
