"""Shared test setup: quiet TensorFlow, fixed seeds, the bundled test vectors."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")
    # free_memory=True runs gc.collect(), about 0.5 s with TensorFlow loaded: minutes over
    # the suite. Python's own collector still frees the models' cycles.
    keras.backend.clear_session(free_memory=False)


# The files that take longest, longest first: with the workers of setup.cfg's
# `--dist loadfile`, each file runs whole on one worker, so a long file that starts last
# (test_s3.py's bucket pipelines, ~10 minutes on 2 cores) leaves the other workers idle.
SLOW_FIRST = ("test_pipeline.py", "test_s3.py", "test_training.py", "test_experiments.py",
              "test_export.py", "test_docs.py", "test_visualize.py")


# The model package's tests: they need none of the pipeline extra (TFX, Beam), so they run
# on both stacks `make test` covers, the pinned one (requirements/lock.txt) and today's
# (requirements/current-lock.txt). The other files test the pipeline, the S3 filesystem
# (tensorflow-io, which has no build past TensorFlow 2.16), the repository and the docs.
MODEL_PACKAGE_TESTS = ("test_batching.py", "test_checkpoints.py", "test_configs.py", "test_data.py",
                       "test_evaluation.py", "test_export.py", "test_extras.py", "test_flops.py",
                       "test_hardware.py", "test_layers.py", "test_model.py", "test_preprocessing.py",
                       "test_pretrained.py", "test_training.py", "test_visualize.py", "test_zoo.py")


def _has_pipeline_extra():
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("tfx", "apache_beam"))


def pytest_ignore_collect(collection_path, config):
    """Where the pipeline extra is not installed, only the model package's tests run."""
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return not _has_pipeline_extra() and collection_path.name not in MODEL_PACKAGE_TESTS
    return None


def pytest_report_header(config):
    import keras
    import tensorflow as tf

    stack = f"TensorFlow {tf.__version__}, Keras {keras.__version__}, Python {sys.version.split()[0]}"
    if _has_pipeline_extra():
        return f"keras-vit: {stack}, with the pipeline extra: every test"
    return (f"keras-vit: {stack}, without the pipeline extra (TFX, Beam): the model package's "
            f"{len(MODEL_PACKAGE_TESTS)} test files only")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: files stay whole


def skip_unless_onednn(dtype="float32"):
    """For a test of what TF's oneDNN graph rewrites do: skips it, saying why, where TF
    hands no `dtype` ops to oneDNN (AVX2-only cores, TF_ENABLE_ONEDNN_OPTS=0, a GPU).
    `keras_vit.hardware` decides, as it does for the model's own graph forms."""
    from keras_vit import hardware

    if not hardware.onednn_runs(dtype):
        pytest.skip(f"TF hands no {dtype} ops to oneDNN here ({hardware.describe()} cores, "
                    f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')})")


def skip_unless_bf16_instructions():
    """For a test of what XLA's CPU backend does with bf16 products: it hands them to
    oneDNN only on cores with AMX-BF16 or AVX512-BF16, and elsewhere computes them in
    float32 (TF's oneDNN switch does not enter into it)."""
    from keras_vit import hardware

    if not hardware.bf16_instructions():
        pytest.skip(f"{hardware.describe()} cores have no AMX-BF16 or AVX512-BF16")


def skip_unless_xla_runs_bf16_products():
    """For a test of how XLA's CPU backend compiles our bf16 products: skips it where XLA
    does not hand a plain bf16 batch matmul to oneDNN. TF 2.16's XLA does on cores with
    bf16 instructions; TF 2.21's computes every bf16 dot on the CPU in float32, whatever
    its form."""
    import tensorflow as tf

    skip_unless_bf16_instructions()
    a, b = tf.zeros((2, 2, 50, 64), tf.bfloat16), tf.zeros((2, 2, 64, 50), tf.bfloat16)
    product = tf.function(lambda a, b: a @ b, jit_compile=True)
    hlo = product.experimental_get_compiler_ir(a, b)(stage="optimized_hlo")
    if "onednn$matmul" not in hlo:
        pytest.skip(f"XLA in TensorFlow {tf.__version__} hands no bf16 product to oneDNN here: it computes "
                    "them as float32 dots")


def data_path(*parts):
    return os.path.join(DATA, *parts)


# A ViT small enough for every test: 16 patches of 8 px on 32 px images.
TINY = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, patch_size=8, image_size=32,
            num_classes=5)


def tiny(**changes):
    import keras_vit
    from keras_vit import ViTConfig

    return keras_vit.create_model(ViTConfig(name="tiny", **{**TINY, **changes}))


def randomise(model, seed=0):
    """Random weights everywhere (LayerNorm scales around 1), so no output is trivially zero."""
    rng = np.random.RandomState(seed)
    for w in model.weights:
        w.assign(rng.normal(0, 0.05, w.shape).astype("float32") + (1.0 if "gamma" in w.path else 0.0))
    return model


def load_io(name):
    with np.load(data_path(name)) as d:
        return {k: d[k] for k in d.files}


def write_idx(path, array):
    """Writes a uint8 array as a gzipped IDX file (the Fashion-MNIST format)."""
    import gzip

    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def make_fake_fashion_mnist(directory, train=96, test=48, seed=0):
    """Small learnable IDX files: each class is a bright band at its own rows."""
    import os

    os.makedirs(directory, exist_ok=True)
    rng = np.random.RandomState(seed)
    for split, n, prefix in (("train", train, "train"), ("test", test, "t10k")):
        labels = np.arange(n) % 10
        images = rng.randint(0, 60, (n, 28, 28))
        for i, c in enumerate(labels):
            images[i, 2 * c:2 * c + 6] += 180
        write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), images)
        write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), labels)
    return str(directory)


