"""The benchmarks' shared set-up: each case must run under the precision it reports."""

import re

import keras
import pytest

import keras_vit
from benchmarks import measure, run_record, targets
from keras_vit import zoo


def _tiny():
    return {"ours": keras_vit.create_model("ViT-Ti/16", num_classes=2, image_size=32)}


def test_fresh_models_builds_every_case_under_its_policy():
    """clear_session resets the global policy to float32: a second mixed_bfloat16 case
    once ran in float32 while reported as bf16."""
    for policy in ["mixed_bfloat16", "mixed_bfloat16", "float32", "mixed_bfloat16"]:
        model = measure.fresh_models(_tiny, policy)["ours"]
        assert model.dtype_policy.name == policy
        assert model.compute_dtype == ("bfloat16" if policy == "mixed_bfloat16" else "float32")


def test_fresh_models_refuses_a_model_built_under_another_policy():
    def build():
        keras.mixed_precision.set_global_policy("float32")
        return _tiny()

    with pytest.raises(RuntimeError, match="built under float32, not mixed_bfloat16"):
        measure.fresh_models(build, "mixed_bfloat16")


def test_zoo_describe_keeps_the_global_policy():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    zoo.describe("ViT-Ti/16", 32, 2)
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"


def test_the_timer_waits_on_one_element_of_each_result_not_a_copy_of_it():
    """Fetching a whole `[6304, 3072]` result copied it (15 ms, more than the op took),
    which added a constant to every large-output case and understated the matmul peak."""
    import numpy as np
    import tensorflow as tf

    big = tf.reshape(tf.range(6304 * 3072, dtype=tf.float32), [6304, 3072])
    aux = [tf.constant(7, tf.int64), tf.zeros([0, 4]), tf.Variable([[3.0]])]
    result = {"logits": big, "aux": aux, "loss": 0.5}
    fetched = measure.wait_for(result)  # tf.nest visits a dict's keys in sorted order
    assert [f.tolist() for f in fetched] == [[7], [], [3.0], [0.0]]
    assert all(isinstance(f, np.ndarray) for f in fetched)


def _xspace(events, line_name="tf_Compute/1"):
    """A one-line trace: each event is (name, start_ps, end_ps, {stat: value})."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    xspace = xplane_pb2.XSpace()
    plane = xspace.planes.add(name="/host:CPU")
    stat_ids = {}

    def stat_id(name):
        if name not in stat_ids:
            stat_ids[name] = len(stat_ids) + 1
            plane.stat_metadata[stat_ids[name]].name = name
        return stat_ids[name]

    line = plane.lines.add(name=line_name)
    for i, (name, start, end, stats) in enumerate(events, 1):
        plane.event_metadata[i].name = name
        event = line.events.add(metadata_id=i, offset_ps=start, duration_ps=end - start)
        for key, value in stats.items():
            if key == "kernel_type":  # the profiler stores it as a reference to a name
                event.stats.add(metadata_id=stat_id(key), ref_value=stat_id(value))
            else:
                event.stats.add(metadata_id=stat_id(key), str_value=value)
    return xspace


def test_op_times_are_exclusive_and_label_async_kernels():
    """A function call's body, recorded inside its async kernel, must count once: the
    README's profile shares would otherwise add up to more than the op time."""
    from benchmarks import op_trace

    events = [
        ("ExecutorState::Process", 0, 1000, {}),  # bookkeeping around everything
        ("block/conv:Conv2D", 0, 100, {}),
        ("ExecutorState::ProcessAsync::Start", 100, 400,
         {"name": "block/PartitionedCall", "kernel_type": "PartitionedCall"}),
        ("block/gelu/Tanh:Tanh", 150, 250, {}),
        ("block/gelu/Cast:Cast", 160, 170, {}),
        ("block/conv_1:Conv2D", 400, 450, {}),  # starts as the call ends: not inside it
    ]
    ps = 1e-12
    assert op_trace.op_times(_xspace(events)) == pytest.approx(
        {"Conv2D": 150 * ps, "PartitionedCall": 200 * ps, "Tanh": 90 * ps, "Cast": 10 * ps})
    assert op_trace.op_times(_xspace(events), by="node") == pytest.approx(
        {"block/conv (Conv2D)": 100 * ps, "block/conv_1 (Conv2D)": 50 * ps,
         "block/PartitionedCall (PartitionedCall)": 200 * ps, "block/gelu/Tanh (Tanh)": 90 * ps,
         "block/gelu/Cast (Cast)": 10 * ps})
    assert op_trace.op_times(_xspace(events, line_name="python")) == {}
    with pytest.raises(ValueError, match="by must be"):
        op_trace.op_times(_xspace(events), by="layer")


