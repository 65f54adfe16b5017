"""Recipes, gradient accumulation, precision, strategies, resumable runs and the CLI."""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import bf16_bounds
from conftest import TINY_OVERRIDES, make_image_folder, small_run, train_command, write_bad_images

import keras_vit
from keras_vit import ViTConfig, data, hardware
from keras_vit.flops import forward_macs
from keras_vit.precision import resolve_precision, top1_agreement, with_policy
from keras_vit.training import (ConfigError, TrainConfig, WarmupDecay, compile_model, get_recipe,
                                make_strategy, train)
from keras_vit.training.recipes import SparseSigmoidCrossEntropy, make_optimizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ViTConfig(name="tiny", patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2,
                 image_size=(8, 8), num_classes=3)


def test_warmup_then_linear_or_cosine_decay():
    lin = WarmupDecay(1.0, total_steps=110, warmup_steps=10, decay="linear")
    assert [float(lin(s)) for s in (0, 5, 10, 60, 110, 200)] == pytest.approx([0, 0.5, 1.0, 0.5, 0.0, 0.0])
    cos = WarmupDecay(1.0, total_steps=110, warmup_steps=10, decay="cosine", end_learning_rate=0.1)
    assert float(cos(60)) == pytest.approx(0.55) and float(cos(110)) == pytest.approx(0.1)
    again = WarmupDecay.from_config(cos.get_config())
    assert float(again(37)) == pytest.approx(float(cos(37)))
    with pytest.raises(ValueError, match="decay must be"):
        WarmupDecay(1.0, 10, decay="step")


