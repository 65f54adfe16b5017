"""Latency and throughput of the exported SavedModel, as TF Serving would run it.

    python -m benchmarks.export_latency --model=ViT-B/16 --batch_sizes=1,32 --precision=mixed_bfloat16

Exports a randomly initialised model, loads it back with `tf.saved_model.load`
(no keras_vit in the serving path), and times `serving_default` on JPEG bytes
(decode and resize included) and `predict_images` on preprocessed float32
batches. Prints median and p90 latency and images/s. Under a mixed policy it also
exports the model with its float32 weights kept (`weights_in_compute_dtype=False`,
cast at every call), times both SavedModels with their calls interleaved, and
prints the speedup of storing the weights in the compute dtype. Figures, not
assertions.
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
flags.DEFINE_integer("iterations", 10, "Timed calls per case and export (after 2 warm-up calls).")
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


def _times(cases, iterations):
    """Per-call seconds of each case, their calls interleaved (order reversed each round)."""
    order = list(cases)
    for _ in range(2):
        for name in order:
            cases[name]()
    times = {name: [] for name in order}
    for _ in range(iterations):
        for name in order:
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
        order.reverse()
    return times


def main(argv):
    del argv
    import keras
    import tensorflow as tf

    import keras_vit
    from keras_vit.export import export_saved_model
    from keras_vit.precision import set_precision

    policy = set_precision(FLAGS.precision)
    model = keras_vit.create_model(FLAGS.model, num_classes=1000, image_size=FLAGS.image_size)
    compute = keras.DTypePolicy(policy).compute_dtype
    variants = {compute: True}
    if compute != "float32":
        variants["float32"] = False
    with tempfile.TemporaryDirectory() as root:
        signatures = {}
        for name, cast in variants.items():
            print(f"Exporting {FLAGS.model} ({policy}, weights stored in {name}) "
                  f"at {FLAGS.image_size} px ...", flush=True)
            path = export_saved_model(model, os.path.join(root, name),
                                      warmup=False, weights_in_compute_dtype=cast)
            signatures[name] = tf.saved_model.load(path).signatures
        print(f"{'signature':<16} {'weights':<9} {'batch':>5} {'median ms':>10} {'p90 ms':>8} {'images/s':>9}"
              + ("  speedup" if len(variants) > 1 else ""))
        for batch in [int(b) for b in FLAGS.batch_sizes]:
            jpegs = tf.constant(_jpegs(batch, FLAGS.image_size))
            images = tf.random.uniform([batch, FLAGS.image_size, FLAGS.image_size, 3], -1, 1)
            for signature in ("serving_default", "predict_images"):
                inputs = {"image_bytes": jpegs} if signature == "serving_default" else {"images": images}
                cases = {name: (lambda fn=sigs[signature]: fn(**inputs)) for name, sigs in signatures.items()}
                times = _times(cases, FLAGS.iterations)
                for name, t in times.items():
                    median, p90 = np.median(t), np.percentile(t, 90)
                    speedup = (f"  {np.median(times['float32']) / median:6.2f}x"
                               if len(variants) > 1 and name != "float32" else "")
                    print(f"{signature:<16} {name:<9} {batch:>5} {median * 1e3:>10.1f} {p90 * 1e3:>8.1f} "
                          f"{batch / median:>9.1f}{speedup}", flush=True)


if __name__ == "__main__":
    app.run(main)