def test_op_trace_of_a_real_forward_pass(tmp_path):
    import tensorflow as tf

    from benchmarks import op_trace

    model = measure.fresh_models(_tiny, "float32")["ours"]
    call = measure.model_call(model, tf.zeros([2, 32, 32, 3]), None)
    measure.wait_for(call())
    times = op_trace.op_times(op_trace.trace(call, 2, str(tmp_path)))
    assert sum(times.values()) > 0
    assert any("MatMul" in kind or "Conv2D" in kind for kind in times), times
    assert "Softmax" in " ".join(times), times


def test_speedup_is_the_median_paired_ratio_with_an_interval_around_it():
    import numpy as np

    rng = np.random.default_rng(1)
    drift = rng.uniform(0.3, 0.6, 60)  # the machine's load, shared by a round's two calls
    base = drift * (1 + rng.normal(0, 0.02, 60))
    new = drift / 1.25 * (1 + rng.normal(0, 0.02, 60))
    median, low, high = measure.speedup(base, new)
    assert low <= median <= high
    assert low < 1.25 < high and high - low < 0.03
    assert measure.speedup(base, base) == (1.0, 1.0, 1.0)
    assert measure.format_speedup((1.0512, 1.0, 1.0861)) == "1.051x (1.000-1.086)"


def test_speedup_refuses_unpaired_rounds():
    with pytest.raises(ValueError, match="same number of rounds"):
        measure.speedup([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="same number of rounds"):
        measure.speedup([], [])
    with pytest.raises(ValueError, match="confidence"):
        measure.speedup([1.0], [1.0], confidence=1.0)


def test_fastest_per_round_pairs_each_model_at_its_best_setting():
    import numpy as np

    off, on = np.array([3.0, 1.0, 2.0]), np.array([2.0, 2.0, 2.5])
    np.testing.assert_array_equal(measure.fastest_per_round(off, on), [2.0, 1.0, 2.0])
    np.testing.assert_array_equal(measure.fastest_per_round(off), off)
    # Ours best with XLA off, theirs with it on: each round compares the two bests.
    theirs = measure.fastest_per_round([4.0, 1.5, 4.0], [3.0, 2.0, 3.0])
    assert measure.speedup(theirs, measure.fastest_per_round(off, on))[0] == 1.5
    for bad in ([], [off, on[:2]], [off.reshape(1, 3)]):
        with pytest.raises(ValueError, match="equal"):
            measure.fastest_per_round(*bad)


def test_verdict_needs_the_whole_interval_on_one_side_of_the_target():
    assert targets.verdict((1.26, 1.23, 1.29), 1.2) == "yes"
    assert targets.verdict((1.25, 1.2, 1.3), 1.2) == "yes"  # at the target counts
    assert targets.verdict((1.164, 1.130, 1.197), 1.2) == "no"
    assert targets.verdict((1.19, 1.14, 1.22), 1.2) == "at the edge"


def _paired_rounds(rng, ratio, rounds=40):
    drift = rng.uniform(1.0, 1.5, rounds)  # the machine's load, shared by a round's two calls
    return drift * (1 + rng.normal(0, 0.01, rounds)), drift / ratio * (1 + rng.normal(0, 0.01, rounds))


def test_best_row_judges_the_paired_ratio_and_what_the_target_needs():
    import numpy as np

    hub, ours = _paired_rounds(np.random.default_rng(0), 1.3)
    # 10 GFLOP an image against a 100 GFLOP/s peak: 1.5x keras-hub's fastest call
    # (32 / min(hub) img/s) needs 1.5 * 32 / min(hub) * 10 / 100 of the peak.
    row = targets.best_row("ViT-X", "mixed_bfloat16", 32, ours, hub, 10e9, 100e9, 1.5)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["ViT-X", "mixed_bfloat16", "32"]
    assert float(cells[3]) == pytest.approx(32 / ours.min(), abs=0.05)
    assert float(cells[4]) == pytest.approx(32 / hub.min(), abs=0.05)
    assert cells[5].startswith("1.3") and cells[6:8] == ["1.5x", "no"]
    assert cells[8] == f"{100 * 1.5 * 32 / hub.min() * 0.1:.0f}%"
    met = targets.best_row("ViT-X", "float32", 32, ours, hub, 10e9, 100e9, 1.2)
    assert met.split(" | ")[6:8] == ["1.2x", "yes"]
    unjudged = targets.best_row("ViT-X", "mixed_float16", 32, ours, hub, 10e9, 100e9)
    assert unjudged.endswith("| - | - | - |")
    assert len(row.split("|")) == len(targets.BEST_HEADER.splitlines()[0].split("|"))


def test_targets_parse_and_refuse_what_no_row_could_be_judged_by():
    assert targets.parse_targets(targets.ISSUE_TARGETS["inference"]) == {
        "float32": 1.2, "mixed_bfloat16": 1.5}
    assert targets.parse_targets(targets.ISSUE_TARGETS["train"]) == {
        "float32": 1.0, "mixed_bfloat16": 1.0}
    for bad in ("float32", "float32=", "float32=fast", "float32=0", "mixed_bf16=1.5", "auto=1.2", "=1.2"):
        with pytest.raises(ValueError, match="precision=ratio"):
            targets.parse_targets([bad])


def test_pooled_speedup_weighs_each_run_alike_and_spans_their_spread():
    import numpy as np

    rng = np.random.default_rng(0)
    runs = [_paired_rounds(rng, r, rounds) for r, rounds in ((1.1, 40), (1.2, 16), (1.4, 16))]
    estimate, low, high = measure.pooled_speedup(runs)
    # Not the median of all 72 rounds (1.1, the longest run's).
    assert estimate == pytest.approx((1.1 * 1.2 * 1.4) ** (1 / 3), abs=0.01)
    assert low < 1.15 and high > 1.3  # between-run spread, which no one run's interval shows
    for base, new in runs:
        _, run_low, run_high = measure.speedup(base, new)
        assert run_high - run_low < 0.05
    # One run: speedup's median, with an interval like speedup's.
    one = measure.pooled_speedup(runs[1:2])
    assert one[0] == measure.speedup(*runs[1])[0]
    assert one[1:] == pytest.approx(measure.speedup(*runs[1])[1:], abs=0.01)
    with pytest.raises(ValueError, match="at least one run"):
        measure.pooled_speedup([])
    with pytest.raises(ValueError, match="same number of rounds"):
        measure.pooled_speedup([runs[0], (runs[1][0], runs[1][1][:3])])
    with pytest.raises(ValueError, match="confidence"):
        measure.pooled_speedup(runs, confidence=0.0)


def test_pooled_row_judges_the_pooled_interval_and_shows_each_run():
    import numpy as np

    rng = np.random.default_rng(1)
    runs = [_paired_rounds(rng, r) for r in (1.14, 1.26, 1.22)]
    row = targets.pooled_row("ViT-X", "float32", 32, runs, 1.2)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["ViT-X", "float32", "32", "3"]
    assert [float(m) for m in cells[4].split(", ")] == pytest.approx([1.14, 1.26, 1.22], abs=0.01)
    assert cells[6:8] == ["1.2x", "at the edge"]
    assert cells[8] == "2 yes, 1 no"  # alone, two runs would have called it met
    assert targets.pooled_row("ViT-X", "float32", 32, runs, 1.05).split(" | ")[7] == "yes"
    assert targets.pooled_row("ViT-X", "float32", 32, runs).endswith("| - | - | - |")
    assert len(row.split("|")) == len(targets.POOLED_HEADER.splitlines()[0].split("|"))


def _record(machine="AMD EPYC, 2 CPUs, avx512_bf16", kinds=("ours", "keras-hub"), ratio=1.2, seed=0,
            code="3f9c0a1b2d4e"):
    import numpy as np

    rng = np.random.default_rng(seed)
    record = run_record.new_record("inference", 224, {"float32": 2e11})
    record.update(machine=machine, started="2026-12-04T02:40:11Z", code=code, commit="b664298-dirty")
    hub, ours = _paired_rounds(rng, ratio, 12)
    times = {("ours", False): ours, ("ours", True): ours * 1.1,  # ours best without XLA
             ("keras-hub", False): hub * 1.2, ("keras-hub", True): hub}  # keras-hub best with it
    run_record.add_row(record, "ViT-X", "float32", 32, 1e9, {k: v for k, v in times.items() if k[0] in kinds})
    return record


def test_run_record_round_trips_and_pairs_each_model_at_its_best_setting(tmp_path):
    path = str(tmp_path / "runs" / "1.json")
    run_record.save(_record(), path)
    run_record.save(_record(), path)  # over the last version, through a file beside it
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["1.json"]
    record = run_record.load(path)
    assert record == _record()
    assert set(record["rows"][0]["times"]["ours"]) == {"off", "on"}
    pairs = run_record.best_of_pairs([record, _record(seed=1)], [path, "b"])
    (((name, precision, batch), runs),) = pairs.items()
    assert (name, precision, batch) == ("ViT-X", "float32", 32) and len(runs) == 2
    assert measure.speedup(*runs[0])[0] == pytest.approx(1.2, abs=0.01)
    with pytest.raises(ValueError, match="keras_hub=false"):
        run_record.best_of_pairs([_record(kinds=("ours",))], ["solo.json"])
    xla_off = _record(seed=2)
    for kind in run_record.KINDS:
        del xla_off["rows"][0]["times"][kind]["on"]
    with pytest.raises(ValueError, match="pool runs of the same --jit"):
        run_record.best_of_pairs([record, xla_off], [path, "off.json"])


def test_run_record_refuses_what_it_did_not_write(tmp_path):
    for text, match in (("not json", "is not JSON"),
                        ('{"rows": []}', "is not a keras-vit-throughput/1 record"),
                        ("[1, 2]", "is not a keras-vit-throughput/1 record")):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match=match):
            run_record.load(str(tmp_path / "bad.json"))
    unpaired = _record()
    unpaired["rows"][0]["times"]["keras-hub"]["on"].pop()
    run_record.save(unpaired, str(tmp_path / "unpaired.json"))
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        run_record.load(str(tmp_path / "unpaired.json"))
    timeless = _record()
    del timeless["rows"][0]["times"]
    run_record.save(timeless, str(tmp_path / "timeless.json"))
    with pytest.raises(ValueError, match="a row has no times"):
        run_record.load(str(tmp_path / "timeless.json"))


