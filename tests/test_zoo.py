"""`python -m keras_vit.zoo`, the job `make run` runs today."""

import json
import os
import subprocess
import sys

from keras_vit.flops import forward_macs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_zoo_builds_each_model_and_says_where_it_wrote(tmp_path):
    run = subprocess.run([sys.executable, "-m", "keras_vit.zoo", "--models=ViT-Ti/16,R+ViT-Ti/16",
                          f"--output_dir={tmp_path}"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "non-supported Python version" not in run.stderr  # google-api-core's, filtered by keras_vit
    assert "[1/2] ViT-Ti/16" in run.stdout and "5,717,416 params" in run.stdout
    assert f"Wrote {tmp_path / 'model_zoo.md'} and {tmp_path / 'model_zoo.json'}" in run.stderr
    rows = json.loads((tmp_path / "model_zoo.json").read_text())
    macs = [round(forward_macs(name) / 1e9, 3) for name in ("ViT-Ti/16", "R+ViT-Ti/16")]
    expected = [("ViT-Ti/16", 5_717_416, macs[0]), ("R+ViT-Ti/16", 6_337_704, macs[1])]
    assert [(r["model"], r["params"], r["gmacs"]) for r in rows] == expected
    assert "| ViT-Ti/16 | 5,717,416 | 1.26 | 197 |" in (tmp_path / "model_zoo.md").read_text()
