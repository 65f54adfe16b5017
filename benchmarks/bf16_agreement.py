"""Does a float32-trained model keep its predictions under mixed_bfloat16, and what does bf16 buy?

    python -m keras_vit.train ... --output_dir=runs/fmnist       # the README's Fashion-MNIST run
    python -m benchmarks.bf16_agreement --model=runs/fmnist/model.keras

Loads a trained `model.keras`, builds its mixed_bfloat16 twin with the same weights
(`keras_vit.training.precision.with_policy`), and on a fixed evaluation split prints
how often the two pick the same class (the issue's bar: at least 99%), each one's
top-1, the largest logit difference, and each one's images/s side by side.
Figures, never assertions.
"""

from __future__ import annotations

import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "runs/fmnist/model.keras", "A trained keras_vit .keras file.")
flags.DEFINE_string("dataset", "fashion_mnist_local", "TFDS name of the evaluation data.")
flags.DEFINE_string("data_dir", None, "TFDS data_dir.")
flags.DEFINE_string("split", "test", "Evaluation split (e.g. 'test[:2000]').")
flags.DEFINE_integer("batch_size", 256, "Images per forward pass.")
flags.DEFINE_string("policy", "mixed_bfloat16", "The dtype policy to compare with the model's own.")


def _images_per_second(model, images, batch_size):
    model.predict(images[:batch_size], batch_size=batch_size, verbose=0)  # trace
    start = time.perf_counter()
    model.predict(images, batch_size=batch_size, verbose=0)
    return len(images) / (time.perf_counter() - start)


def main(argv):
    del argv
    import keras

    import keras_vit  # noqa: F401  (registers the saved model's classes)
    from keras_vit import data
    from keras_vit.hardware import has_fast_bf16_cpu
    from keras_vit.training.precision import top1_agreement, with_policy

    data.quiet_info_logs()
    model = keras.saving.load_model(FLAGS.model)
    twin = with_policy(model, FLAGS.policy)
    cfg = model.config
    source = data.open_source(FLAGS.dataset, data_dir=FLAGS.data_dir)
    ds = data.make_dataset(source, FLAGS.split, image_size=cfg.image_size, batch_size=FLAGS.batch_size,
                           training=False, channels=cfg.num_channels)
    images = np.concatenate([x.numpy() for x, _ in ds])
    labels = np.concatenate([y.numpy() for _, y in ds])
    print(f"{FLAGS.model}: {cfg.name}, {len(images)} images of {FLAGS.dataset} {FLAGS.split}", flush=True)
    agreement, ours, theirs = top1_agreement(model, twin, images, FLAGS.batch_size)
    print(f"top-1 agreement float32 vs {FLAGS.policy}: {agreement:.2%} "
          f"({int(round((1 - agreement) * len(images)))} of {len(images)} differ)")
    print(f"test top-1: float32 {np.mean(ours.argmax(-1) == labels):.2%}, "
          f"{FLAGS.policy} {np.mean(theirs.argmax(-1) == labels):.2%}")
    print(f"largest |logit difference|: {np.abs(ours - theirs).max():.4f}")
    fast = "yes" if has_fast_bf16_cpu() else "no (bf16 is emulated)"
    f32 = _images_per_second(model, images, FLAGS.batch_size)
    bf16 = _images_per_second(twin, images, FLAGS.batch_size)
    print(f"images/s: float32 {f32:.0f}, {FLAGS.policy} {bf16:.0f} ({bf16 / f32:.2f}x); "
          f"AMX/AVX512-BF16 on this CPU: {fast}")


if __name__ == "__main__":
    app.run(main)
