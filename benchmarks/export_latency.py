"""Latency and throughput of the exported SavedModel, as TF Serving would run it.

    python benchmarks/export_latency.py --model=ViT-Ti/16 --batch_sizes=1,32

Exports a randomly initialised model, loads it back with `tf.saved_model.load`
(no keras_vit in the serving path), and times `serving_default` on JPEG bytes
(decode and resize included) and `predict_images` on preprocessed float32
batches. Prints median and p90 latency and images/s. Figures, not assertions.
"""

from __future__ import annotations

import io
import os
import tempfile
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "ViT-Ti/16", "Registered model name.")
flags.DEFINE_integer("image_size", 224, "Model resolution.")
flags.DEFINE_list("batch_sizes", ["1", "32"], "Batch sizes to time.")
flags.DEFINE_integer("iterations", 10, "Timed calls per case (after 2 warm-up calls).")
flags.DEFINE_enum("precision", "auto", ["auto", "float32", "mixed_bfloat16"],
                  "Keras dtype policy of the model; auto picks bf16 on bf16 hardware and says which.")


def _jpegs(n, size):
    from PIL import Image

    rng = np.random.RandomState(0)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.randint(0, 256, (size + 32, size + 16, 3), dtype=np.uint8)).save(buf, "JPEG")
        out.append(buf.getvalue())
    return out


def _time(fn, iterations):
    for _ in range(2):
        fn()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return np.median(times), np.percentile(times, 90)


def main(argv):
    del argv
    import keras
    import tensorflow as tf

    import keras_vit
    from keras_vit.export import export_saved_model

    from keras_vit.training.precision import set_precision

    policy = set_precision(FLAGS.precision)
    model = keras_vit.create_model(FLAGS.model, num_classes=1000, image_size=FLAGS.image_size)
    with tempfile.TemporaryDirectory() as root:
        print(f"Exporting {FLAGS.model} ({policy}) at {FLAGS.image_size} px ...", flush=True)
        path = export_saved_model(model, os.path.join(root, "bench"), warmup=False)
        signatures = tf.saved_model.load(path).signatures
        print(f"{'signature':<16} {'batch':>5} {'median ms':>10} {'p90 ms':>8} {'images/s':>9}")
        for batch in [int(b) for b in FLAGS.batch_sizes]:
            jpegs = tf.constant(_jpegs(batch, FLAGS.image_size))
            images = tf.random.uniform([batch, FLAGS.image_size, FLAGS.image_size, 3], -1, 1)
            cases = {"serving_default": lambda: signatures["serving_default"](image_bytes=jpegs),
                     "predict_images": lambda: signatures["predict_images"](images=images)}
            for name, fn in cases.items():
                median, p90 = _time(fn, FLAGS.iterations)
                print(f"{name:<16} {batch:>5} {median * 1e3:>10.1f} {p90 * 1e3:>8.1f} {batch / median:>9.1f}",
                      flush=True)


if __name__ == "__main__":
    app.run(main)