def test_run_record_names_the_cores(tmp_path):
    import os

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                       "flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n")
    cpus = len(os.sched_getaffinity(0))
    assert run_record.machine(str(cpuinfo)) == (
        f"Intel(R) Xeon(R) Platinum 8480+, {cpus} CPUs, amx_bf16+avx512_bf16")
    assert run_record.machine(str(tmp_path / "none")) == f"unknown CPU, {cpus} CPUs, no bf16"


def test_run_record_names_the_code_it_timed(tmp_path):
    import os

    record = run_record.new_record("inference", 224, {})
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["started"])
    assert record["code"] == run_record.code_digest() and re.fullmatch(r"[0-9a-f]{12}", record["code"])
    package = tmp_path / "pkg"
    (package / "layers").mkdir(parents=True)
    (package / "vit.py").write_text("A = 1\n")
    (package / "layers" / "attention.py").write_text("B = 2\n")
    (package / "notes.txt").write_text("not code")
    before = run_record.code_digest(str(package))
    (package / "notes.txt").write_text("still not code")
    (package / "vit.pyc").write_bytes(b"compiled")
    assert run_record.code_digest(str(package)) == before
    (package / "layers" / "attention.py").write_text("B = 3\n")  # an uncommitted edit
    assert run_record.code_digest(str(package)) != before
    (package / "layers" / "attention.py").write_text("B = 2\n")
    os.rename(package / "layers" / "attention.py", package / "layers" / "mlp.py")  # the path counts too
    assert run_record.code_digest(str(package)) != before
    assert run_record.git_commit(str(tmp_path)) is None  # not a git checkout
    assert run_record.provenance(_record()) == (
        "started 2026-12-04 02:40 UTC, code 3f9c0a1b2d4e (b664298-dirty)")
    assert run_record.provenance({}) == "start not recorded, code not recorded"


