"""What both experiments share: the small ViT of the README, one quiet training run, tables."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence

import numpy as np

# The 4-layer, 64-wide ViT with 4x4 patches that the README trains on Fashion-MNIST.
MODEL = "FMNIST-ViT"  # the small ViT of the docs: 4x4 patches, 4 layers of width 64
IMAGE_SIZE = 28
# The README's Fashion-MNIST settings: Adam, short warmup, flips only (Inception crops
# of 28 px images learn far more slowly).
RECIPE = {"learning_rate": 3e-3, "weight_decay": 0.05, "warmup_steps": 100, "dropout_rate": 0.0,
          "crop_area_min": 1.0}


def run_once(run_dir: str, steps: int, batch_size: int, seed: int, train_split: str = "train",
             model_overrides=None, build_model=None, dataset: str = "fashion_mnist_local") -> dict:
    """Trains one model (or reads the result of a finished run in `run_dir`) and returns metrics.json."""
    from keras_vit.training import TrainConfig, train

    metrics_path = os.path.join(run_dir, "metrics.json")
    if os.path.exists(metrics_path):
        with open(metrics_path) as f:
            return json.load(f)
    cfg = TrainConfig(model=MODEL, model_overrides=dict(model_overrides or {}),
                      dataset=dataset, train_split=train_split, image_size=IMAGE_SIZE, steps=steps,
                      batch_size=batch_size, seed=seed, output_dir=run_dir, checkpoint_every=steps,
                      eval_every=0, cache=True, verbose=0, **RECIPE)
    summary = train(cfg, build_model=build_model)  # writes metrics_path last, once finished
    summary.pop("model_obj")
    return summary


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


def write_report(output_dir: str, title: str, intro: str, table: str, results: Dict,
                 figures: List[str]) -> str:
    """Writes `README.md` (title, setup, table, figures) and `results.json`; returns the README path."""
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    path = os.path.join(output_dir, "README.md")
    with open(path, "w") as f:
        f.write(f"# {title}\n\n{intro}\n\n{table}\n")
        for fig in figures:
            f.write(f"![{os.path.splitext(fig)[0]}]({fig})\n\n")
    return path
