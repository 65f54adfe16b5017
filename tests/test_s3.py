"""s3:// end to end against an S3 server on 127.0.0.1 (moto, in server mode).

Everything that touches s3:// through TensorFlow runs in a child process, as users run
the CLIs: TensorFlow I/O's S3 client aborts the interpreter that used it at exit,
which the CLIs avoid (`keras_vit.cli.run_app`). The test process itself talks to the
server with boto3 alone.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import data_path, free_port, start_server, stop_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """(environment for child processes, boto3 client) of a fresh S3 server."""
    import boto3

    port = free_port()
    server = start_server(["-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port,
                          tmp_path_factory.mktemp("moto") / "moto.log")
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}  # nothing probes a metadata address
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    yield env, client
    stop_server(server)


def _run(env, *args, timeout=600):
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _keys(client, bucket, prefix=""):
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


LOAD_AND_PREDICT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import tensorflow as tf
    import tensorflow_io  # s3://
    served = tf.saved_model.load(sys.argv[1]).signatures["predict_images"]
    x = np.random.RandomState(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    print(json.dumps(served(images=tf.constant(x))["probabilities"].numpy().tolist()), flush=True)
    os._exit(0)  # TensorFlow I/O's S3 client would abort a normal exit
""")


def test_a_checkpoint_in_a_bucket_is_exported_to_a_bucket_and_served_from_it(s3, tmp_path):
    import keras_vit

    env, client = s3
    for bucket in ("checkpoints", "models"):
        client.create_bucket(Bucket=bucket)
    client.upload_file(data_path("vit_tiny_token_rep.npz"), "checkpoints", "vit_tiny_token_rep.npz")
    names = [f"c{i}" for i in range(10)]
    proc = _run(env, "-m", "keras_vit.export", "--model=s3://checkpoints/vit_tiny_token_rep.npz",
                "--output_dir=s3://models/tiny", f"--class_names={','.join(names)}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert ("Wrote SavedModel to s3://models/tiny/1 and s3://models/models.config, "
            "s3://models/batching_parameters.txt") in proc.stdout
    keys = _keys(client, "models")
    assert {"tiny/1/saved_model.pb", "models.config", "batching_parameters.txt"} <= set(keys)
    assert not [k for k in keys if "staging" in k or ".partial" in k], keys
    config = client.get_object(Bucket="models", Key="models.config")["Body"].read().decode()
    assert 'base_path: "s3://models/tiny"' in config

    script = tmp_path / "serve.py"
    script.write_text(LOAD_AND_PREDICT)
    from keras_vit.storage import s3_environment

    # TensorFlow alone (as in TF Serving) reads TensorFlow I/O's own S3 variables.
    plain = {**{k: v for k, v in env.items() if k != "PYTHONPATH"}, **s3_environment(env)}
    fresh = _run(plain, str(script), "s3://models/tiny/1")
    assert fresh.returncode == 0, fresh.stderr[-4000:]
    x = np.random.RandomState(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    model = keras_vit.create_model(None, weights=data_path("vit_tiny_token_rep.npz"))
    expected = np.exp(model.predict(x, verbose=0))
    np.testing.assert_allclose(json.loads(fresh.stdout), expected / expected.sum(-1, keepdims=True),
                               atol=1e-5)


def test_training_in_a_bucket_killed_and_resumed(s3, fake_fmnist):
    from conftest import train_command

    env, client = s3
    client.create_bucket(Bucket="runs")
    out = "s3://runs/vit"
    extra = [f"--data_dir={fake_fmnist}"]
    proc = subprocess.Popen(train_command(out, 20, extra), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    saved = 0
    while time.time() < deadline and proc.poll() is None and saved < 2:
        try:
            body = client.get_object(Bucket="runs", Key="vit/backup/training_metadata.json")["Body"].read()
            saved = json.loads(body or b"{}").get("epoch", 0)
        except client.exceptions.NoSuchKey:
            pass
        time.sleep(0.2)
    assert proc.poll() is None, "the run finished before it could be killed:\n" + proc.stdout.read()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "vit/metrics.json" not in _keys(client, "runs")
    meta = client.get_object(Bucket="runs", Key="vit/backup/training_metadata.json")["Body"].read()
    saved = json.loads(meta)
    rerun = subprocess.run(train_command(out, 20, extra), env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resuming from {out}/backup: chunk {saved['epoch']} of 10" in rerun.stdout
    keys = _keys(client, "runs", "vit/")
    for key in ("vit/model.keras", "vit/metrics.json", "vit/history.csv"):
        assert key in keys, keys
    assert json.loads(client.get_object(Bucket="runs", Key="vit/metrics.json")["Body"].read())["steps"] == 20


@pytest.mark.parametrize("case", ["missing bucket", "no credentials", "unreachable endpoint"])
def test_a_bucket_that_cannot_be_used_is_named_before_any_work(s3, tmp_path, case):
    env, _ = s3
    target = "s3://no-such-bucket/tiny" if case == "missing bucket" else "s3://models/tiny"
    if case == "no credentials":
        env = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    if case == "unreachable endpoint":
        env = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    started = time.time()
    proc = _run(env, "-m", "keras_vit.export", f"--model={data_path('vit_tiny_token_rep.npz')}",
                f"--output_dir={target}", timeout=120)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    endpoint = env["AWS_ENDPOINT_URL"]
    expected = {"missing bucket": f"{target}: bucket no-such-bucket at {endpoint}: no such bucket",
                "no credentials": f"{target}: no AWS credentials",
                "unreachable endpoint": f"{target}: cannot reach the S3 endpoint at {endpoint}"}
    assert last.startswith(expected[case]), last
    assert time.time() - started < 90


SERVE_BYTES = textwrap.dedent("""
    import json, os, sys
    import tensorflow as tf
    import tensorflow_io  # s3://
    served = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
    with open(sys.argv[2], "rb") as f:
        out = served(image_bytes=tf.constant([f.read()]))
    print(json.dumps({"sum": float(tf.reduce_sum(out["probabilities"])),
                      "class": out["class_names"].numpy()[0].decode()}), flush=True)
    os._exit(0)
""")


def _upload_image_folder(client, tmp_path, bucket, prefix, **sizes):
    from planting import write_image_folder

    from keras_vit import fashion_mnist

    if not os.path.exists(os.path.join(fashion_mnist.DEFAULT_DIR, "t10k-images-idx3-ubyte.gz")):
        pytest.skip("dataset-fashion-mnist not installed (make test installs it)")
    client.create_bucket(Bucket=bucket)
    images = tmp_path / "images"
    write_image_folder(str(images), *fashion_mnist.load_arrays("train"), *fashion_mnist.load_arrays("test"),
                       fashion_mnist.CLASS_NAMES, **sizes)
    for path in images.rglob("*.png"):
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(images)}")
    return images


@pytest.mark.slow
def test_the_pipeline_reads_trains_and_pushes_in_buckets_with_its_beam_work_in_a_worker_pool(
        s3, beam_services, tmp_path):
    """As on a cluster: a job service and an EXTERNAL worker pool, each its own process,
    whose workers have the AWS variables and nothing else S3-specific; ImageExampleGen,
    StatisticsGen, Dedup and the Evaluator (which loads the trained model from the bucket)
    run in the pool's workers. A second run finds the model already served; the served
    model loads from the bucket in a process that never imports keras_vit."""
    from keras_vit import fashion_mnist

    env, client = s3
    images = _upload_image_folder(client, tmp_path, "data", "images", num_train=200, num_eval=30, num_test=60)
    for bucket in ("pipeline", "serving"):
        client.create_bucket(Bucket=bucket)
    workers = {k: v for k, v in env.items() if not k.startswith("S3_")}
    venv_path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    flags = ["-m", "pipeline.run", "--image_dir=s3://data/images", "--pipeline_root=s3://pipeline/root",
             "--serving_dir=s3://serving/models", f"--metadata_path={tmp_path / 'metadata.sqlite'}",
             "--train_steps=10", "--batch_size=32", "--warmup_steps=2", "--accuracy_threshold=0",
             *beam_services(venv_path, workers)]
    runs, jobs_done = [], []
    for _ in range(2):
        proc = _run(env, *flags, timeout=900)
        assert proc.returncode == 0, proc.stderr[-6000:]
        assert "is not found" not in proc.stderr  # TFX's warnings of empty scratch directories
        runs.append(proc)
        jobs_done.append((tmp_path / "jobs.log").read_text().count("with state DONE"))
    first, second = (json.loads(proc.stdout.strip().splitlines()[-1]) for proc in runs)
    assert first["pushed"] and first["serving_model_path"] == "s3://serving/models/vit/1", first
    assert set(first["executions"].values()) == {"COMPLETE"} and first["dedup"]["test"] > 0
    assert not second["pushed"] and second["reason"] == "this model is already served as version 1"
    # The first run alone: the worker check, ImageExampleGen, StatisticsGen, Dedup and the Evaluator.
    assert jobs_done[0] >= 5, (tmp_path / "jobs.log").read_text()[-3000:]
    assert "Starting worker with command ['" + os.path.join(ROOT, "tests", "beam_boot.py") in \
        (tmp_path / "pool.log").read_text()
    keys = _keys(client, "serving")
    assert "models/vit/1/saved_model.pb" in keys and "models/models.config" in keys
    assert not [k for k in keys if "staging" in k], keys
    assert _keys(client, "pipeline", "root/ImageExampleGen/")
    assert not os.path.exists(os.path.join(ROOT, "s3:"))

    from keras_vit.storage import s3_environment

    script = tmp_path / "serve.py"
    script.write_text(SERVE_BYTES)
    photo = next(images.rglob("test/*/*.png"))
    plain = {**{k: v for k, v in env.items() if k != "PYTHONPATH"}, **s3_environment(env)}
    fresh = _run(plain, str(script), "s3://serving/models/vit/1", str(photo))
    assert fresh.returncode == 0, fresh.stderr[-4000:]
    served = json.loads(fresh.stdout)
    folder_names = [n.replace("/", "-") for n in fashion_mnist.CLASS_NAMES]
    assert abs(served["sum"] - 1) < 1e-4 and served["class"] in folder_names


@pytest.mark.slow
def test_tfrecords_in_a_bucket_are_read_and_validated_before_training(s3, tmp_path):
    import tensorflow as tf
    from planting import example_record, png

    env, client = s3
    client.create_bucket(Bucket="records")
    rng = np.random.RandomState(0)
    records = [example_record(png(rng.randint(0, 256, (28, 28), dtype=np.uint8)), i % 2) for i in range(40)]
    bad = records[:20] + [example_record(None, 1)] + records[20:]
    for name, rows in (("train", bad), ("eval", records[:10])):
        with tf.io.TFRecordWriter(str(tmp_path / f"{name}.tfrecord")) as w:
            for r in rows:
                w.write(r)
        client.upload_file(str(tmp_path / f"{name}.tfrecord"), "records", f"data/{name}-00000.tfrecord")
    tfrecords = "train=s3://records/data/train-*,eval=s3://records/data/eval-*"
    proc = _run(env, "-m", "pipeline.run", f"--tfrecords={tfrecords}",
                "--class_names=even,odd", "--pipeline_root=s3://records/root",
                f"--metadata_path={tmp_path / 'metadata.sqlite'}", f"--serving_dir={tmp_path / 'serving'}",
                "--train_steps=2", timeout=600)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "data validation found anomalies; the run stops before training" in proc.stderr
    assert "train: feature 'image'" in proc.stderr  # the record without one was read from the bucket
    assert _keys(client, "records", "root/ImageExampleGen/")
