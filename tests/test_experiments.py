"""The experiment commands run end to end on a few steps and write tables that match their results."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import keras_vit.training
from keras_vit import hardware
from experiments import common, paper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow
QUICK = ["--steps=2", "--batch_size=16", "--dataset=fashion_mnist_local/mini", "--precision=float32"]


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
    # 200 images: the 10-shot probe needs 10 of each class.
    args = ["--kinds=sincos2d", "--seeds=0,1", "--train_split=train[:200]", f"--output_dir={out}", *QUICK]
    stdout = _run("experiments.posemb_ablation", *args)
    assert "[2/2] sincos2d      seed 1" in stdout and f"Report: {out / 'README.md'}" in stdout
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"sincos2d"}
    readme = (out / "README.md").read_text()
    rows = _table_rows(readme)
    for kind, r in results.items():
        top1, fewshot = 100 * np.asarray(r["top1"]), 100 * np.asarray(r["fewshot"])
        assert len(top1) == len(fewshot) == 2
        assert rows[kind][:2] == [f"{top1.mean():.2f} ± {top1.std(ddof=1):.2f}%",
                                  f"{fewshot.mean():.2f} ± {fewshot.std(ddof=1):.2f}%"]
        # An evaluation after each of the two steps; the last is the run's final top-1.
        assert [[step for step, _ in c] for c in r["curves"]] == [[1, 2], [1, 2]]
        assert [c[-1][1] for c in r["curves"]] == pytest.approx(r["top1"])
    assert "2 steps (0.16 epochs)" in readme and "Table 8" in readme
    assert "## Against the paper" not in readme  # one kind: nothing to compare
    machine = re.escape(hardware.machine())
    assert re.search(rf"; 2 runs under float32 on {machine}, \d+\.\d h of training in all", readme)
    for figure in ("accuracy.png", "learning_curves.png", "similarity_sincos2d.png"):
        assert (out / figure).stat().st_size > 1000
    # The similarity figure is of the first seed's run, kept beside its results.
    assert "![similarity_sincos2d](similarity_sincos2d.png)" in readme
    assert (out / "runs/sincos2d_seed0/similarity.json").exists()
    assert not (out / "runs/sincos2d_seed1/similarity.json").exists()
    # A second start reads the finished runs instead of training again, from their results
    # alone (what git keeps of a run), and draws the figure again from the run's similarities.
    for run in out.glob("runs/*"):
        for path in run.iterdir():
            if path.name not in ("metrics.json", "history.csv", "similarity.json"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    (out / "README.md").unlink()
    (out / "similarity_sincos2d.png").unlink()
    monkeypatch.setattr(keras_vit.training, "train", _must_not_train)
    for seed in (0, 1):
        again = common.run_once(str(out / "runs" / f"sincos2d_seed{seed}"), 2, 16, seed, precision="float32")
        assert again["eval_top1"] == results["sincos2d"]["top1"][seed]
    # ... but not as if they had run under another precision.
    with pytest.raises(ValueError, match=r"sincos2d_seed0 was trained under float32, not mixed_bfloat16: "
                                         r"pass --precision=float32"):
        common.run_once(str(out / "runs" / "sincos2d_seed0"), 2, 16, 0)
    # ... nor as if they had run for another budget.
    with pytest.raises(ValueError, match=r"sincos2d_seed0 was trained for 2 steps, not 4: pass the budget"):
        common.run_once(str(out / "runs" / "sincos2d_seed0"), 4, 16, 0, precision="float32")
    # The report compares its runs with the same runs trained for longer (here, themselves);
    # of an experiment under way, --finished_only reports what has finished and trains nothing,
    # and draws the similarity of the first seed that has it (seed 2 is unfinished; seed 1 kept none).
    _run("experiments.posemb_ablation", *args, f"--longer={out}", "--kinds=sincos2d,none", "--seeds=2,1,0",
         "--finished_only")
    readme = (out / "README.md").read_text()
    assert "The same runs trained for longer ([report](./README.md))" in readme
    assert f"--output_dir={out} --longer={out}`" in readme
    top1 = 100 * results["sincos2d"]["top1"][1]
    assert (f"- sincos2d, seed 1, after 0.2 epochs instead of 0.2: test top-1 {top1:.2f}% (+0.00 points)"
            in readme)
    assert "![similarity_sincos2d](similarity_sincos2d.png)" in readme
    assert (out / "similarity_sincos2d.png").stat().st_size > 1000
    assert "these are still to train: sincos2d seed 2, none seed 2, none seed 1, none seed 0." in readme
    assert _table_rows(readme)["sincos2d"][3] == ", ".join(
        f"{seed}: {100 * results['sincos2d']['top1'][seed]:.2f}" for seed in (1, 0))
    assert not (out / "runs/none_seed0").exists()


def test_inductive_bias_compares_models_by_data_size(tmp_path):
    out = tmp_path / "bias"
    args = ["--models=resnet,hybrid", "--train_sizes=200", "--seeds=0", f"--output_dir={out}", *QUICK]
    stdout = _run("experiments.inductive_bias", *args)
    assert "[2/2] hybrid    200 images" in stdout
    report = json.loads((out / "results.json").read_text())
    readme = (out / "README.md").read_text()
    tables = readme.split("Test top-1 gained")
    rows, gains = _table_rows(tables[0]), _table_rows(tables[1])
    assert set(rows) == {"model", "resnet", "hybrid"} and set(gains) == {"model", "resnet", "hybrid"}
    assert rows["model"][1:] == ["200 images"]
    assert "- test top-1, Hybrid − ViT" not in readme  # no ViT in this run to compare with
    for kind in ("resnet", "hybrid"):
        r = report["results"][kind]["200"]
        assert rows[kind][0] == f"{report['macs'][kind] / 1e6:.1f}"
        assert rows[kind][1] == f"{100 * r['top1'][0]:.2f}% ({100 * r['fewshot'][0]:.2f}%)"
        assert gains[kind][0] == f"{100 * (r['curves'][0][-1][1] - r['curves'][0][0][1]):.2f}%"
    assert re.search(r"Training bit_resnet \([\d,]+ params", stdout)
    for figure in ("accuracy_by_size.png", "learning_curves_200.png"):
        assert (out / figure).stat().st_size > 1000
    # Against the same runs trained for longer (here, themselves, read back): one line a run.
    # With --finished_only, a size nobody has trained on yet reads "-" and is named as still to train.
    _run("experiments.inductive_bias", *args, f"--longer={out}", "--train_sizes=200,400", "--finished_only")
    readme = (out / "README.md").read_text()
    assert "- resnet, 200 images, seed 0, after 0.2 epochs instead of 0.2: test top-1 " in readme
    assert "- hybrid, 200 images, seed 0, after 0.2 epochs instead of 0.2: test top-1 " in readme
    rows = _table_rows(readme.split("Test top-1 gained")[0])
    assert rows["model"][1:] == ["200 images", "400 images"] and rows["hybrid"][2] == "-"
    assert "these are still to train: resnet on 400 images seed 0, hybrid on 400 images seed 0." in readme
    assert not (out / "learning_curves_400.png").exists() and not (out / "runs/resnet_400_seed0").exists()
    # A --longer without a report is refused before anything trains.
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-m", "experiments.inductive_bias", *args,
                             f"--longer={tmp_path / 'none'}"], cwd=ROOT, env=env, capture_output=True,
                            text=True)
    assert result.returncode != 0 and "holds no results.json: run the experiment there first" in result.stderr


def test_a_budget_reads_as_epochs_of_the_split_it_trains_on():
    assert [common.split_images(s) for s in ("train", "train[:1000]", "train[:10%]")] == [60000, 1000, 6000]
    with pytest.raises(ValueError, match="train split must be"):
        common.split_images("test")
    # Steps round up to whole evaluation intervals (a tenth of the run), as training runs them.
    assert common.budget(20, None, 1000, 128) == (160, "20 epochs (160 steps)")
    assert common.budget(20, None, 60000, 128) == (9380, "20 epochs (9,380 steps)")
    assert common.budget(20, 40, 1000, 128) == (40, "40 steps (5.12 epochs)")
    assert common.budget(20, 41, 1000, 128) == (45, "45 steps (5.76 epochs)")


def test_a_report_says_once_how_its_runs_were_trained():
    run = {"precision": "mixed_bfloat16", "machine": "2 AMX cores", "train_seconds": 1800}
    assert common.provenance([run]) == "1 run under mixed_bfloat16 on 2 AMX cores, 0.5 h of training in all."
    pinned = {**run, "machine": "1 AMX core", "train_seconds": 3600}
    assert common.provenance([run, run, pinned]) == (
        "3 runs under mixed_bfloat16 on 1 AMX core (1 run) and 2 AMX cores (2 runs), 2.0 h of training "
        "in all.")


def test_a_longer_budget_is_compared_run_by_run():
    ours = {"learned": {"seeds": [0, 1], "top1": [0.80, 0.82], "fewshot": [0.70, 0.71],
                        "curves": [[[50, 0.7], [100, 0.80]], [[50, 0.7], [100, 0.82]]]},
            "none": {"seeds": [0], "top1": [0.75], "fewshot": [0.6], "curves": [[[100, 0.75]]]}}
    longer = {"learned": {"seeds": [1], "top1": [0.835], "fewshot": [0.70], "curves": [[[200, 0.835]]]}}
    images = {"learned": 6400, "none": 6400}
    assert common.budget_check(ours, longer, 128, images) == (
        "- learned, seed 1, after 4 epochs instead of 2: test top-1 83.50% (+1.50 points), "
        "10-shot linear 70.00% (-1.00 points).")
    assert common.budget_check(ours, {}, 128, images) == ""


def test_the_gain_late_in_a_run_is_measured_from_its_last_fifth():
    curve = [[100, 0.5], [400, 0.8], [800, 0.85], [900, 0.86], [1000, 0.88]]
    assert common.late_gain(curve) == pytest.approx(0.03)  # from step 800, the last at or before 80%
    assert common.late_gain([[1, 0.2], [2, 0.3]]) == pytest.approx(0.1)


@pytest.mark.skipif(not os.path.isdir(os.path.join(ROOT, ".git")), reason="not a git checkout")
def test_git_keeps_a_runs_results_and_not_its_checkpoints():
    run = "reports/posemb_ablation/runs/learned_seed0"
    paths = [f"{run}/{name}" for name in ("metrics.json", "history.csv", "similarity.json", "model.keras",
                                          "backup/chunk", "logs/train/events")]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True).stdout
    assert ignored.split() == paths[3:]


def _cell(*top1, fewshot=None):
    return {"top1": list(top1), "fewshot": list(fewshot or top1)}


def test_a_difference_is_clear_only_beyond_twice_its_standard_error():
    d, clear = common.difference([0.80, 0.81, 0.82], [0.70, 0.71, 0.72])
    assert d == pytest.approx(10.0) and clear is True
    assert common.difference([0.80, 0.85, 0.75], [0.79, 0.84, 0.74])[1] is False
    assert common.difference([0.8], [0.7]) == (pytest.approx(10.0), None)
    assert common.says(-1.234, True) == "-1.23 points (clear)"


def test_the_position_embedding_findings_say_where_they_agree_with_the_paper():
    agree = {"none": _cell(0.70, 0.71, 0.72), "learned": _cell(0.80, 0.81, 0.82),
             "sincos2d": _cell(0.805, 0.80, 0.815)}
    text = paper.posemb_findings(agree)
    assert "- test top-1, no embedding against each: learned -10.00 points (clear)" in text
    assert text.count("Clearly worse without one, as in the paper.") == 2  # top-1 and 10-shot
    assert text.count("None clearly apart, as in the paper") == 2
    # An embedding clearly ahead of the others, and one no better than none: both said.
    disagree = {**agree, "relative": _cell(0.70, 0.715, 0.72, fewshot=[0.80, 0.81, 0.82])}
    text = paper.posemb_findings(disagree)
    assert "Not clearly worse than relative, unlike the paper." in text
    assert "Unlike the paper (0.2 points apart): learned above relative by 9.83 points; " in text
    assert paper.posemb_findings({k: _cell(v["top1"][0]) for k, v in agree.items()}).count("One seed") == 4


def test_the_inductive_bias_findings_follow_the_gap_as_data_grows():
    results = {"resnet": {"1000": _cell(0.80, 0.81, 0.82), "60000": _cell(0.88, 0.885, 0.89)},
               "vit": {"1000": _cell(0.70, 0.71, 0.72), "60000": _cell(0.90, 0.905, 0.91)},
               "hybrid": {"1000": _cell(0.75, 0.76, 0.77), "60000": _cell(0.905, 0.90, 0.91)}}
    text = paper.inductive_bias_findings(results, [1000, 60000])
    assert ("- test top-1, ResNet − ViT: +10.00 points (clear) at 1,000 images, -2.00 points (clear) at "
            "60,000. Ahead at 1,000 images, as in the paper; ViT ahead at 60,000, as in the paper.") in text
    assert "Hybrid − ViT: +5.00 points (clear) at 1,000 images" in text
    assert "within the seeds' noise at 60,000, as in the paper" in text
    results["vit"]["60000"] = _cell(0.84, 0.845, 0.85)  # ResNet still ahead, by less
    results["resnet"]["1000"] = _cell(0.70, 0.72, 0.71)  # and level with ViT at 1k
    text = paper.inductive_bias_findings(results, [1000, 60000])
    assert "Not clearly ahead at 1,000 images, unlike the paper; ViT not ahead at 60,000" in text
    assert "the gap widens by 4.00 points" in text
    assert "still apart at 60,000, unlike the paper" in text
    # Of an experiment under way, each model is compared with ViT where both have run.
    del results["vit"]["60000"]
    text = paper.inductive_bias_findings(results, [1000, 5000, 60000])
    assert "- test top-1, ResNet − ViT: +0.00 points (within the seeds' noise) at 1,000 images. " in text
    assert "60,000" not in text
    assert paper.inductive_bias_findings({"resnet": results["resnet"]}, [1000, 60000]).strip() == ""
