"""Model FLOPs utilisation (MFU) of `model.fit` training, against the chip's peak.

    make bench BENCH=train_mfu                                   # ViT-B/16, auto precision, XLA
    python -m benchmarks.train_mfu --batch_size=256 --steps=50   # on a GPU
    python -m benchmarks.train_mfu --model=ViT-Ti/16 --jit=false --precision=float32

Trains the model with `model.fit` as the pre-training recipe compiles it (AdamW with
decoupled weight decay, global-norm clipping at 1, the warmup schedule, dropout 0.1),
on one synthetic batch repeated from a `tf.data` pipeline on the host (so each step
still copies its batch to the device, as any input pipeline does, but decodes nothing).
The first epoch (tracing, XLA compilation, warm-up) is not timed; each later epoch of
`--steps` steps is, to the end of its last step.

A step's FLOPs are 6 x the forward MACs the model executes per image
(`keras_vit.flops.forward_macs(executed=True)`: 2 FLOPs a MAC, the backward pass twice
the forward), times the batch. Achieved FLOP/s are divided by two peaks:
- the chip's dense datasheet peak in the compute dtype (`datasheet_peak`; TF32 for
  float32 on GPUs that run it, as TF does by default), or `--peak_tflops`: MFU as papers
  report it;
- the `tf.matmul` peak measured in this run on the same device: what it sustains.
Figures, never assertions. Runs on the first GPU when there is one, else on the CPU.
"""

from __future__ import annotations

import os
import re
import time
from typing import Optional

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS

# Dense (no sparsity) tensor-core peaks in TFLOP/s from NVIDIA's datasheets:
# (16-bit, i.e. bfloat16 and float16; TF32; plain float32). The first pattern
# that matches the device name wins, so the more specific ones come first.
DATASHEET_TFLOPS = (
    (r"\bH200 NVL\b", (835.5, 417.5, 60.0)),
    (r"\bH200\b", (989.4, 494.7, 66.9)),
    (r"\bH100 PCIe\b", (756.0, 378.0, 51.2)),
    (r"\bH100 NVL\b", None),  # several versions of its datasheet disagree: pass --peak_tflops
    (r"\bH100\b", (989.4, 494.7, 66.9)),  # SXM
    (r"\bA100\b", (312.0, 156.0, 19.5)),
    (r"\bL40S\b", (362.1, 183.0, 91.6)),
    (r"\bL4\b", (121.0, 60.0, 30.3)),
)


def datasheet_peak(device_name: str, compute_dtype: str, tf32: bool = True) -> Optional[float]:
    """The dense peak FLOP/s of a GPU named `device_name` (as TF reports it, e.g.
    "NVIDIA H200") for matmuls in `compute_dtype`; None for a device not in
    `DATASHEET_TFLOPS`. float32 counts the TF32 rate when `tf32` is on (TF's default
    on GPUs of compute capability 8+)."""
    for pattern, peaks in DATASHEET_TFLOPS:
        if re.search(pattern, device_name):
            if peaks is None:
                return None
            half, tf32_rate, fp32 = peaks
            if compute_dtype in ("bfloat16", "float16"):
                return half * 1e12
            if compute_dtype == "float32":
                return (tf32_rate if tf32 else fp32) * 1e12
            raise ValueError(f"no datasheet peak for compute dtype {compute_dtype!r}")
    return None


def step_flops(config, batch_size: int) -> float:
    """FLOPs of one training step: 6 x executed forward MACs per image x the batch."""
    from keras_vit import flops

    return 6.0 * flops.forward_macs(config, executed=True) * batch_size


