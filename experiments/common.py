"""What both experiments share: the small ViT of the README, one quiet training run, tables."""

from __future__ import annotations

import collections
import csv
import io
import json
import math
import os
import re
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from keras_vit import storage

# The 4-layer, 64-wide ViT with 4x4 patches that the README trains on Fashion-MNIST.
MODEL = "FMNIST-ViT"  # the small ViT of the docs: 4x4 patches, 4 layers of width 64
IMAGE_SIZE = 28
# The README's Fashion-MNIST settings: Adam, short warmup, flips only (Inception crops
# of 28 px images learn far more slowly).
RECIPE = {"learning_rate": 3e-3, "weight_decay": 0.05, "warmup_steps": 100, "dropout_rate": 0.0,
          "crop_area_min": 1.0}


# Test-set evaluations over a run: the learning curve. Few-shot accuracy of the frozen
# features (the paper's other metric) runs after the first of them and the last.
EVALS = 10
FEWSHOT_SHOTS = (10,)
TRAIN_IMAGES = 60000  # Fashion-MNIST's train split
# Every run of a report trains under one policy, whatever machine a stopped experiment
# resumes on: the committed runs' (bf16 is fast on AMX and AVX512-BF16 cores).
PRECISION = "mixed_bfloat16"


def steps_for(epochs: float, images: int, batch_size: int) -> int:
    """Optimizer steps for `epochs` passes over `images` at `batch_size` (at least one)."""
    return max(1, math.ceil(epochs * images / batch_size))


def split_images(split: str) -> int:
    """Images in a Fashion-MNIST train split: `train`, `train[:N]` or `train[:P%]`."""
    match = re.fullmatch(r"train(?:\[:(\d+)(%?)\])?", split)
    if not match:
        raise ValueError(f"train split must be train, train[:N] or train[:P%], got {split!r}")
    if match.group(1) is None:
        return TRAIN_IMAGES
    n = int(match.group(1))
    return TRAIN_IMAGES * n // 100 if match.group(2) else min(n, TRAIN_IMAGES)


def budget(epochs: float, steps, images: int, batch_size: int) -> Tuple[int, str]:
    """(steps, how the budget reads in a report): `steps` when given, else `epochs` passes,
    rounded up to whole evaluation intervals as training runs them."""
    asked = steps or steps_for(epochs, images, batch_size)
    n = _chunk(asked) * math.ceil(asked / _chunk(asked))
    if steps:
        return n, f"{n:,} steps ({n * batch_size / images:.2f} epochs)"
    return n, f"{epochs:g} epochs ({n:,} steps)"


