"""TF Serving's request batching, tuned by measuring an exported model on this machine.

TF Serving merges concurrent requests into one call of the model when it is started with

    tensorflow_model_server --enable_batching \
        --batching_parameters_file=<serving root>/batching_parameters.txt ...

`measure` times the SavedModel's `serving_default` on JPEGs at batch sizes 1, 2, 4, ...,
and `choose` turns those times into the file's four numbers:
- `max_batch_size`: the smallest batch that reaches 90% of the best images/s measured.
  Larger batches add latency for at most a tenth more throughput.
- `num_batch_threads`: the number of cores, as TF Serving's guide advises for CPUs,
  except where TF runs oneDNN: there 1. In TF 2.16, two calls of one SavedModel at
  once with different batch sizes corrupt the heap when oneDNN runs them (a crash
  within seconds, reproduced on AMX cores; with TF_ENABLE_ONEDNN_OPTS=0 it runs), so
  the server must never run two batches at once. One batch already spreads over
  every core through TF's own threads.
- `batch_timeout_micros`: 0, the guide's CPU value. Under load, requests queue while
  the threads are busy, so batches fill without waiting; a lone request is never held.
- `max_enqueued_batches`: about `QUEUE_SECONDS` of full batches. A request that would
  wait longer is refused at once (UNAVAILABLE), so a client or load balancer can retry
  elsewhere instead of timing out.

The file records the measured times as comments. Export measures on the exporting
machine; run `python -m keras_vit.batching --saved_model=<version dir>` on the serving
machine to tune for it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import statistics
import time
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from keras_vit import hardware, storage

FILENAME = "batching_parameters.txt"
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
KNEE = 0.9
QUEUE_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """The fields of TF Serving's `BatchingParameters` message that we set."""

    max_batch_size: int
    batch_timeout_micros: int
    max_enqueued_batches: int
    num_batch_threads: int

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            low = 0 if field.name == "batch_timeout_micros" else 1
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{field.name} must be an integer >= {low}, got {value!r}")

    @classmethod
    def from_text(cls, text: str) -> "BatchingParameters":
        """Reads what `to_text` writes (comments and other fields ignored)."""
        values = dict(re.findall(r"^(\w+) \{ value: (\d+) \}$", text, re.M))
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"no {', '.join(missing)} in the batching parameters")
        return cls(**{n: int(values[n]) for n in names})

    def to_text(self) -> str:
        """The message in protobuf text format, as `--batching_parameters_file` reads it."""
        return "".join(f"{f.name} {{ value: {getattr(self, f.name)} }}\n" for f in dataclasses.fields(self))


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def choose(latencies: Dict[int, float], num_cores: int, concurrent_calls: bool = True) -> BatchingParameters:
    """Batching parameters from `latencies` (batch size -> seconds per call);
    `concurrent_calls=False` keeps to one batch thread (see the module's docstring)."""
    if not latencies or any(b < 1 or not t > 0 for b, t in latencies.items()):
        raise ValueError(f"latencies must map batch sizes >= 1 to positive seconds, got {latencies}")
    rate = {b: b / t for b, t in latencies.items()}
    best = max(rate.values())
    size = min(b for b, r in rate.items() if r >= KNEE * best)
    threads = max(1, int(num_cores)) if concurrent_calls else 1
    queued = max(threads, math.ceil(QUEUE_SECONDS / latencies[size]))
    return BatchingParameters(max_batch_size=size, batch_timeout_micros=0,
                              max_enqueued_batches=queued, num_batch_threads=threads)


