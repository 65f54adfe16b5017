"""Our LayerNorm and GroupNorm against Keras's layers, forward and forward + backward.

    make bench BENCH=norm_layers
    python -m benchmarks.norm_layers --policies=mixed_bfloat16 --min_seconds=4

Both layers of a pair get the same weights and input, and their calls are interleaved
in one process (`measure.interleaved_times`); ratios are `measure.speedup`'s median of
paired calls with its 90% interval, the ms the fastest call's. The shapes are ViT-B/16's
tokens at batch 32 and the `make run` ViT's, and activations of the BiT ResNet stages
at batch 8.
Figures, never assertions.
"""

from __future__ import annotations

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("policies", ["float32", "mixed_bfloat16"], "Keras dtype policies.")
flags.DEFINE_float("min_seconds", 3.0, "Time each pair for at least this long.")

CASES = (
    ("LayerNorm", (32, 197, 768)),
    ("LayerNorm", (256, 50, 64)),
    ("GroupNorm", (8, 56, 56, 256)),
    ("GroupNorm", (8, 28, 28, 512)),
    ("GroupNorm", (8, 14, 14, 1024)),
)


def _pair(kind, policy):
    import keras

    from keras_vit import layers

    if kind == "LayerNorm":
        return (layers.LayerNorm(epsilon=1e-6, dtype=policy),
                keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy))
    return (layers.GroupNorm(groups=32, epsilon=1e-6, dtype=policy),
            keras.layers.GroupNormalization(groups=32, epsilon=1e-6, dtype=policy))


def _calls(layer, x):
    import tensorflow as tf

    # Inference and training are timed in the mode each runs in: our LayerNorm's
    # inference graph is oneDNN's pattern, its training graph has the written gradient.
    forward = tf.function(lambda x: layer(x, training=False))

    @tf.function
    def forward_backward(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.cast(layer(x, training=True), tf.float32))
        return tape.gradient(loss, [x, *layer.trainable_weights])

    return (lambda: forward(x)), (lambda: forward_backward(x))


def main(argv):
    del argv
    import numpy as np
    import tensorflow as tf

    from benchmarks import measure

    print("| layer | shape | policy | forward ours / Keras | forward + backward ours / Keras |\n"
          "|---|---|---|---:|---:|")
    for kind, shape in CASES:
        for policy in FLAGS.policies:
            ours, ref = _pair(kind, policy)
            for layer in (ours, ref):
                layer.build(shape)
            ref.set_weights(ours.get_weights())
            rng = np.random.RandomState(0)
            x = tf.cast(rng.normal(0.5, 2.0, size=shape).astype("float32"), ours.compute_dtype)
            (f_ours, fb_ours), (f_ref, fb_ref) = _calls(ours, x), _calls(ref, x)
            t = measure.interleaved_times({"f_ours": f_ours, "f_ref": f_ref, "fb_ours": fb_ours,
                                           "fb_ref": fb_ref}, FLAGS.min_seconds)
            cells = [f"{measure.format_speedup(measure.speedup(t[ref_case], t[ours_case]))} "
                     f"({t[ours_case].min() * 1e3:.1f} vs {t[ref_case].min() * 1e3:.1f} ms)"
                     for ours_case, ref_case in (("f_ours", "f_ref"), ("fb_ours", "fb_ref"))]
            print(f"| {kind} | {shape} | {policy} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    app.run(main)
