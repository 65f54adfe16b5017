"""How fast elementwise work runs on this machine: TF's kernels, XLA's, and a plain copy.

    make bench BENCH=elementwise_rates
    python -m benchmarks.elementwise_rates --rows=6304 --cols=3072

What is left of a bf16 forward pass besides the matmuls (GELU, softmax, transposes,
LayerNorm) reads and writes whole activations, so its speed is set by how fast one
elementwise pass goes. On a `[rows, cols]` tensor (by default ViT-B/16's fc1 output at
batch 32 and 224 px) this times, interleaved in one process, for float32 and bfloat16:
numpy copying it into an array it already holds (what one thread's memory traffic
reaches), TF's `x * 2` and the tanh GELU the models use (`tf.nn.gelu(approximate=True)`),
and the same two compiled by XLA, as fc1's GELU runs in bf16 `predict`. It prints ms
per call, GB/s read plus written, and G elements/s. Figures, never assertions.
"""

from __future__ import annotations

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 6304, "Rows of the tensor (ViT-B/16 at batch 32: 32 x 197 tokens).")
flags.DEFINE_integer("cols", 3072, "Columns of the tensor (ViT-B/16's MLP width).")
flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Element types to time.")
flags.DEFINE_float("min_seconds", 3.0, "Time each dtype's cases for at least this long together.")


def main(argv):
    del argv
    import numpy as np
    import tensorflow as tf

    from benchmarks import measure

    rows = []
    for dtype in FLAGS.dtypes:
        shape = f"[{FLAGS.rows}, {FLAGS.cols}]"
        print(f"{dtype}: timing a copy and the elementwise ops on {shape}...", flush=True)
        x = tf.cast(tf.random.normal([FLAGS.rows, FLAGS.cols]), dtype)
        host = x.numpy()
        target = np.empty_like(host)
        cases = {"numpy copy (1 thread)": lambda: np.copyto(target, host)}
        for label, jit in (("TF", False), ("XLA", True)):
            # x is an argument, not a captured constant, so that grappler cannot fold the ops away.
            double = tf.function(lambda t: t * 2, jit_compile=jit)
            gelu = tf.function(lambda t: tf.nn.gelu(t, approximate=True), jit_compile=jit)
            cases[f"{label} x * 2"] = lambda f=double: f(x)
            cases[f"{label} GELU"] = lambda f=gelu: f(x)
        seconds = measure.side_by_side(cases, FLAGS.min_seconds)
        elements = FLAGS.rows * FLAGS.cols
        moved = 2 * elements * x.dtype.size
        for name, s in seconds.items():
            rates = f"{moved / s / 1e9:.1f} | {elements / s / 1e9:.2f}"
            rows.append(f"| {dtype} | {name} | {s * 1e3:.2f} | {rates} |")
    print(f"\n[{FLAGS.rows}, {FLAGS.cols}], fastest call of each, interleaved:")
    print("| dtype | op | ms | GB/s (read + written) | G elements/s |\n|---|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)