def device() -> tuple:
    """`(TF device string, name in words)`: the first GPU when there is one, else the CPU."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return "/GPU:0", details.get("device_name", "GPU")
    from keras_vit.hardware import bf16_instructions

    bf16 = bf16_instructions()
    return "/CPU:0", f"CPU, {os.cpu_count()} cores" + (f" ({', '.join(bf16)})" if bf16 else "")


def epoch_seconds(model, images, labels, steps: int, epochs: int, log=print) -> list:
    """Seconds of each of `epochs` `model.fit` epochs of `steps` steps on one batch
    repeated, after an untimed warm-up epoch. `model` must be compiled.

    Raises ValueError unless `steps` is a multiple of the model's `steps_per_execution`:
    Keras runs whole executions, so an epoch of 3 steps at 2 per execution runs 4.
    """
    import keras
    import tensorflow as tf

    if steps % model.steps_per_execution:
        raise ValueError(f"steps ({steps}) must be a multiple of steps_per_execution "
                         f"({model.steps_per_execution}): Keras would run more steps than it counts")

    data = tf.data.Dataset.from_tensors((images, labels)).repeat().prefetch(2)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            # The loss is the last step's result: fetching it waits for every step.
            loss = float(logs["loss"])
            seconds = time.perf_counter() - self._start
            self.seconds.append(seconds)
            what = "warm-up (not timed)" if epoch == 0 else f"{steps * len(images) / seconds:.1f} img/s"
            log(f"  epoch {epoch}/{epochs}: {seconds:.2f} s, loss {loss:.3f}, {what}")

    timer = Timer()
    model.fit(data, epochs=epochs + 1, steps_per_epoch=steps, callbacks=[timer], verbose=0)
    return timer.seconds[1:]


def peak_device_memory_gib(where: str) -> Optional[float]:
    """Peak memory of the GPU `where` ("/GPU:0") so far; None for a CPU."""
    import tensorflow as tf

    if not where.startswith("/GPU"):
        return None
    return tf.config.experimental.get_memory_info(where.lstrip("/"))["peak"] / 2 ** 30


def define_flags():
    """Defined when run, not on import: tests import this module beside others' flags."""
    flags.DEFINE_string("model", "ViT-B/16", "Registered model name.")
    flags.DEFINE_integer("batch_size", None, "Images per step (default: 256 on a GPU, 8 on a CPU).",
                         lower_bound=1)
    flags.DEFINE_integer("image_size", 224, "Resolution.")
    flags.DEFINE_enum("precision", "auto", ["auto", "float32", "mixed_bfloat16", "mixed_float16"],
                      "Keras dtype policy; auto picks bf16 on bf16 hardware (GPUs of compute capability 8+).")
    flags.DEFINE_bool("jit", True, "XLA-compile the training step.")
    flags.DEFINE_integer("steps", 10, "Steps per timed epoch.", lower_bound=1)
    flags.DEFINE_integer("epochs", 3, "Timed epochs, after one untimed warm-up epoch.", lower_bound=1)
    flags.DEFINE_integer("steps_per_execution", 5, "Steps Keras runs per call of its train function.",
                         lower_bound=1)
    flags.DEFINE_float("peak_tflops", None, "The chip's peak in the compute dtype, TFLOP/s "
                       "(default: `datasheet_peak` for known GPUs, none for CPUs).")
    flags.register_multi_flags_validator(
        ["steps", "steps_per_execution"], lambda v: v["steps"] % v["steps_per_execution"] == 0,
        "--steps must be a multiple of --steps_per_execution (Keras runs whole executions)")


def main(argv):
    del argv
    import keras
    import tensorflow as tf

    import keras_vit
    from benchmarks import measure
    from keras_vit.configs import model_config
    from keras_vit.training import recipes
    from keras_vit.precision import resolve_precision

    where, name = device()
    gpu = where.startswith("/GPU")
    policy = resolve_precision(FLAGS.precision)
    compute = keras.DTypePolicy(policy).compute_dtype
    batch = FLAGS.batch_size or (256 if gpu else 8)
    config = model_config(FLAGS.model).replace(image_size=FLAGS.image_size, num_classes=1000)
    setup = f"batch {batch}, {policy}, XLA {'on' if FLAGS.jit else 'off'}"
    print(f"{FLAGS.model} at {FLAGS.image_size} px, {setup}, on {name} ({where})", flush=True)

    print("Measuring the tf.matmul peak...", flush=True)
    with tf.device(where):
        measured = measure.matmul_peak((compute,), n=8192 if gpu else 2048)[compute]
    peak = FLAGS.peak_tflops * 1e12 if FLAGS.peak_tflops else (
        datasheet_peak(name, compute, tf.config.experimental.tensor_float_32_execution_enabled())
        if gpu else None)

    recipe = recipes.get_recipe("pretrain", batch_size=batch)
    models = measure.fresh_models(
        lambda: {"ours": keras_vit.create_model(config, dropout_rate=recipe.dropout_rate)}, policy)
    model = recipes.compile_model(models["ours"], recipe, total_steps=(FLAGS.epochs + 1) * FLAGS.steps,
                                  jit_compile=FLAGS.jit, steps_per_execution=FLAGS.steps_per_execution)
    rng = np.random.RandomState(0)
    images = rng.uniform(-1, 1, (batch, *config.image_size, 3)).astype("float32")
    labels = rng.randint(0, 1000, batch).astype("int32")
    print(f"Training {FLAGS.epochs + 1} epochs of {FLAGS.steps} steps (the first traces the step"
          + (", and XLA compiles it: minutes on a CPU" if FLAGS.jit else "") + ")...", flush=True)
    with tf.device(where):
        seconds = np.asarray(epoch_seconds(model, images, labels, FLAGS.steps, FLAGS.epochs))

    rate = batch * FLAGS.steps / seconds.min()
    per_image = step_flops(config, 1)
    achieved = per_image * rate
    print(f"\n{FLAGS.model}, {FLAGS.image_size} px, {setup}, {name}:")
    print(f"- {rate:.1f} img/s in the fastest epoch ({batch * FLAGS.steps / np.median(seconds):.1f} median), "
          f"{achieved / 1e12:.3g} TFLOP/s ({per_image / 1e9:.1f} GFLOP per image)")
    print(f"- {100 * achieved / measured:.1f}% of the {compute} tf.matmul peak measured here "
          f"({measured / 1e12:.3g} TFLOP/s)")
    if peak:
        source = "--peak_tflops" if FLAGS.peak_tflops else "datasheet, dense"
        print(f"- MFU {100 * achieved / peak:.1f}% of {peak / 1e12:.1f} TFLOP/s ({source})")
    else:
        print("- MFU: no datasheet peak for this device; pass --peak_tflops")
    memory = peak_device_memory_gib(where)
    print(f"- peak device memory {memory:.1f} GiB" if memory is not None
          else f"- peak RSS {measure.peak_rss_mib():.0f} MiB")
    keras.mixed_precision.set_global_policy("float32")


if __name__ == "__main__":
    define_flags()
    app.run(main)