@pytest.fixture
def fake_fmnist(tmp_path, monkeypatch):
    """Points fashion_mnist_local at small fake IDX files; returns a fresh TFDS data_dir."""
    monkeypatch.setenv("KERAS_VIT_FASHION_MNIST_DIR", make_fake_fashion_mnist(tmp_path / "idx"))
    return str(tmp_path / "tfds")


TINY_OVERRIDES = {"patch_size": 7, "hidden_size": 16, "mlp_dim": 32, "num_heads": 2, "num_layers": 1}


def small_run(output_dir, **changes):
    """A TrainConfig of a few steps of a one-layer ViT on 28-pixel images."""
    from keras_vit.training import TrainConfig

    fields = dict(model="ViT-Ti/16", model_overrides=TINY_OVERRIDES, image_size=28, steps=4, batch_size=8,
                  warmup_steps=1, precision="float32", output_dir=str(output_dir), verbose=0,
                  checkpoint_every=2)
    fields.update(changes)
    return TrainConfig(**fields)


def train_command(output_dir, steps, extra=()):
    """`python -m keras_vit.train` of `small_run`'s model, as a command line."""
    return [sys.executable, "-m", "keras_vit.train", "--model=ViT-Ti/16",
            "--model_overrides=" + json.dumps(TINY_OVERRIDES), "--image_size=28", f"--steps={steps}",
            "--batch_size=16", "--checkpoint_every=2", "--precision=float32", "--warmup_steps=2",
            f"--output_dir={output_dir}", *extra]


def make_image_folder(root, corrupt=False):
    """A train/test, cat/dog folder of JPEGs under `root` (a pathlib.Path); returns it as a str."""
    from PIL import Image

    rng = np.random.RandomState(0)
    for split, n in (("train", 6), ("test", 3)):
        for label in ("cat", "dog"):
            d = root / split / label
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.randint(0, 255, (20 + i, 24, 3), dtype=np.uint8)).save(d / f"{i}.jpg")
    if corrupt:
        (root / "train" / "dog" / "broken.jpg").write_bytes(b"this is not a jpeg")
    return str(root)


def write_bad_images(folder) -> dict:
    """One file of each kind of bad image into `folder` (a pathlib.Path): no image magic,
    a corrupt body behind a valid header, a truncated file, and a header declaring more
    pixels than the default bound. Returns {file name: what the error must say}."""
    import io
    import struct

    from PIL import Image

    y, x = np.mgrid[0:96, 0:128]
    photo = np.stack([x * 2, y * 2, (x + y)], -1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, "JPEG", quality=90)
    jpeg = buffer.getvalue()
    scan = jpeg.index(b"\xff\xda")
    body = scan + 2 + jpeg[scan + 2] * 256 + jpeg[scan + 3]
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, "PNG")
    huge = bytearray(buffer.getvalue())
    huge[16:24] = struct.pack(">II", 20000, 20000)  # IHDR's width and height
    files = {
        "notes.jpg": (b"a text file saved as .jpg", r"\(25 bytes\) is not a JPEG, PNG, GIF or BMP image"),
        "corrupt.jpg": (jpeg[:body] + np.random.RandomState(0).bytes(len(jpeg) - body),
                        r"96x128\) does not decode: its body is truncated or corrupt"),
        "truncated.jpg": (jpeg[:len(jpeg) // 3],
                          r"96x128\) does not decode: its body is truncated or corrupt"),
        "huge.png": (bytes(huge), r"is 20000x20000, over the 200,000,000-pixel limit"),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, (data, _) in files.items():
        (folder / name).write_bytes(data)
    return {name: message for name, (_, message) in files.items()}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int, log_path, env=None):
    """Starts `python args...` in its own session, logging to `log_path`; returns the
    process once something listens on `port` (at most a minute)."""
    import socket
    import subprocess
    import time

    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"{args} did not listen on port {port} within a minute; see {log_path}")


def stop_server(proc) -> None:
    """Kills a `start_server` process and what it started."""
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
def beam_services(tmp_path):
    """Starts a Beam job service and an EXTERNAL worker pool, each its own process on
    127.0.0.1, as on a cluster; `start(path, env)` gives the pool's workers that PATH and
    environment (default this one's) and returns the pipeline's `--beam_pipeline_args`."""
    procs = []

    def start(path, env=None):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(env or os.environ, PYTHONPATH=root, PATH=path, TF_CPP_MIN_LOG_LEVEL="2")
        jobs, pool = free_port(), free_port()
        procs.append(start_server(["-m", "apache_beam.runners.portability.local_job_service_main",
                                   f"--port={jobs}"], jobs, tmp_path / "jobs.log", env))
        boot = os.path.join(root, "tests", "beam_boot.py")  # what the SDK container runs per worker
        procs.append(start_server(["-m", "apache_beam.runners.worker.worker_pool_main",
                                   f"--service_port={pool}", f"--container_executable={boot}"],
                                  pool, tmp_path / "pool.log", env))
        return [f"--beam_pipeline_args=--runner=PortableRunner,--job_endpoint=localhost:{jobs},"
                f"--environment_type=EXTERNAL,--environment_config=localhost:{pool}"]

    yield start
    for proc in procs:
        stop_server(proc)
