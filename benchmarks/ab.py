"""The model code at a git revision against the working tree's, side by side in one process.

    python -m benchmarks.ab --base=HEAD~1 --models=ViT-Ti/16 --mode=train

The revision's `keras_vit` is exported with `git archive` into a temporary directory
and imported as `keras_vit_base`. Both models get the same random weights, and their
calls are interleaved (`measure.interleaved_times`), so drift in the machine's load lands
on both. Prints the fastest call of each in ms and the working tree's speedup: the
median over rounds of the two calls' ratio, with a 90% bootstrap interval
(`measure.speedup`). An interval that holds 1.0 is a change not told apart from
noise; rerun with more `--min_rounds`. For inference it also
prints the largest logit difference and the top-1 agreement between the two. The
weights are random, so the logits are nearly tied: read the difference, since top-1
can flip on a tiny one (especially at batch 1).
A change's speedup measured this way is what benchmarks/RESULTS.md reports. Figures, never
assertions.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import numpy as np
from absl import app, flags

from benchmarks import measure

FLAGS = flags.FLAGS
flags.DEFINE_string("base", "HEAD", "The git revision to compare the working tree with.")
flags.DEFINE_enum("mode", "inference", ["inference", "train"], "Forward passes, or whole training steps.")
flags.DEFINE_list("models", ["ViT-Ti/16"], "Registered model names.")
flags.DEFINE_list("precisions", ["float32", "mixed_bfloat16"], "Keras dtype policies.")
flags.DEFINE_integer("batch_size", 32, "Images per call.")
flags.DEFINE_bool("jit", False, "XLA-compile both revisions' calls.")
flags.DEFINE_integer("image_size", 224, "Resolution.")
flags.DEFINE_float("min_seconds", 6.0, "Time the pair for at least this long.")
flags.DEFINE_integer("min_rounds", 20, "Calls of each at least (each round calls both).", lower_bound=3)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_revision(rev: str, into: str):
    """`keras_vit` as of `rev`, importable as `keras_vit_base` from `into`."""
    archive = subprocess.run(["git", "archive", rev, "keras_vit"], cwd=ROOT, capture_output=True)
    if archive.returncode:
        raise SystemExit(f"git archive {rev} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    package = os.path.join(into, "keras_vit_base")
    os.rename(os.path.join(into, "keras_vit"), package)
    for folder, _, files in os.walk(package):
        for name in (f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(re.sub(r"\bkeras_vit\b", "keras_vit_base", text))
    sys.path.insert(0, into)
    from tensorflow_datasets.core import registered

    # Both packages define the same TFDS builders; only the working tree's register.
    with registered.skip_registration():
        import keras_vit_base
    return keras_vit_base


def _cases(models, images, labels):
    cases = {k: measure.model_call(m, images, labels, FLAGS.mode, FLAGS.jit) for k, m in models.items()}
    if FLAGS.mode == "inference":
        logits = {k: call().numpy() for k, call in cases.items()}
        diff = np.abs(logits["base"] - logits["tree"]).max()
        agree = (logits["base"].argmax(-1) == logits["tree"].argmax(-1)).mean()
        print(f"  max |logit difference| {diff:.3g} (largest logit {np.abs(logits['base']).max():.3g}), "
              f"top-1 agreement {agree:.3f}")
    return cases


def main(argv):
    del argv
    import keras

    import keras_vit

    with tempfile.TemporaryDirectory() as tmp:
        base = import_revision(FLAGS.base, tmp)
        rev = subprocess.run(["git", "rev-parse", "--short", FLAGS.base], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
        print(f"base: keras_vit at {FLAGS.base} ({rev}); tree: {ROOT}")
        rows = []
        for name in FLAGS.models:
            for precision in FLAGS.precisions:
                models = measure.fresh_models(lambda: {
                    "base": base.create_model(name, num_classes=1000, image_size=FLAGS.image_size),
                    "tree": keras_vit.create_model(name, num_classes=1000, image_size=FLAGS.image_size)},
                    precision)
                rng = np.random.RandomState(0)
                weights = [rng.normal(0, 0.05, v.shape).astype("float32") for v in models["base"].weights]
                if [w.shape for w in weights] != [tuple(v.shape) for v in models["tree"].weights]:
                    raise SystemExit(f"{name}: the two revisions' models hold different weights")
                for m in models.values():
                    m.set_weights(weights)
                images = rng.uniform(-1, 1, (FLAGS.batch_size, *models["base"].config.image_size, 3))
                images = images.astype("float32")
                labels = rng.randint(0, 1000, FLAGS.batch_size)
                print(f"{name}, {precision}, batch {FLAGS.batch_size}, {FLAGS.mode}, XLA {FLAGS.jit}:",
                      flush=True)
                times = measure.interleaved_times(_cases(models, images, labels), FLAGS.min_seconds,
                                                  FLAGS.min_rounds)
                faster = measure.format_speedup(measure.speedup(times["base"], times["tree"]))
                row = (f"| {name} | {precision} | {FLAGS.mode} | {1e3 * times['base'].min():.1f} | "
                       f"{1e3 * times['tree'].min():.1f} | {faster} | {len(times['base'])} |")
                print(row, flush=True)
                rows.append(row)
                del models
        keras.mixed_precision.set_global_policy("float32")
    print(f"\nbatch {FLAGS.batch_size}, {FLAGS.image_size} px, XLA {'on' if FLAGS.jit else 'off'}, "
          f"base {FLAGS.base} ({rev})")
    print("| model | precision | mode | base ms | tree ms | tree speedup (90% interval) | rounds |\n"
          "|---|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)
