"""What request batching buys under concurrent traffic: `python -m benchmarks.serving_concurrency`.

Exports a randomly initialised model (which writes batching_parameters.txt, tuned on
this machine), loads it with `tf.saved_model.load` (no keras_vit, as TF Serving), and
drives `serving_default` with 1, 8 and 32 clients, each sending one 224 px JPEG per
request and the next as soon as it is answered, for `--seconds` per case:
- unbatched: every client calls the model itself, as TF Serving runs concurrent
  requests without `--enable_batching`;
- batched: the clients' requests go through an in-process copy of TF Serving's basic
  batch scheduler, run with the file's parameters.
No server binary or gRPC is involved: the figures are the model's and the scheduler's,
without the network. Prints images/s, median and p99 latency per case, and the
batched/unbatched throughput ratio.
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "ViT-Ti/16", "Registered model name.")
flags.DEFINE_list("concurrency", ["1", "8", "32"], "Numbers of concurrent clients.")
flags.DEFINE_float("seconds", 10.0, "Traffic per case.")


class BatchScheduler:
    """TF Serving's basic batch scheduler, in Python: `num_batch_threads` threads each
    take up to `max_batch_size` queued requests (waiting up to `batch_timeout_micros`
    for more after the first), run them as one call, and answer each request."""

    def __init__(self, serve, params):
        self._serve, self._params = serve, params
        self._queue: "queue.Queue" = queue.Queue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, daemon=True)
                         for _ in range(params.num_batch_threads)]
        for t in self._threads:
            t.start()

    def __call__(self, image: bytes):
        done, box = threading.Event(), []
        self._queue.put((image, done, box))
        done.wait()
        return box[0]

    def _work(self):
        timeout = self._params.batch_timeout_micros / 1e6
        while not self._stop.is_set():
            try:
                batch = [self._queue.get(timeout=0.1)]
            except queue.Empty:
                continue
            deadline = time.perf_counter() + timeout
            while len(batch) < self._params.max_batch_size:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.perf_counter()))
                                 if timeout else self._queue.get_nowait())
                except queue.Empty:
                    break
            out = self._serve(image_bytes=tf.constant([image for image, _, _ in batch]))["classes"].numpy()
            for (_, done, box), row in zip(batch, out):
                box.append(row)
                done.set()

    def close(self):
        self._stop.set()
        for t in self._threads:
            t.join()


def drive(call, clients: int, seconds: float, image: bytes):
    """Closed-loop clients for `seconds`: (images/s, latencies in seconds)."""
    latencies, lock = [], threading.Lock()
    end = time.perf_counter() + seconds

    def client():
        mine = []
        while time.perf_counter() < end:
            start = time.perf_counter()
            call(image)
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(latencies) / (time.perf_counter() - start), latencies


def main(argv):
    del argv
    import keras_vit
    from keras_vit import batching, hardware, storage
    from keras_vit.export import export_saved_model

    model = keras_vit.create_model(FLAGS.model, num_classes=1000)
    size = model.config.image_size
    with tempfile.TemporaryDirectory() as root:
        print(f"Exporting {FLAGS.model} and timing it at growing batch sizes ...", flush=True)
        version = export_saved_model(model, f"{root}/m", warmup=False)
        text = storage.read_text(f"{root}/{batching.FILENAME}")
        print(text, end="")
        params = batching.BatchingParameters.from_text(text)
        serve = tf.saved_model.load(version).signatures["serving_default"]
        pixels = np.random.RandomState(0).randint(0, 256, (*size, 3)).astype(np.uint8)
        photo = tf.io.encode_jpeg(pixels).numpy()

        def unbatched(image):
            return serve(image_bytes=tf.constant([image]))["classes"].numpy()[0]

        print(f"{FLAGS.model} float32, {batching.cores()} {hardware.describe()} cores, "
              f"{FLAGS.seconds:g} s a case")
        print(f"{'clients':>7} {'mode':<9} {'images/s':>9} {'p50 ms':>8} {'p99 ms':>8}  batched/unbatched")
        for clients in [int(c) for c in FLAGS.concurrency]:
            rates = {}
            for mode in ("unbatched", "batched"):
                scheduler = BatchScheduler(serve, params) if mode == "batched" else None
                call = scheduler or unbatched
                drive(call, clients, min(2.0, FLAGS.seconds), photo)  # warm-up
                rate, lat = drive(call, clients, FLAGS.seconds, photo)
                if scheduler:
                    scheduler.close()
                rates[mode] = rate
                ratio = f"  {rate / rates['unbatched']:.2f}x" if mode == "batched" else ""
                print(f"{clients:>7} {mode:<9} {rate:>9.1f} {np.percentile(lat, 50) * 1e3:>8.1f} "
                      f"{np.percentile(lat, 99) * 1e3:>8.1f}{ratio}", flush=True)


if __name__ == "__main__":
    app.run(main)