def test_epochs_are_whole_passes_of_full_batches(fake_fmnist, tmp_path):
    cfg = TrainConfig(model="ViT-Ti/16", model_overrides=TINY_OVERRIDES, data_dir=fake_fmnist, image_size=28,
                      epochs=2, batch_size=40, precision="float32", output_dir=str(tmp_path / "run"),
                      verbose=0)
    assert train(cfg)["steps"] == 2 * (96 // 40)


def test_recipes_are_the_papers():
    pre, fine = get_recipe("pretrain"), get_recipe("finetune")
    assert (pre.optimizer, pre.beta_1, pre.beta_2, pre.weight_decay, pre.batch_size, pre.warmup_steps,
            pre.decay, pre.grad_clip_norm, pre.dropout_rate) == ("adam", 0.9, 0.999, 0.1, 4096, 10_000,
                                                                 "linear", 1.0, 0.1)
    assert (fine.optimizer, fine.momentum, fine.weight_decay, fine.batch_size, fine.warmup_steps,
            fine.decay, fine.grad_clip_norm) == ("sgd", 0.9, 0.0, 512, 500, "cosine", 1.0)
    assert get_recipe("pretrain", weight_decay=0.03).weight_decay == 0.03
    with pytest.raises(ValueError, match="recipe must be one of"):
        get_recipe("distill")


def test_weight_decay_touches_kernels_only():
    model = keras_vit.create_model(TINY)
    opt = make_optimizer(get_recipe("pretrain", warmup_steps=0, learning_rate=0.1), 10, model)
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    opt.apply_gradients([(tf.zeros_like(v), v) for v in model.trainable_variables])
    for v in model.trainable_variables:
        changed = not np.allclose(v.numpy(), before[v.path])
        nonzero = np.any(before[v.path] != 0)
        assert changed == (v.name.endswith("kernel") and nonzero), v.path


def test_gradient_accumulation_equals_one_big_batch():
    x = np.random.RandomState(0).uniform(-1, 1, (32, 8, 8, 3)).astype("float32")
    y = np.arange(32) % 3
    weights, initial = [], None
    for accum, batch in ((None, 16), (4, 4)):
        model = keras_vit.create_model(TINY)
        initial = initial or model.get_weights()
        model.set_weights(initial)
        recipe = get_recipe("finetune", warmup_steps=1, learning_rate=0.1, grad_clip_norm=0.05)
        compile_model(model, recipe, total_steps=2, gradient_accumulation_steps=accum)
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 2
        weights.append(model.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, atol=2e-6)
    assert not np.allclose(weights[0][-2], 0)  # the (zero-initialised) head did learn


def test_sigmoid_loss_is_summed_binary_cross_entropy():
    logits = np.random.RandomState(0).normal(size=(4, 3)).astype("float32")
    labels = np.array([0, 2, 1, 2])
    ours = float(SparseSigmoidCrossEntropy(3)(labels, logits))
    binary = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    ref = binary(np.eye(3)[labels][..., None], logits[..., None])
    assert ours == pytest.approx(float(np.mean(np.sum(ref, axis=-1))), rel=1e-5)


@pytest.mark.parametrize("flags, onednn_bf16, gpus, expected", [
    ({"avx2", "amx_bf16", "amx_tile"}, True, [], "mixed_bfloat16"),
    ({"avx512f", "avx512_bf16"}, True, [], "mixed_bfloat16"),
    ({"avx512f", "avx512_bf16"}, False, [], "float32"),  # TF_ENABLE_ONEDNN_OPTS=0: bf16 on Eigen
    ({"avx512f"}, True, [], "float32"),  # oneDNN emulates bf16 there
    ({"avx2", "fma"}, False, [], "float32"),
    (set(), False, [9], "mixed_bfloat16"),
    (set(), False, [7], "mixed_float16"),
])
def test_auto_precision_follows_the_hardware(flags, onednn_bf16, gpus, expected):
    assert resolve_precision("auto", flags=flags, gpus=gpus, onednn_bf16=onednn_bf16) == expected
    assert resolve_precision("float32", flags=flags, gpus=gpus, onednn_bf16=onednn_bf16) == "float32"


def test_strategies_by_name():
    assert make_strategy("one_device").num_replicas_in_sync == 1
    assert make_strategy("auto").num_replicas_in_sync == 1
    with pytest.raises(ValueError, match="strategy must be one of"):
        make_strategy("horovod")


def test_tpu_strategy_is_built_from_the_flags(monkeypatch):
    """No TPU here: the resolver, connection and initialisation are faked, and the test
    checks what they are given and in which order."""
    from keras_vit.training import distribute

    calls = []

    class Resolver:
        def __init__(self, **kwargs):
            calls.append(("resolver", kwargs))

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Resolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: calls.append(("connect", r)))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda r: calls.append(("init", r)))
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda r: ("TPUStrategy", r))
    kind, resolver = make_strategy("tpu", tpu="grpc://10.0.0.2:8470", tpu_zone="us-central2-b",
                                   tpu_project="p")
    assert kind == "TPUStrategy"
    assert calls == [("resolver", {"tpu": "grpc://10.0.0.2:8470", "zone": "us-central2-b", "project": "p"}),
                     ("connect", resolver), ("init", resolver)]
    calls.clear()
    make_strategy("tpu", tpu="local")  # a TPU VM: the resolver finds the local chips
    assert calls[0] == ("resolver", {"tpu": "", "zone": None, "project": None})

    # train() hands the config's TPU fields (the CLI's --tpu, --tpu_zone, --tpu_project) on.
    class Stop(Exception):
        pass

    def fake_make_strategy(name, **kwargs):
        raise Stop(name, kwargs)

    monkeypatch.setattr(distribute, "make_strategy", fake_make_strategy)
    with pytest.raises(Stop) as stop:
        train(TrainConfig(strategy="tpu", tpu="my-tpu", tpu_zone="z", tpu_project="p", precision="float32",
                          steps=1))
    assert stop.value.args == ("tpu", {"tpu": "my-tpu", "tpu_zone": "z", "tpu_project": "p"})