def test_pool_runs_pools_records_and_refuses_runs_it_cannot_pool(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = []
    for i, ratio in enumerate((1.14, 1.26, 1.22)):
        paths.append(str(tmp_path / f"{i}.json"))
        run_record.save(_record(ratio=ratio, seed=i), paths[-1])
    run_record.save(_record(machine="Intel Xeon, 2 CPUs, amx_bf16"), str(tmp_path / "xeon.json"))
    run_record.save(run_record.new_record("inference", 224, {}), str(tmp_path / "stopped.json"))
    run_record.save(_record(code="0123456789ab"), str(tmp_path / "edited.json"))
    older = _record(seed=4)
    for key in ("started", "code", "commit"):  # as records written before these keys were
        del older[key]
    run_record.save(older, str(tmp_path / "older.json"))

    def pool(*args):
        return subprocess.run([sys.executable, "-m", "benchmarks.pool_runs", *args],
                              capture_output=True, text=True, timeout=600, cwd=root)

    result = pool(*paths)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "3 runs of inference at 224 px on AMD EPYC, 2 CPUs, avx512_bf16" in result.stdout
    provenance = "started 2026-12-04 02:40 UTC, code 3f9c0a1b2d4e (b664298-dirty)"
    assert f"run 1: {paths[0]} ({provenance})" in result.stdout
    mixed = pool(paths[0], str(tmp_path / "older.json"))  # a digest is checked where there is one
    assert mixed.returncode == 0, mixed.stderr[-2000:]
    assert "start not recorded, code not recorded" in mixed.stdout
    (row,) = [r for r in result.stdout.splitlines() if r.startswith("| ViT-X |")]
    assert row.split(" | ")[3] == "3" and row.split(" | ")[6:8] == ["1.2x", "at the edge"], row
    assert pool("--targets=float32=1.05", *paths).stdout.count("| 1.05x | yes |") == 1
    for args, message in (((), "pass the records to pool"),
                          ((paths[0], str(tmp_path / "missing.json")), "no such file"),
                          ((paths[0], str(tmp_path / "xeon.json")), "the runs differ in machine"),
                          ((str(tmp_path / "stopped.json"),), "holds no timed case"),
                          ((paths[0], paths[0]), "passed twice"),
                          ((paths[0], str(tmp_path / "edited.json")), "timed different keras_vit code"),
                          (("--targets=float32=fast", paths[0]), "precision=ratio")):
        refused = pool(*args)
        assert refused.returncode != 0 and message in refused.stderr, (args, refused.stderr[-2000:])


def test_interleaved_times_alternate_the_order_of_the_cases():
    calls = []
    times = measure.interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                      min_seconds=0.0, min_rounds=4, warmup=1)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [len(t) for t in times.values()] == [4, 4]
    assert measure.side_by_side({"a": lambda: None}, 0.0, 2) == {"a": pytest.approx(0.0, abs=0.01)}


