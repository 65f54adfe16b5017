"""The benchmarks' shared set-up: each case must run under the precision it reports."""

import keras
import pytest

import keras_vit
from benchmarks import measure
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


def _paired_rounds(rng, ratio, rounds=40):
    drift = rng.uniform(1.0, 1.5, rounds)  # the machine's load, shared by a round's two calls
    return drift * (1 + rng.normal(0, 0.01, rounds)), drift / ratio * (1 + rng.normal(0, 0.01, rounds))


def test_best_row_gives_the_paired_ratio_and_the_share_of_the_peak():
    import numpy as np

    hub, ours = _paired_rounds(np.random.default_rng(0), 1.3)
    row = measure.best_row("ViT-X", "mixed_bfloat16", 32, ours, hub, 10e9, 100e9)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["ViT-X", "mixed_bfloat16", "32"]
    assert float(cells[3]) == pytest.approx(32 / ours.min(), abs=0.05)
    assert float(cells[4]) == pytest.approx(32 / hub.min(), abs=0.05)
    assert cells[5].startswith("1.3")
    assert cells[6] == f"{100 * 32 / ours.min() * 0.1:.0f}%"  # 10 GFLOP an image, 100 GFLOP/s peak
    assert len(row.split("|")) == len(measure.BEST_HEADER.splitlines()[0].split("|"))


def test_interleaved_times_alternate_the_order_of_the_cases():
    calls = []
    times = measure.interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                      min_seconds=0.0, min_rounds=4, warmup=1)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [len(t) for t in times.values()] == [4, 4]
    assert measure.best_seconds(lambda: None, 0.0, 2) == pytest.approx(0.0, abs=0.01)


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

    config = keras_vit.model_config("ViT-Ti/16").replace(image_size=32, num_classes=3)
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
         "--min_seconds=0", "--min_rounds=3"],
        capture_output=True, text=True, timeout=600, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout.split("inference, 32 px; peak: ")[1]
    rows = [r for r in table.splitlines() if r.startswith("| ViT-Ti/16 | float32 | 2 |")]
    assert [r.split(" | ")[3] for r in rows] == ["off", "on"], table
    assert "best of jit on/off" not in result.stdout  # the comparison needs keras-hub


def test_revisions_times_two_checkouts_side_by_side():
    """Against HEAD's worktree: a row per mode with both sides' images/s and the ratio,
    and the worktree removed afterwards."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    before = subprocess.run(["git", "-C", root, "worktree", "list"], capture_output=True, text=True).stdout
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.revisions", "--baseline=HEAD", "--models=FMNIST-ViT",
         "--modes=inference,train", "--precisions=float32", "--batch_sizes=2", "--rounds=3", "--calls=1"],
        capture_output=True, text=True, timeout=600, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [r for r in result.stdout.splitlines() if r.startswith("| FMNIST-ViT |")]
    assert [r.split(" | ")[1] for r in rows[-2:]] == ["inference", "train"], result.stdout
    for row in rows:
        base, this, ratio = row.strip("| ").split(" | ")[-3:]
        assert float(base) > 0 and float(this) > 0 and ratio.endswith(")") and "x (" in ratio, row
    after = subprocess.run(["git", "-C", root, "worktree", "list"], capture_output=True, text=True).stdout
    assert after == before