def test_train_end_to_end_learns_and_writes_its_outputs(fake_fmnist, tmp_path):
    cfg = TrainConfig(model="ViT-Ti/16", model_overrides=TINY_OVERRIDES, data_dir=fake_fmnist, image_size=28,
                      steps=30, batch_size=32, learning_rate=3e-3, warmup_steps=3, dropout_rate=0.0,
                      precision="float32", output_dir=str(tmp_path / "run"), deterministic=True, verbose=0,
                      crop_area_min=0.9, checkpoint_every=10, eval_every=0)
    summary = train(cfg)
    assert summary["steps"] == 30 and summary["eval_split"] == "test"
    assert summary["model"] == "ViT-Ti/16" and summary["model_overrides"] == TINY_OVERRIDES
    saved = keras.saving.load_model(summary["paths"]["model"])
    assert summary["params"] == saved.count_params()
    assert summary["model_config"] == saved.config.to_dict()
    assert summary["macs"] == forward_macs(saved.config) > 0
    assert summary["recipe"]["batch_size"] == summary["batch_size"]
    rows = [line.split(",") for line in open(summary["paths"]["history"]).read().splitlines()]
    val = rows[0].index("val_top1")
    assert [r[val] not in ("", "NA") for r in rows[1:]] == [False, False, True]  # validated once, at the end
    assert float(rows[-1][val]) == pytest.approx(summary["eval_top1"])
    assert summary["eval_top1"] > 0.5  # 10 classes; the fake bands are easy
    for key in ("model", "history", "metrics"):
        assert os.path.exists(summary["paths"][key])
    assert os.listdir(summary["paths"]["logs"])
    loaded = keras.saving.load_model(summary["paths"]["model"])
    assert loaded.config.num_classes == 10


def test_a_run_whose_loss_turns_nan_fails_and_saves_nothing(fake_fmnist, tmp_path):
    def build(num_classes, image_size):
        return keras.Sequential([keras.Input((image_size, image_size, 1)), keras.layers.Flatten(),
                                 keras.layers.Dense(num_classes), keras.layers.Lambda(lambda t: t * np.nan)])

    with pytest.raises(FloatingPointError, match=r"NaN or infinite in chunk 1 of 2; nothing was saved"):
        train(small_run(tmp_path / "run", data_dir=fake_fmnist), build_model=build)
    assert not (tmp_path / "run" / "model.keras").exists()


def test_a_config_that_cannot_work_is_refused_with_every_reason_before_any_work(tmp_path, monkeypatch):
    cfg = small_run(tmp_path / "run", steps=None, batch_size=0, learning_rate=-1.0, precision="fp8",
                    strategy="mirror", gradient_accumulation_steps=0, crop_area_min=0.0,
                    model_overrides={"hiden_size": 8}, weights=str(tmp_path / "missing.npz"))

    def touched(*args, **kwargs):
        raise AssertionError("the data was opened for a config that cannot work")

    monkeypatch.setattr(data, "open_source", touched)
    with pytest.raises(ConfigError) as refused:
        train(cfg)
    reasons = str(refused.value).splitlines()[1:]
    assert [r.strip().split(" ")[0] for r in reasons] == [
        "set", "precision", "strategy", "gradient_accumulation_steps", "crop_area_min", "recipe", "model",
        "weights"]
    assert "learning_rate must be >= 0, got -1.0; batch_size must be a whole number >= 1, got 0" in reasons[5]
    assert "unknown config field(s) ['hiden_size']" in reasons[6]
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"batch_size 8 is not divisible by gradient_accumulation_steps 3"):
        small_run(tmp_path / "run", gradient_accumulation_steps=3).validate()
    with pytest.raises(ConfigError, match=r"model 'ViT-Ti/16': image_size \(30, 30\) must be a multiple"):
        small_run(tmp_path / "run", image_size=30).validate()
    # A caller's own model builder replaces model and image_size; weights elsewhere are not looked for.
    small_run(tmp_path / "run", image_size=30, model_overrides={"x": 1}).validate(check_model=False)
    small_run(tmp_path / "run", weights="gs://bucket/ViT-B_16.npz").validate()
    small_run(tmp_path / "run", weights=str(tmp_path / "missing.npz")).validate(check_paths=False)