def curves_figure(curves_by_label: Dict[str, List], images: Dict[str, int], batch_size: int, path: str,
                  title: str) -> str:
    """Mean test top-1 against epochs, one line per label (each a list of per-seed curves)."""
    from keras_vit.visualize.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for label, curves in curves_by_label.items():
        steps = np.asarray([step for step, _ in curves[0]], dtype="float64")
        acc = 100 * np.mean([[a for _, a in c] for c in curves], axis=0)
        ax.plot(steps * batch_size / images[label], acc, marker=".", label=label)
    ax.set_xlabel("epochs")
    ax.set_ylabel("test top-1 (%)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return storage.basename(save_figure(fig, path))


def _chunk(steps: int) -> int:
    """Steps between the run's evaluations (its checkpoints)."""
    return math.ceil(steps / min(EVALS, steps))


def finished(run_dir: str) -> bool:
    """Whether the run in `run_dir` has finished (training writes its metrics.json last)."""
    return storage.exists(storage.join(run_dir, "metrics.json"))


def run_once(run_dir: str, steps: int, batch_size: int, seed: int, train_split: str = "train",
             model_overrides=None, build_model=None, dataset: str = "fashion_mnist_local",
             precision: str = PRECISION) -> dict:
    """Trains one model (or reads the result of a finished run in `run_dir`) and returns
    metrics.json, with `curve`: [(step, test top-1)] at `EVALS` points of the run.

    `steps` should be a multiple of `_chunk(steps)` (as `budget` returns). A finished run
    trained for other steps or under another precision is refused: one report's runs differ
    only in what the experiment compares."""
    from keras_vit.training import TrainConfig, train

    metrics_path = storage.join(run_dir, "metrics.json")
    if not finished(run_dir):
        # verbose=2: a line per chunk with its test top-1, since one run can take half an hour.
        cfg = TrainConfig(model=MODEL, model_overrides=dict(model_overrides or {}),
                          dataset=dataset, train_split=train_split, image_size=IMAGE_SIZE, steps=steps,
                          batch_size=batch_size, seed=seed, output_dir=run_dir,
                          checkpoint_every=_chunk(steps), eval_every=1, fewshot_every=EVALS,
                          fewshot_shots=FEWSHOT_SHOTS, cache=True, verbose=2, precision=precision,
                          **RECIPE)
        train(cfg, build_model=build_model)  # writes metrics_path last, once finished
    metrics = json.loads(storage.read_text(metrics_path))
    if metrics["steps"] != steps:
        raise ValueError(f"{run_dir} was trained for {metrics['steps']:,} steps, not {steps:,}: pass the "
                         f"budget it was trained with, another --output_dir, or delete the run to train "
                         f"it again")
    if metrics["precision"] != precision:
        raise ValueError(f"{run_dir} was trained under {metrics['precision']}, not {precision}: pass "
                         f"--precision={metrics['precision']}, or delete the run to train it again")
    metrics["curve"] = learning_curve(run_dir, steps)
    return metrics


def learning_curve(run_dir: str, steps: int) -> List[list]:
    """[(step, test top-1)] of each evaluation in the run's history.csv."""
    history = storage.read_text(storage.join(run_dir, "history.csv"))
    rows = [row for row in csv.DictReader(io.StringIO(history))
            if row.get("val_top1") not in (None, "", "NA")]
    return [[min((int(row["epoch"]) + 1) * _chunk(steps), steps), float(row["val_top1"])] for row in rows]


def fewshot_top1(metrics: dict, shots: int = FEWSHOT_SHOTS[0]) -> float:
    """The run's last `shots`-shot linear accuracy of the frozen features."""
    return float(metrics["fewshot"][str(shots)]["mean"])


def late_gain(curve: Sequence[Sequence[float]]) -> float:
    """Test top-1 gained over the last fifth of the run (under a decaying learning rate, never
    quite 0: compare with a longer run to tell whether the budget suffices)."""
    steps = curve[-1][0]
    before = [acc for step, acc in curve if step <= 0.8 * steps]
    return curve[-1][1] - (before[-1] if before else curve[0][1])


def record(cell: dict, metrics: dict) -> None:
    """Adds a finished run's test top-1, few-shot accuracy, curve and time to a table cell."""
    for key, value in (("top1", metrics["eval_top1"]), ("fewshot", fewshot_top1(metrics)),
                       ("curves", metrics["curve"]), ("train_seconds", metrics["train_seconds"])):
        cell.setdefault(key, []).append(value)


def progress(done: int, total: int, what: str, metrics: dict, start: float) -> None:
    """One line per finished run: `[done/total] what: its accuracies (seconds)`."""
    print(f"[{done}/{total}] {what}: test top-1 {100 * metrics['eval_top1']:.2f}%, 10-shot "
          f"{100 * fewshot_top1(metrics):.2f}% ({metrics['train_seconds']:.0f} s; "
          f"{time.time() - start:.0f} s so far)", flush=True)


def budget_check(results: Dict[str, dict], longer: Dict[str, dict], batch_size: int,
                 images: Dict[str, int]) -> str:
    """The same runs at a longer budget against ours, one line per run in both (label and
    seed): does the budget suffice? `results` and `longer` map labels to table cells with
    `seeds`, `top1`, `fewshot` and `curves`; `images` maps labels to their training images.
    "" when no run is in both."""
    lines = []
    for label, cell in results.items():
        other = longer.get(label, {})
        for i, seed in enumerate(cell["seeds"]):
            if seed not in other.get("seeds", []):
                continue
            j = other["seeds"].index(seed)
            ours, theirs = (round(c["curves"][k][-1][0] * batch_size / images[label], 1)
                            for c, k in ((cell, i), (other, j)))
            metrics = (("top1", "test top-1"), ("fewshot", f"{FEWSHOT_SHOTS[0]}-shot linear"))
            gains = [f"{name} {100 * other[key][j]:.2f}% ({100 * (other[key][j] - cell[key][i]):+.2f} points)"
                     for key, name in metrics]
            lines.append(f"- {label}, seed {seed}, after {theirs:g} epochs instead of {ours:g}: "
                         + ", ".join(gains) + ".")
    return "\n".join(lines)


def check_longer(longer_dir: Optional[str]) -> None:
    """Refuses, before any training, a --longer that holds no report."""
    if longer_dir and not storage.exists(storage.join(longer_dir, "results.json")):
        raise ValueError(f"--longer={longer_dir} holds no results.json: run the experiment there first")


def read_results(output_dir: str) -> dict:
    """A report's `results.json`."""
    return json.loads(storage.read_text(storage.join(output_dir, "results.json")))


def longer_section(lines: str, longer_dir: str, output_dir: str) -> str:
    """`budget_check`'s lines under a heading that links the longer report ("" without lines)."""
    if not lines:
        return ""
    link = longer_dir if storage.is_url(longer_dir) else storage.relpath(longer_dir, output_dir)
    return f"\nThe same runs trained for longer ([report]({storage.join(link, 'README.md')})):\n\n{lines}\n"


def output_flags(flag_values) -> str:
    """The command's --output_dir (when not its default) and --longer, as a report quotes them."""
    out = flag_values["output_dir"]
    text = "" if out.value == out.default else f" --output_dir={out.value}"
    return text + (f" --longer={flag_values.longer}" if flag_values.longer else "")


def provenance(runs: Sequence[dict]) -> str:
    """How the runs were trained, once for a report: precision, machines and hours."""
    precisions = sorted({m["precision"] for m in runs})
    machines = collections.Counter(m.get("machine", "an unrecorded machine") for m in runs)
    on = " and ".join(machines) if len(machines) == 1 else " and ".join(
        f"{machine} ({n} run{'s' if n > 1 else ''})" for machine, n in sorted(machines.items()))
    hours = sum(m["train_seconds"] for m in runs) / 3600
    count = f"{len(runs)} run{'s' if len(runs) > 1 else ''}"
    return f"{count} under {' and '.join(precisions)} on {on}, {hours:.1f} h of training in all."


def still_to_train(missing: Sequence[str]) -> str:
    """The sentence a `--finished_only` report adds after its provenance ("" when none is missing)."""
    return f" Of its runs, these are still to train: {', '.join(missing)}." if missing else ""


def difference(a: Sequence[float], b: Sequence[float]) -> Tuple[float, Optional[bool]]:
    """Mean of `a` minus mean of `b` in points (accuracies are fractions), and whether the
    difference is clear: beyond twice its standard error over seeds (None with fewer than
    two seeds on a side, where there is no spread to judge it by)."""
    a, b = 100 * np.asarray(a, dtype="float64"), 100 * np.asarray(b, dtype="float64")
    d = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return d, None
    se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return d, abs(d) > 2 * se


def says(d: float, clear: Optional[bool]) -> str:
    """A difference as a report words it: `+1.20 points (clear)`."""
    noise = {None: "one seed", True: "clear", False: "within the seeds' noise"}[clear]
    return f"{d:+.2f} points ({noise})"


def mean_std(values: Sequence[float]) -> str:
    """`mean ± std` in percent (sample std over seeds; just the value for one seed)."""
    v = 100 * np.asarray(values, dtype="float64")
    if len(v) == 1:
        return f"{v[0]:.2f}%"
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}%"


def markdown_table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_report(output_dir: str, title: str, intro: str, table: str, findings: str, results: Dict,
                 figures: List[str]) -> str:
    """Writes `README.md` (title, setup, table, findings against the paper's when there are
    any, figures) and `results.json` into `output_dir` (local or a bucket); returns the
    README path."""
    storage.write_text(storage.join(output_dir, "results.json"), json.dumps(results, indent=2))
    text = f"# {title}\n\n{intro}\n\n{table}\n"
    if findings.strip():
        text += f"## Against the paper\n\n{findings}\n"
    text += "".join(f"![{os.path.splitext(fig)[0]}]({fig})\n\n" for fig in figures)
    return storage.write_text(storage.join(output_dir, "README.md"), text)
