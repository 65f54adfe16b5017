"""Where a forward pass's or training step's time goes, by op type: a TF profiler trace.

    make bench BENCH=op_profile
    python -m benchmarks.op_profile --model=ViT-Ti/16 --batch_size=32 --precision=mixed_bfloat16
    python -m benchmarks.op_profile --by=node --top=30     # the single graph nodes instead
    python -m benchmarks.op_profile --mode=train           # AdamW training steps

Traces `--calls` calls of the model's `predict_step` (what `model.predict` runs), or
of `train_on_batch` with `--mode=train` (AdamW, sparse cross-entropy), after timing
them, and prints, per op type (or per graph node), the time per call and its share of
all op time. Times are exclusive: an op recorded inside another (the body of a function
call run without XLA) counts once. Asynchronous kernels are labelled by their kernel
type; in a bf16 `predict` the `PartitionedCall`s are fc1's XLA GELU
(`keras_vit.layers.fast_paths`). Ops overlap on the inter-op threads, so op time and
the wall time per call (timed separately, also printed) need not agree: in training
steps the optimizer's many small updates overlap the rest. Figures, never assertions.
"""

from __future__ import annotations

import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "ViT-B/16", "Registered model name.")
flags.DEFINE_enum("mode", "inference", ["inference", "train"], "Forward passes, or whole training steps.")
flags.DEFINE_integer("batch_size", 32, "Images per call.", lower_bound=1)
flags.DEFINE_integer("image_size", 224, "Resolution.")
flags.DEFINE_enum("precision", "auto", ["auto", "float32", "mixed_bfloat16"],
                  "Keras dtype policy; auto picks bf16 on bf16 hardware.")
flags.DEFINE_integer("calls", 5, "Traced calls (after the untraced timed ones).", lower_bound=1)
flags.DEFINE_enum("by", "type", ["type", "node"], "Group op time by op type or by graph node.")
flags.DEFINE_integer("top", 15, "Rows to print.", lower_bound=1)
flags.DEFINE_string("trace_dir", None, "Where the trace goes (default: a new temporary directory).")


def main(argv):
    del argv
    import tensorflow as tf

    import keras_vit
    from benchmarks import measure, op_trace
    from keras_vit.precision import resolve_precision

    policy = resolve_precision(FLAGS.precision)
    model = measure.fresh_models(
        lambda: {"ours": keras_vit.create_model(FLAGS.model, num_classes=1000, image_size=FLAGS.image_size)},
        policy)["ours"]
    images = tf.random.uniform([FLAGS.batch_size, FLAGS.image_size, FLAGS.image_size, 3], -1.0, 1.0)
    labels = tf.zeros([FLAGS.batch_size], tf.int32)
    call = measure.model_call(model, images, labels, mode=FLAGS.mode)
    step = "predict_step" if FLAGS.mode == "inference" else "train_on_batch"
    print(f"{FLAGS.model}, batch {FLAGS.batch_size}, {policy}, {step}: "
          f"timing, then tracing {FLAGS.calls} calls...", flush=True)
    wall = measure.best_seconds(call)  # also the warm-up: the trace holds no tracing or first calls
    trace_dir = FLAGS.trace_dir or tempfile.mkdtemp(prefix="op_profile_")
    times = op_trace.op_times(op_trace.trace(call, FLAGS.calls, trace_dir), FLAGS.by)
    total = sum(times.values())
    if total <= 0:
        raise RuntimeError(f"the trace in {trace_dir} holds no TF op executions to attribute")
    print(f"\n{FLAGS.model}, {FLAGS.image_size} px, batch {FLAGS.batch_size}, {policy}, {step}: "
          f"{total / FLAGS.calls * 1e3:.1f} ms of op time per call, {wall * 1e3:.1f} ms wall (best call)")
    heading = "op type" if FLAGS.by == "type" else "node (op type)"
    print(f"| {heading} | ms per call | share |\n|---|---:|---:|")
    for label, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:FLAGS.top]:
        print(f"| {label} | {seconds / FLAGS.calls * 1e3:.2f} | {seconds / total:.1%} |")
    print(f"\nTrace: {trace_dir} (TensorBoard's profile plugin opens it)")


if __name__ == "__main__":
    app.run(main)