def time_batches(serve: Callable[[tf.Tensor], object], image: bytes,
                 batch_sizes: Sequence[int] = BATCH_SIZES, repeats: int = 5,
                 max_seconds: float = 2.0) -> Dict[int, float]:
    """Median seconds of `serve(batch)` for a string batch of `image` at each size.

    Stops after the first size whose call takes over `max_seconds`, and after two
    doublings that raise images/s by under 5% (the knee is behind).
    """
    out: Dict[int, float] = {}
    for size in batch_sizes:
        batch = tf.constant([image] * size)
        serve(batch)  # warm-up: the first call of a shape builds kernels
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            serve(batch)
            times.append(time.perf_counter() - start)
        out[size] = statistics.median(times)
        rates = [b / out[b] for b in out]
        flat = len(rates) >= 3 and max(rates[-2:]) < 1.05 * max(rates[:-2])
        if out[size] > max_seconds or flat:
            break
    return out


def _probe_jpeg(height: int, width: int) -> bytes:
    # Photo-like content (smooth gradients plus noise), at the model's input size.
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], -1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    return tf.io.encode_jpeg(pixels, quality=90).numpy()


def measure(saved_model_dir: str, num_cores: Optional[int] = None, **timing) -> tuple:
    """Times the SavedModel's `serving_default` and chooses its batching parameters.

    Loads `saved_model_dir` (a version directory) with TensorFlow alone, as TF Serving
    does. Returns `(BatchingParameters, latencies)`, latencies as in `time_batches`.
    """
    loaded = tf.saved_model.load(saved_model_dir)
    images = loaded.signatures["predict_images"].structured_input_signature[1]["images"]
    height, width = int(images.shape[1]), int(images.shape[2])
    serve = loaded.signatures["serving_default"]
    latencies = time_batches(lambda batch: serve(image_bytes=batch), _probe_jpeg(height, width), **timing)
    safe = not hardware.onednn_runs("float32")
    return choose(latencies, cores() if num_cores is None else num_cores, concurrent_calls=safe), latencies


def write(serving_root: str, params: BatchingParameters, latencies: Dict[int, float],
          measured: str) -> str:
    """Writes `serving_root/batching_parameters.txt`; `measured` names the model timed."""
    lines = [f"# Measured for {measured} on {cores()} {hardware.describe()} cores: "
             "serving_default on JPEGs at the model's input size.",
             "# batch  ms per call  images/s"]
    lines += [f"# {b:5d}  {t * 1e3:11.3f}  {b / t:8.1f}" for b, t in sorted(latencies.items())]
    out = storage.join(serving_root, FILENAME)
    return storage.write_text(out, "\n".join(lines) + "\n" + params.to_text())


def tune(version_dir: str, serving_root: Optional[str] = None, **timing) -> tuple:
    """Measures the SavedModel at `version_dir` (`<serving root>/<model>/<version>`) and
    writes batching_parameters.txt in `serving_root` (default: the one `version_dir` is
    in, beside models.config). Returns `(path, BatchingParameters, latencies)`."""
    params, latencies = measure(version_dir, **timing)
    model_dir = storage.parent(version_dir)
    name = f"{storage.basename(model_dir)} version {storage.basename(version_dir)}"
    path = write(serving_root or storage.parent(model_dir), params, latencies, name)
    return path, params, latencies


def main(argv):
    from absl import flags

    del argv
    FLAGS = flags.FLAGS
    print(f"Timing {FLAGS.saved_model} at batch sizes up to {max(BATCH_SIZES)} ...", flush=True)
    path, params, latencies = tune(FLAGS.saved_model, FLAGS.output_dir)
    for b, t in sorted(latencies.items()):
        print(f"batch {b:4d}: {t * 1e3:8.1f} ms, {b / t:8.1f} images/s")
    print(params.to_text(), end="")
    print(f"Wrote {path}; serve with --enable_batching --batching_parameters_file={path}")


def run():
    """Console entry point; flags are defined here so importing the module defines none."""
    from absl import flags

    from keras_vit.cli import run_app

    flags.DEFINE_string("saved_model", None, "An exported version directory, e.g. saved_models/vit/1.",
                        required=True)
    flags.DEFINE_string("output_dir", None,
                        "Where batching_parameters.txt goes (default: the serving root, beside "
                        "models.config).")
    run_app(main)


if __name__ == "__main__":
    run()
