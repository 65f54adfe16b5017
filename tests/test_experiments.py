"""The experiment commands run end to end on a few steps and write tables that match their results."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import keras_vit.training
from experiments import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow
QUICK = ["--steps=2", "--batch_size=16", "--dataset=fashion_mnist_local/mini"]


def _run(module, *args):
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _table_rows(readme):
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in readme.splitlines() if line.startswith("| ") and "---" not in line}


def _must_not_train(*args, **kwargs):
    raise AssertionError("a finished run was trained again")


def test_posemb_ablation_reports_mean_and_std_over_seeds_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "posemb"
    args = ["--kinds=sincos2d", "--seeds=0,1", "--train_split=train[:64]", f"--output_dir={out}", *QUICK]
    stdout = _run("experiments.posemb_ablation", *args)
    assert "[2/2] sincos2d  seed 1" in stdout and f"Report: {out / 'README.md'}" in stdout
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"sincos2d"}
    rows = _table_rows((out / "README.md").read_text())
    for kind, r in results.items():
        top1 = 100 * np.asarray(r["top1"])
        assert len(top1) == 2
        assert rows[kind][0] == f"{top1.mean():.2f} ± {top1.std(ddof=1):.2f}%"
    assert (out / "accuracy.png").stat().st_size > 1000
    assert (out / "similarity_sincos2d.png").stat().st_size > 1000
    # A second start reads the finished runs instead of training again.
    monkeypatch.setattr(keras_vit.training, "train", _must_not_train)
    for seed in (0, 1):
        again = common.run_once(str(out / "runs" / f"sincos2d_seed{seed}"), 2, 16, seed)
        assert again["eval_top1"] == results["sincos2d"]["top1"][seed]


def test_inductive_bias_compares_models_by_data_size(tmp_path):
    out = tmp_path / "bias"
    stdout = _run("experiments.inductive_bias", "--models=resnet,hybrid", "--train_sizes=32", "--seeds=0",
                  f"--output_dir={out}", *QUICK)
    assert "[2/2] hybrid     32 images" in stdout
    report = json.loads((out / "results.json").read_text())
    rows = _table_rows((out / "README.md").read_text())
    assert set(rows) == {"model", "resnet", "hybrid"}
    assert rows["model"][1:] == ["32 images"]
    for kind in ("resnet", "hybrid"):
        assert rows[kind][0] == f"{report['macs'][kind] / 1e6:.1f}"
        assert rows[kind][1] == f"{100 * report['results'][kind]['32']['top1'][0]:.2f}%"
    assert re.search(r"Training bit_resnet \([\d,]+ params", stdout)
    assert (out / "accuracy_by_size.png").stat().st_size > 1000
