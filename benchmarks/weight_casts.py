"""What the per-call weight casts of a mixed-precision model cost in inference.

    make bench BENCH=weight_casts
    python -m benchmarks.weight_casts --models=ViT-B/16 --batch_sizes=1 --policy=mixed_bfloat16

Under a mixed policy every layer keeps float32 weights and casts them to the compute
dtype at each call: for ViT-B/16, 86M weights read and written once per forward pass,
whatever the batch. `keras_vit.compute_dtype_twin(model)` holds them already cast. For
each model and batch size this times `predict_step` (what `model.predict` runs) of the
mixed model and of its twin, interleaved in one process, and prints ms per call, the
twin's speedup and the largest output difference (0: the twin computes the same
numbers). Figures, never assertions.
"""

from __future__ import annotations

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["ViT-Ti/16", "ViT-S/16", "ViT-B/16"], "Registered model names.")
flags.DEFINE_list("batch_sizes", ["1", "32"], "Images per call.")
flags.DEFINE_enum("policy", "mixed_bfloat16", ["mixed_bfloat16", "mixed_float16"],
                  "A mixed Keras dtype policy.")
flags.DEFINE_integer("image_size", 224, "Resolution.")
flags.DEFINE_float("min_seconds", 6.0, "Time each pair for at least this long (and 3 calls each).")


def main(argv):
    del argv
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from benchmarks import measure

    policy = keras.DTypePolicy(FLAGS.policy)
    rows = []
    for name in FLAGS.models:
        mixed = measure.fresh_models(
            lambda: {"mixed": keras_vit.create_model(name, num_classes=1000, image_size=FLAGS.image_size)},
            FLAGS.policy)["mixed"]
        twin = keras_vit.compute_dtype_twin(mixed)
        for batch in (int(b) for b in FLAGS.batch_sizes):
            print(f"{name}, batch {batch}: timing {FLAGS.policy} and its {policy.compute_dtype} twin...",
                  flush=True)
            images = tf.random.uniform([batch, FLAGS.image_size, FLAGS.image_size, 3], -1.0, 1.0)
            calls = {"mixed": measure.model_call(mixed, images, None),
                     "twin": measure.model_call(twin, images, None)}
            diff = float(np.abs(calls["mixed"]().numpy() - calls["twin"]().numpy()).max())
            t = measure.interleaved_times(calls, FLAGS.min_seconds)
            faster = measure.format_speedup(measure.speedup(t["mixed"], t["twin"]))
            rows.append(f"| {name} | {batch} | {t['mixed'].min() * 1e3:.1f} | {t['twin'].min() * 1e3:.1f} | "
                        f"{faster} | {diff:g} |")
    print(f"\n{FLAGS.policy} inference, {FLAGS.image_size} px, predict_step, ms per call:")
    print(f"| model | batch | {FLAGS.policy} | {policy.compute_dtype} weights | speedup (90% interval) "
          "| max |difference| |\n|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)
