"""What a phone photo costs the served model, against a small JPEG, and what a refused
image costs: `python -m benchmarks.photo_latency`.

Exports a randomly initialised model, loads it with `tf.saved_model.load` (as TF
Serving does, no keras_vit), and times `serving_default` at batch 1 on a 224 px JPEG
and on a 12 MP (4032x3024) JPEG of a synthetic photo (smooth shading, edges and
sensor-like noise: it compresses like a photo, not like random noise), their calls
interleaved. Then, each in a fresh process that loads the SavedModel, it sends a 224 px
JPEG, a 20000x20000 PNG (0.4 MB of zeros) and a batch of 32 of the photos, and reports
the time and the process's peak memory. Figures, not assertions.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "ViT-Ti/16", "Registered model name.")
flags.DEFINE_integer("iterations", 20, "Timed calls per image (after 2 warm-up calls).")
flags.DEFINE_integer("batch", 32, "Photos in the memory-measuring batch (0: skip it).")


def synthetic_photo(h, w, seed=0):
    """Smooth shading, a few hard edges and sensor noise, uint8 [h, w, 3]."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    image = np.stack([120 + 90 * np.sin(x / w * 7 + c) * np.cos(y / h * 5 - c) for c in (0.0, 1.0, 2.0)], -1)
    for _ in range(12):  # objects: discs of flat colour
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(0.03, 0.15) * min(h, w)
        image[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    image += rng.normal(0, 3, image.shape).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def _encode(array, fmt, **kwargs):
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def main(argv):
    del argv
    import tensorflow as tf

    import keras_vit
    from keras_vit.export import export_saved_model

    model = keras_vit.create_model(FLAGS.model, num_classes=1000)
    size = model.config.image_size[0]
    print(f"Making the images and exporting {FLAGS.model} (float32, {size} px) ...", flush=True)
    small = _encode(synthetic_photo(size, size), "JPEG", quality=90)
    phone = _encode(synthetic_photo(3024, 4032, seed=1), "JPEG", quality=90)
    bomb = _encode(np.zeros((20000, 20000), np.uint8), "PNG", optimize=True)
    with tempfile.TemporaryDirectory() as root:
        path = export_saved_model(model, os.path.join(root, "vit"), warmup=False)
        serve = tf.saved_model.load(path).signatures["serving_default"]
        cases = {"224 px JPEG": tf.constant([small]), "12 MP JPEG": tf.constant([phone])}
        for x in cases.values():
            serve(image_bytes=x), serve(image_bytes=x)
        times = {name: [] for name in cases}
        order = list(cases)
        for _ in range(FLAGS.iterations):
            for name in order:
                start = time.perf_counter()
                serve(image_bytes=cases[name])
                times[name].append(time.perf_counter() - start)
            order.reverse()
        print(f"{'request':<14} {'bytes':>12} {'median ms':>10} {'p90 ms':>8}")
        for name, t in times.items():
            print(f"{name:<14} {len(cases[name].numpy()[0]):>12,} {np.median(t) * 1e3:>10.1f} "
                  f"{np.percentile(t, 90) * 1e3:>8.1f}")
        ratio = np.median(times["12 MP JPEG"]) / np.median(times["224 px JPEG"])
        print(f"12 MP / 224 px, median: {ratio:.2f}x")

        requests = {"a 224 px JPEG": [small], "a 20000x20000 PNG of zeros": [bomb]}
        if FLAGS.batch:
            requests[f"{FLAGS.batch} 12 MP JPEGs"] = [phone] * FLAGS.batch
        print("Each request in a fresh process that loads the SavedModel with TensorFlow alone:")
        for name, images in requests.items():
            file = os.path.join(root, "request.npy")
            np.save(file, np.array(images, dtype=object), allow_pickle=True)
            warm = os.path.join(root, "warm.jpg")
            with open(warm, "wb") as f:
                f.write(small)
            proc = subprocess.run([sys.executable, "-c", _ONE_REQUEST, path, file, warm], capture_output=True,
                                  text=True, timeout=600)
            if proc.returncode:
                raise RuntimeError(proc.stderr[-2000:])
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"  {name} ({sum(len(i) for i in images):,} bytes): {result['seconds']:.3f} s, "
                  f"peak memory {result['peak_mib']:,.0f} MiB (+{result['growth_mib']:,.0f} MiB over the "
                  f"peak after a warm-up call), {result['outcome']}", flush=True)


# Loads the SavedModel, sends a small warm-up request, then the request; prints its
# time, the process's peak memory and its growth, and whether it was answered.
_ONE_REQUEST = """
import json, resource, sys, time
import numpy as np
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
images = tf.constant(list(np.load(sys.argv[2], allow_pickle=True)))
serve(image_bytes=tf.constant([open(sys.argv[3], "rb").read()]))  # warm: the first call traces
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
start = time.perf_counter()
try:
    serve(image_bytes=images)
    outcome = "answered"
except tf.errors.InvalidArgumentError as e:
    outcome = "refused: " + next(line for line in str(e).splitlines() if "limit" in line or "image" in line)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": time.perf_counter() - start, "outcome": outcome.strip()[:100],
                  "peak_mib": peak, "growth_mib": peak - before}))
"""

if __name__ == "__main__":
    app.run(main)