def test_datasheet_peaks_match_the_most_specific_device_name():
    from benchmarks.train_mfu import datasheet_peak

    assert datasheet_peak("NVIDIA H200", "bfloat16") == pytest.approx(989.4e12)
    assert datasheet_peak("NVIDIA H200 NVL", "bfloat16") == pytest.approx(835.5e12)
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "float16") == pytest.approx(989.4e12)
    assert datasheet_peak("NVIDIA H100 PCIe", "bfloat16") == pytest.approx(756e12)
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "float32") == pytest.approx(156e12)  # TF32
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "float32", tf32=False) == pytest.approx(19.5e12)
    assert datasheet_peak("NVIDIA L40S", "bfloat16") == pytest.approx(362.1e12)  # not the L4's
    assert datasheet_peak("NVIDIA L4", "bfloat16") == pytest.approx(121e12)
    assert datasheet_peak("NVIDIA H100 NVL", "bfloat16") is None
    assert datasheet_peak("Tesla T4", "float16") is None
    with pytest.raises(ValueError, match="compute dtype 'int8'"):
        datasheet_peak("NVIDIA H200", "int8")


def test_train_mfu_times_the_steps_it_counts():
    """An epoch must run exactly the steps whose FLOPs are counted: Keras runs whole
    executions, so 3 steps at 2 per execution would run 4."""
    import numpy as np

    from benchmarks import train_mfu
    from keras_vit import flops
    from keras_vit.training import recipes

    config = keras_vit.get_config("ViT-Ti/16").replace(image_size=32, num_classes=3)
    assert train_mfu.step_flops(config, 4) == 24 * flops.forward_macs(config, executed=True)
    model = measure.fresh_models(lambda: {"ours": keras_vit.create_model(config)}, "float32")["ours"]
    recipes.compile_model(model, recipes.get_recipe("pretrain", batch_size=2), total_steps=20,
                          jit_compile=False, steps_per_execution=2)
    images, labels = np.zeros((2, 32, 32, 3), "float32"), np.zeros(2, "int32")
    lines = []
    seconds = train_mfu.epoch_seconds(model, images, labels, steps=4, epochs=2, log=lines.append)
    assert len(seconds) == 2 and min(seconds) > 0
    assert int(model.optimizer.iterations.numpy()) == 3 * 4  # the warm-up epoch and two timed ones
    assert "warm-up (not timed)" in lines[0] and lines[1].endswith("img/s")
    with pytest.raises(ValueError, match=r"multiple of steps_per_execution \(2\)"):
        train_mfu.epoch_seconds(model, images, labels, steps=3, epochs=1)


