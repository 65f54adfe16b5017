"""Inference speed and peak memory by input size: ViT-B/16 and R50+ViT-B/16 against ResNet-50.

    make bench BENCH=input_size
    python -m benchmarks.input_size --sizes=224,384 --batch_size=1

The paper's comparison (Figure 12) on this machine. Every model and size runs in a
fresh subprocess, so its peak RSS is its own; images/s is timed there too. The
models are ours (ViT-B/16, R50+ViT-B/16), keras-hub's `ViTBackbone` B/16 and
`keras.applications.ResNet50`, all randomly initialised. Figures, not assertions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["224", "384", "512"], "Square input sizes.")
flags.DEFINE_list("models", ["ViT-B/16", "R50+ViT-B/16", "keras-hub ViT-B/16", "ResNet-50"],
                  "What to measure.")
flags.DEFINE_integer("batch_size", 1, "Images per call.")
flags.DEFINE_enum("precision", "auto", ["auto", "float32", "mixed_bfloat16"],
                  "Keras dtype policy; auto picks bf16 on bf16 hardware.")
flags.DEFINE_bool("jit_compile", False, "XLA-compile the forward pass.")
flags.DEFINE_float("min_seconds", 2.0, "Time each case for at least this long.")
flags.DEFINE_string("case", None, "Internal: run one 'model@size' case and print its JSON.")


def _model(name, size):
    import keras

    import keras_vit
    from benchmarks import measure

    if name == "ResNet-50":
        return keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)
    if name.startswith("keras-hub "):
        config = keras_vit.model_config(name[len("keras-hub "):]).replace(image_size=size)
        return measure.keras_hub_vit(config, num_classes=1000)
    return keras_vit.create_model(name, num_classes=1000, image_size=size)


def _macs(name, size, model):
    from benchmarks import measure
    from keras_vit import flops, model_config

    if name == "ResNet-50":
        return measure.conv_dense_macs(model)
    # keras-hub's backbone carries every token through every block; ours does not.
    hub = name.startswith("keras-hub ")
    return flops.forward_macs(model_config(name.replace("keras-hub ", "")).replace(image_size=size),
                              executed=not hub)


def run_case(spec):
    import keras

    from benchmarks import measure

    name, size = spec.rsplit("@", 1)
    size = int(size)
    keras.mixed_precision.set_global_policy(FLAGS.precision)
    model = _model(name, size)
    images = np.random.RandomState(0).uniform(-1, 1, (FLAGS.batch_size, size, size, 3)).astype("float32")
    forward = measure.model_call(model, images, None, jit=FLAGS.jit_compile)
    seconds = measure.best_seconds(forward, FLAGS.min_seconds, min_iterations=2)
    print(json.dumps({"images_per_second": FLAGS.batch_size / seconds, "peak_rss_mib": measure.peak_rss_mib(),
                      "params": model.count_params(), "macs": _macs(name, size, model)}))


def main(argv):
    del argv
    if FLAGS.case:
        return run_case(FLAGS.case)
    from benchmarks import measure
    from keras_vit.precision import resolve_precision

    FLAGS.precision = resolve_precision(FLAGS.precision)  # the children get the resolved policy
    compute = "bfloat16" if "bfloat16" in FLAGS.precision else "float32"
    peak = measure.matmul_peak((compute,))[compute]
    print(f"tf.matmul peak ({compute}): {peak / 1e9:.0f} GFLOP/s; batch {FLAGS.batch_size}, "
          f"{FLAGS.precision}, jit {'on' if FLAGS.jit_compile else 'off'}", flush=True)
    rows = []
    for size in FLAGS.sizes:
        for name in FLAGS.models:
            args = [sys.executable, "-m", "benchmarks.input_size", f"--case={name}@{size}",
                    f"--batch_size={FLAGS.batch_size}", f"--precision={FLAGS.precision}",
                    f"--jit_compile={FLAGS.jit_compile}", f"--min_seconds={FLAGS.min_seconds}"]
            print(f"  {name} at {size} px...", flush=True)
            done = subprocess.run(args, capture_output=True, text=True, env=os.environ)
            if done.returncode:
                raise RuntimeError(f"{name} at {size} failed:\n{done.stderr[-2000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            share = r["images_per_second"] * 2 * r["macs"] / peak
            rows.append(f"| {name} | {size} | {r['images_per_second']:.2f} | {r['peak_rss_mib']:,.0f} | "
                        f"{r['macs'] / 1e9:.1f} | {100 * share:.0f}% |")
            print(rows[-1], flush=True)
    print("\nGMACs are what each model computes (ours: `keras_vit.flops.forward_macs(executed=True)`).")
    print("| model | size | img/s | peak RSS (MiB) | GMACs / image | % of matmul peak |\n"
          "|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)
