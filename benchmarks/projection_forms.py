"""The encoder's affine maps in each form TF can run them, side by side.

    make bench BENCH=projection_forms
    python -m benchmarks.projection_forms --widths=768 --rows=6304 --dtypes=bfloat16

For each model width D and number of token rows, the four maps of an encoder block
(qkv `[D, 3D]`, the out projection `[D, D]` plus a residual, fc1 `[D, 4D]` with the
tanh-GELU, fc2 `[4D, D]` plus a residual) are timed as:
- `matmul`: MatMul + BiasAdd (+ Add or GELU), which grappler fuses into one oneDNN
  op (`_MklNativeFusedMatMul`, an inner product);
- `conv`: the same map as a 1x1 Conv2D with its bias (and residual) fused
  (`projection._as_pointwise_conv`). Conv2D fuses no GELU: fc1's form is the
  convolution, then the GELU as one XLA kernel, as `projection.project_gelu` runs it
  in Keras's predict and evaluate steps;
- `plain`: the bare MatMul, without bias, residual or GELU: the speed the kernels
  reach on the product alone.
The forms' calls are interleaved in one process. It prints GFLOP/s (2 x M x K x N, of
the fastest call) and each form's speed over the fused matmul's (`measure.speedup`: the
median of paired calls, with its 90% interval). `keras_vit.layers.projection` takes the
convolution where this showed it faster; rerun it after a TensorFlow upgrade.
Figures, never assertions.
"""

from __future__ import annotations

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("widths", ["192", "384", "768"], "Model widths D (ViT-Ti, S, B).")
flags.DEFINE_list("rows", ["197", "6304"], "Token rows: one image and 32 images at 224 px.")
flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Compute dtypes.")
flags.DEFINE_float("min_seconds", 2.0, "Time each map's forms for at least this long.")


def _forms(tokens, kernel, bias, residual, gelu):
    """name -> zero-argument call, for one map."""
    import tensorflow as tf

    from keras_vit.layers import projection

    if gelu:  # tf.nn.gelu after the matmul, which grappler fuses into it
        calls = {"matmul": tf.function(lambda x: tf.nn.gelu(projection._as_matmul(x, kernel, bias, None),
                                                            approximate=True)),
                 "conv": tf.function(lambda x: projection._xla_gelu(
                     projection._as_pointwise_conv(x, kernel, bias, None), True))}
    else:
        calls = {"matmul": tf.function(lambda x: projection._as_matmul(x, kernel, bias, residual)),
                 "conv": tf.function(lambda x: projection._as_pointwise_conv(x, kernel, bias, residual))}
    calls["plain"] = tf.function(lambda x: tf.matmul(x, kernel))
    return {name: (lambda f=f: f(tokens)) for name, f in calls.items()}


def main(argv):
    del argv
    import numpy as np
    import tensorflow as tf

    from benchmarks import measure

    print("| dtype | rows | map | matmul GFLOP/s | conv GFLOP/s | plain GFLOP/s | conv / matmul "
          "| plain / matmul |\n|---|---:|---|---:|---:|---:|---:|---:|")
    rng = np.random.RandomState(0)
    for dtype in FLAGS.dtypes:
        as_dtype = lambda *shape: tf.cast(rng.normal(size=shape).astype("float32"), dtype)  # noqa: E731
        for rows in (int(r) for r in FLAGS.rows):
            for width in (int(w) for w in FLAGS.widths):
                maps = (("qkv", width, 3 * width, False, False),
                        ("out + residual", width, width, True, False),
                        ("fc1 + GELU", width, 4 * width, False, True),
                        ("fc2 + residual", 4 * width, width, True, False))
                for name, k, n, with_residual, gelu in maps:
                    tokens, kernel, bias = as_dtype(rows, k), as_dtype(k, n) * 0.05, as_dtype(n)
                    residual = as_dtype(rows, n) if with_residual else None
                    t = measure.interleaved_times(_forms(tokens, kernel, bias, residual, gelu),
                                                  FLAGS.min_seconds)
                    rate = {form: 2.0 * rows * k * n / s.min() / 1e9 for form, s in t.items()}
                    over = {form: measure.format_speedup(measure.speedup(t["matmul"], t[form]))
                            for form in ("conv", "plain")}
                    print(f"| {dtype} | {rows} | D={width} {name} | {rate['matmul']:.0f} | "
                          f"{rate['conv']:.0f} | {rate['plain']:.0f} | {over['conv']} | "
                          f"{over['plain']} |", flush=True)


if __name__ == "__main__":
    app.run(main)