@pytest.mark.parametrize("changes, message", [
    (dict(learning_rate=-0.1), "learning_rate must be >= 0"),
    (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
    (dict(batch_size=0), "batch_size must be a whole number >= 1"),
    (dict(warmup_steps=-1), "warmup_steps must be >= 0"),
    (dict(decay="step"), "decay must be 'linear' or 'cosine'"),
    (dict(label_smoothing=1.0), r"label_smoothing must be in \[0, 1\)"),
    (dict(loss="hinge"), "loss must be 'softmax' or 'sigmoid'"),
    (dict(dropout_rate=-0.1), "dropout_rate must be in"),
    (dict(grad_clip_norm=0.0), "grad_clip_norm must be > 0 or None"),
])
def test_recipes_refuse_values_that_cannot_train(changes, message):
    with pytest.raises(ValueError, match=f"recipe 'finetune': {message}"):
        get_recipe("finetune", **changes)


def test_the_train_flags_are_made_from_train_config():
    """Every TrainConfig field but `verbose` is a flag with the field's default, and
    parsed flags give back the config they name, typed as the fields are."""
    from absl import flags

    from keras_vit.cli import config_from_flags, define_config_flags

    fv = flags.FlagValues()
    define_config_flags(TrainConfig, fv)
    names = {f.name for f in dataclasses.fields(TrainConfig)} - {"verbose", "gradient_accumulation_steps"}
    assert set(fv) == names | {"grad_accum"}
    fv(["prog"])
    defaults = dataclasses.replace(TrainConfig(), image_size=224)
    assert config_from_flags(TrainConfig, fv, image_size=224) == defaults
    assert fv["image_size"].value is None  # the CLI's own default: the model's resolution
    fv(["prog", "--model=FMNIST-ViT", "--model_overrides={\"patch_size\": 7}", "--grad_accum=4",
        "--fewshot_shots=2,3", "--precision=float32", "--decay=cosine", "--jit_compile", "--epochs=1.5",
        "--image_size=56"])
    cfg = config_from_flags(TrainConfig, fv, verbose=2)
    assert (cfg.model, cfg.model_overrides, cfg.gradient_accumulation_steps, cfg.fewshot_shots) == (
        "FMNIST-ViT", {"patch_size": 7}, 4, (2, 3))
    assert (cfg.precision, cfg.decay, cfg.jit_compile, cfg.epochs, cfg.image_size, cfg.verbose) == (
        "float32", "cosine", True, 1.5, 56, 2)
    for bad in ("--recipe=nope", "--fewshot_shots=0", "--model_overrides=[1]", "--steps=x"):
        with pytest.raises(flags.Error):
            fv(["prog", bad])


def test_the_cli_reports_a_bad_config_in_its_own_words(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(train_command(tmp_path / "run", 0, ["--learning_rate=-1"]), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert ("bad training config:\n  steps must be >= 1, got 0\n  recipe 'pretrain': learning_rate must be "
            ">= 0, got -1.0\nPass --helpshort") in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
    proc = subprocess.run(train_command(tmp_path / "run", 1, ["--model_overrides=[4]"]), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "flag --model_overrides=[4]: must be a JSON object of config fields" in proc.stderr


def test_the_cli_names_a_bad_record_without_a_traceback(tmp_path):
    root = make_image_folder(tmp_path / "images")
    bad = write_bad_images(tmp_path / "images" / "train" / "cat")
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(train_command(tmp_path / "run", 2, [f"--image_dir={root}", "--dataset="]), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # No end anchor: libjpeg's own warnings from decoder threads still running may follow the message.
    assert re.search(r"\nbad record: image_folder:\S+ train record train/cat/(" + "|".join(bad) + r") .*\n"
                     "--skip_bad_records drops and counts bad training records instead.\n", proc.stderr)
    assert "Traceback" not in proc.stderr


def test_another_run_is_not_resumed_from_a_checkpoint_it_did_not_write(fake_fmnist, tmp_path):
    cfg = small_run(tmp_path / "run", data_dir=fake_fmnist)
    first = train(cfg)
    assert json.loads((tmp_path / "run" / "backup" / "run.json").read_text())["steps"] == 4
    wider = {**TINY_OVERRIDES, "hidden_size": 32}
    for changes, differences in [
            (dict(steps=8), ["steps 4 -> 8"]),
            (dict(model_overrides=wider, checkpoint_every=1),
             ["micro_steps_per_chunk 2 -> 1", "model.hidden_size 16 -> 32"]),
            (dict(learning_rate=1e-2), ["recipe.learning_rate 0.001 -> 0.01"])]:
        with pytest.raises(ConfigError) as refused:
            train(dataclasses.replace(cfg, **changes))
        message = str(refused.value)
        assert message.startswith(f"{tmp_path / 'run'} holds the checkpoint of another run "
                                  "(after chunk 2 of 2)")
        assert message.split("\n")[1:-1] == [f"  {d}" for d in differences]
    # The same run started again finds nothing left to train and evaluates what it saved.
    again = train(cfg)
    assert again["eval_top1"] == first["eval_top1"]


def _keras_warnings(run, about):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [w for w in caught if about in str(w.message)]


def _out_of_data_warnings(run):
    return _keras_warnings(run, "ran out of data")


def test_skipping_bad_records_trains_on_the_rest_and_fails_when_none_is_left(tmp_path):
    from PIL import Image

    for split in ("train", "test"):
        for label in ("a", "b"):
            folder = tmp_path / "images" / split / label
            folder.mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (28, 28), (60 * i, 0, 0)).save(folder / f"{i}.jpg")
    bad = write_bad_images(tmp_path / "images" / "train" / "a")  # skipping is for training records only
    cfg = small_run(tmp_path / "run", dataset=None, image_dir=str(tmp_path / "images"))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"train record train/a/(" + "|".join(bad) + r")\b"):
        train(cfg)
    cfg = dataclasses.replace(cfg, output_dir=str(tmp_path / "run_skip"), skip_bad_records=True)
    summary = {}
    # Our data is shuffled as it is read; Keras 3.15 warns when fit is left to "shuffle" it.
    assert not _keras_warnings(lambda: summary.update(train(cfg)), "shuffle")
    # 4 steps of 8 read the split four times over; each bad file counts once.
    assert summary["steps"] == 4 and summary["skipped_records"] == len(bad) == 4
    assert [re.search(r"train/a/(\S+) ", m).group(1) for m in summary["bad_records"]] == sorted(bad)
    written = json.loads((tmp_path / "run_skip" / "metrics.json").read_text())
    assert written["skipped_records"] == 4 and written["bad_records"] == summary["bad_records"]
    for path in (tmp_path / "images" / "train").glob("*/*.jpg"):
        if path.name not in bad:
            path.unlink()
    cfg = dataclasses.replace(cfg, output_dir=str(tmp_path / "run_none_left"))

    def no_batch():
        with pytest.raises(RuntimeError, match=r"gave no training batch \(every record was skipped as bad\)"):
            train(cfg)

    # Keras's own words for it, "Your input ran out of data; interrupting training", are left out.
    assert not _out_of_data_warnings(no_batch)
    assert not (tmp_path / "run_none_left" / "model.keras").exists()


def test_a_run_without_a_split_to_use_fails_with_the_reason(tmp_path):
    from PIL import Image

    for label in ("a", "b"):
        (tmp_path / "images" / "train" / label).mkdir(parents=True)
        Image.new("RGB", (28, 28)).save(tmp_path / "images" / "train" / label / "0.jpg")
    with pytest.raises(ValueError, match=r"no test or validation split to evaluate on \(it has \['train'\]"):
        train(small_run(tmp_path / "run", dataset=None, image_dir=str(tmp_path / "images")))
    empty = str(tmp_path / "empty.tfrecord.gz")
    tf.io.TFRecordWriter(empty, options="GZIP").close()
    source = data.TFRecordSource("records", {"train": [empty], "test": [empty]}, ["a", "b"])
    with pytest.raises(ValueError, match="records train has no records to train on"):
        train(small_run(tmp_path / "run2"), source=source)


def test_a_killed_run_resumes_from_its_last_checkpoint(fake_fmnist, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = tmp_path / "run"
    extra = [f"--data_dir={fake_fmnist}"]
    proc = subprocess.Popen(train_command(out, 60, extra), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    meta = out / "backup" / "training_metadata.json"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if meta.exists() and json.loads(meta.read_text() or "{}").get("epoch", 0) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed:\n" + proc.stdout.read()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "metrics.json").exists()
    saved_chunk = json.loads(meta.read_text())["epoch"]
    assert 2 <= saved_chunk < 30
    # The run's time is the killed process's and the resumed one's: a day before the restart
    # makes it over a day.
    clock = out / "backup" / "train_seconds.json"
    assert json.loads(clock.read_text())["seconds"] > 0
    clock.write_text(json.dumps({"chunk": saved_chunk, "seconds": 86400.0}))
    rerun = subprocess.run(train_command(out, 60, extra), env=env, capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed = f"Resuming from {out / 'backup'}: chunk {saved_chunk} of 30 (step {saved_chunk * 2} of 60)"
    assert resumed in rerun.stdout
    changed = "".join(f", {k}={v}" for k, v in TINY_OVERRIDES.items())
    assert "\x1b[" not in rerun.stdout  # not a terminal: no progress bar's escape codes
    assert re.search(rf"Training ViT-Ti/16 \([\d,]+ params{re.escape(changed)}, float32\)", rerun.stdout)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 60 and metrics["machine"] == hardware.machine()
    assert 86400 < metrics["train_seconds"] < 86400 + 600
    history = (out / "history.csv").read_text().splitlines()
    epochs = [int(line.split(",")[0]) for line in history[1:] if line and line[0].isdigit()]
    assert epochs[-1] == 29 and saved_chunk in epochs
    for line in ("Model: ", "Logs (TensorBoard): ", "History: ", "Metrics: "):
        assert line + str(out) in rerun.stdout


WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import tensorflow as tf
    import keras_vit
    from keras_vit import ViTConfig
    from keras_vit.training import compile_model, get_recipe, make_strategy

    strategy = make_strategy("multi_worker")
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    with strategy.scope():
        model = keras_vit.create_model(ViTConfig(name="tiny", patch_size=4, hidden_size=16, mlp_dim=32,
                                                 num_heads=2, num_layers=2, image_size=(8, 8), num_classes=3))
        compile_model(model, get_recipe("pretrain", warmup_steps=1, batch_size=8, learning_rate=1e-2), 4)
    rng = np.random.RandomState(rank)  # each worker sees different data
    x = rng.uniform(-1, 1, (64, 8, 8, 3)).astype("float32")
    y = rng.randint(0, 3, 64)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    history = model.fit(ds.with_options(options), epochs=2, steps_per_epoch=2, verbose=0)
    np.savez(sys.argv[1], *model.get_weights(), loss=np.array(history.history["loss"]))
""")


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _run_two_workers(tmp_path, worker_source):
    script = tmp_path / "worker.py"
    script.write_text(worker_source)
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    procs = []
    for rank in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        env = {**os.environ, "PYTHONPATH": ROOT, "TF_CONFIG": json.dumps(tf_config),
               "CUDA_VISIBLE_DEVICES": ""}
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path / f"w{rank}.npz")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    return outputs


def test_multi_worker_mirrored_two_workers_end_with_identical_weights(tmp_path):
    _run_two_workers(tmp_path, WORKER)
    a, b = (np.load(tmp_path / f"w{r}.npz") for r in range(2))
    assert len(a.files) > 10
    for key in a.files:
        if key != "loss":
            np.testing.assert_allclose(a[key], b[key], atol=1e-6, err_msg=key)
    initial = keras_vit.create_model(TINY)
    assert not np.allclose(a["arr_0"], 0) and a["arr_0"].shape == initial.get_weights()[0].shape
    # Different data on each worker, one model: the reported (all-reduced) losses agree.
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)


@pytest.mark.xfail(strict=True, reason="Keras 3.12 to 3.15's model.fit fails under "
                   "MultiWorkerMirroredStrategy (keras-team/keras#20585). If this passes, upstream "
                   "is fixed: remove keras_vit.training.distribute.patch_keras_multi_worker.")
def test_upstream_keras_still_needs_the_multi_worker_fix(tmp_path):
    unpatched = WORKER.replace('strategy = make_strategy("multi_worker")',
                               'import keras_vit.training.distribute as d\n'
                               'd._patched = True  # skip the fix\n'
                               'strategy = make_strategy("multi_worker")')
    _run_two_workers(tmp_path, unpatched)


@pytest.mark.parametrize("version", ["3.11.3", "3.16.0", "4.0.0"])
def test_the_multi_worker_fix_leaves_keras_versions_it_was_not_checked_on_alone(version, monkeypatch, caplog):
    import keras
    from keras.src.backend.tensorflow import trainer

    import keras_vit.training.distribute as d

    monkeypatch.setattr(d, "_patched", False)
    monkeypatch.setattr(keras, "__version__", version)
    before = (trainer.reduce_per_replica, trainer.TensorFlowTrainer._maybe_symbolic_build)
    assert d.patch_keras_multi_worker() is False
    assert (trainer.reduce_per_replica, trainer.TensorFlowTrainer._maybe_symbolic_build) == before
    assert f"keras {version} is not one of 3.12 to 3.15" in caplog.text


def _digits(image_size=16):
    """scikit-learn's bundled 8x8 digits, upsampled and scaled to [-1, 1]: `[N, s, s, 1]`, `[N]`."""
    from sklearn.datasets import load_digits

    d = load_digits()
    scale = image_size // 8
    x = np.kron(d.images, np.ones((scale, scale)))[..., None] / 8.0 - 1.0
    return x.astype("float32"), d.target.astype("int32")


def test_bfloat16_twin_of_a_trained_model_agrees_on_top1(monkeypatch):
    x, y = _digits()
    model = keras_vit.create_model(ViTConfig(name="digits", patch_size=4, hidden_size=32, mlp_dim=64,
                                             num_heads=2, num_layers=2, image_size=16, num_channels=1,
                                             num_classes=10))
    compile_model(model, get_recipe("pretrain", learning_rate=1e-2, warmup_steps=20, weight_decay=0.0,
                                    dropout_rate=0.0), total_steps=10 * 22)
    model.fit(x[:1400], y[:1400], batch_size=64, epochs=10, verbose=0)
    twin = with_policy(model, "mixed_bfloat16")
    assert twin.blocks[0].compute_dtype == "bfloat16" and twin.head.compute_dtype == "float32"
    agreement, f32, bf16 = top1_agreement(model, twin, x[1400:])
    assert (f32.argmax(-1) == y[1400:]).mean() > 0.75  # a trained model, not near-tied logits
    assert not np.array_equal(f32, bf16)  # bf16 ran
    assert agreement >= 0.99, f"bf16 agrees with float32 on {agreement:.2%} of top-1"
    same, a, b = top1_agreement(model, with_policy(model, "float32"), x[1400:])
    assert same == 1.0 and np.array_equal(a, b)
    from keras_vit import hardware

    monkeypatch.setattr(hardware, "onednn_runs", lambda dtype="float32": False)  # the plain forms
    _, _, plain = top1_agreement(model, with_policy(model, "mixed_bfloat16"), x[1400:])
    bf16_bounds.assert_as_accurate(bf16, plain, f32, "the bf16 twin's logits")


@pytest.mark.parametrize("policy, jit", [("mixed_float16", False), ("mixed_bfloat16", False),
                                         ("mixed_bfloat16", True)])
def test_mixed_precision_and_xla_train(policy, jit):
    keras.mixed_precision.set_global_policy(policy)
    model = keras_vit.create_model(TINY)
    compile_model(model, get_recipe("finetune", warmup_steps=0, learning_rate=0.05), 4, jit_compile=jit)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.blocks[0].compute_dtype == policy.split("_")[1]
    assert model.blocks[0].attention.qkv_kernel.dtype == "float32"  # master weights stay float32
    x = np.random.RandomState(0).uniform(-1, 1, (16, 8, 8, 3)).astype("float32")
    y = np.arange(16) % 3
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert model(x).dtype == "float32"
    assert not np.allclose(model.head.kernel.numpy(), 0)


def test_fewshot_runs_after_the_first_chunk_of_each_fit_every_nth_and_the_last():
    from keras_vit.training import FewShotCallback

    class Plan:
        def __init__(self):
            self.ran = []

        def run(self, model, batch_size, l2_reg, log, progress):
            self.ran.append(len(self.ran))
            return {"fewshot": {1: {"mean": 0.5, "std": 0.0}, 5: {"mean": 0.75, "std": 0.1}}}

    plan = Plan()
    callback = FewShotCallback(plan, every=4)
    callback.set_params({"epochs": 10})
    evaluated = []
    for start in (0, 5):  # a run killed after epoch 5, then resumed there
        callback.on_train_begin()
        for epoch in range(start, 10 if start else 5):
            logs = {"loss": 1.0}
            callback.on_epoch_end(epoch, logs)
            if "fewshot_1shot" in logs:
                evaluated.append(epoch + 1)
                assert logs["fewshot_5shot"] == 0.75
    assert evaluated == [1, 4, 6, 8, 10]
    with pytest.raises(ValueError, match="every must be >= 1"):
        FewShotCallback(plan, every=0)


def test_a_run_logs_fewshot_scores_and_refuses_shots_its_data_cannot_give(fake_fmnist, tmp_path):
    cfg = small_run(tmp_path / "run", data_dir=fake_fmnist, steps=4, checkpoint_every=1, fewshot_every=3,
                    fewshot_shots=(1, 2), fewshot_test_examples=20)
    summary = train(cfg)
    assert sorted(summary["fewshot"]) == [1, 2] and 0 <= summary["fewshot"][2]["mean"] <= 1
    with open(summary["paths"]["history"]) as f:
        rows = [line.strip().split(",") for line in f]
    column = rows[0].index("fewshot_1shot")
    assert [row[column] != "NA" for row in rows[1:]] == [True, False, True, True]  # first, 3rd, last
    with open(summary["paths"]["metrics"]) as f:
        assert json.load(f)["fewshot"]["2"]["mean"] == summary["fewshot"][2]["mean"]
    too_many = dataclasses.replace(cfg, output_dir=str(tmp_path / "run2"), fewshot_shots=(20,))
    with pytest.raises(ConfigError, match=r"fewshot_shots \(20,\): class 0 has 10 examples, fewer than 20"):
        train(too_many)
    assert not (tmp_path / "run2" / "model.keras").exists()
    with pytest.raises(ConfigError, match="fewshot_every must be >= 0"):
        dataclasses.replace(cfg, fewshot_every=-1).validate()


def test_a_run_started_afresh_starts_its_clock_at_zero(tmp_path):
    from keras_vit.training.clock import TrainingClock

    (tmp_path / "train_seconds.json").write_text(json.dumps({"chunk": 3, "seconds": 500.0}))
    fresh, resumed = TrainingClock(str(tmp_path), resumed=False), TrainingClock(str(tmp_path), resumed=True)
    assert fresh.seconds == 0 and resumed.seconds == 500
    fresh.on_train_begin()
    fresh.on_epoch_end(0)
    saved = json.loads((tmp_path / "train_seconds.json").read_text())
    assert saved["chunk"] == 1 and 0 <= saved["seconds"] < 60