def test_train_mfu_reports_its_figures():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.train_mfu", "--model=ViT-Ti/16", "--image_size=32",
         "--batch_size=2", "--steps=2", "--epochs=1", "--steps_per_execution=1", "--jit=false",
         "--precision=float32", "--peak_tflops=1"],
        capture_output=True, text=True, timeout=600, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "ViT-Ti/16 at 32 px, batch 2, float32, XLA off" in out
    assert "img/s in the fastest epoch" in out and "of the float32 tf.matmul peak measured here" in out
    assert "MFU" in out and "of 1.0 TFLOP/s (--peak_tflops)" in out


def test_vit_throughput_reports_a_row_per_xla_setting(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.vit_throughput", "--keras_hub=false", "--models=ViT-Ti/16",
         "--image_size=32", "--batch_sizes=2", "--precisions=float32", "--jit=false,true",
         "--min_seconds=0", "--min_rounds=3", f"--times_out={tmp_path}/run.json"],
        capture_output=True, text=True, timeout=600, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Every timed call: {tmp_path}/run.json" in result.stdout
    saved = run_record.load(f"{tmp_path}/run.json")
    assert (saved["mode"], saved["image_size"]) == ("inference", 32)
    assert saved["code"] == run_record.code_digest()  # the keras_vit it timed
    assert set(saved["peak"]) == {"float32", "bfloat16"}
    ((row),) = saved["rows"]
    assert (row["model"], row["precision"], row["batch"]) == ("ViT-Ti/16", "float32", 2)
    assert {s: len(t) for s, t in row["times"]["ours"].items()} == {"off": 3, "on": 3}
    table = result.stdout.split("inference, 32 px; peak: ")[1]
    rows = [r for r in table.splitlines() if r.startswith("| ViT-Ti/16 | float32 | 2 |")]
    assert [r.split(" | ")[3] for r in rows] == ["off", "on"], table
    assert "best of jit on/off" not in result.stdout  # the comparison needs keras-hub
    refused = subprocess.run([sys.executable, "-m", "benchmarks.vit_throughput", "--targets=float32=fast"],
                             capture_output=True, text=True, timeout=600, cwd=root)
    assert refused.returncode != 0 and "precision=ratio" in refused.stderr, refused.stderr[-3000:]
    assert "Measuring" not in refused.stdout  # refused before any work
    unwritable = subprocess.run([sys.executable, "-m", "benchmarks.vit_throughput",
                                 f"--times_out={tmp_path}/run.json/below.json"],
                                capture_output=True, text=True, timeout=600, cwd=root)
    assert unwritable.returncode != 0 and "--times_out: cannot write" in unwritable.stderr
    assert "Measuring" not in unwritable.stdout
