"""Few-shot and linear-probe accuracy of a model's frozen features: `python -m keras_vit.evaluate`.

    # An official checkpoint, 1/5/10/25-shot on the offline Fashion-MNIST, 3 seeds.
    python -m keras_vit.evaluate --model=ViT-B_16.npz --image_size=224 \
        --test_examples=2000 --output_json=reports/fewshot.json

    # A trained model, with a linear probe on 5000 training images too.
    python -m keras_vit.evaluate --model=runs/vit/model.keras --linear_probe_examples=5000

Few-shot follows big_vision (`keras_vit.evaluation`). Only the training images the
draws pick have their features extracted (at most shots x classes x seeds), so a
large training split costs one pass over its labels, not over its images.
"""

from __future__ import annotations

import json
import sys
import time

from absl import flags

FLAGS = flags.FLAGS


def define_flags():
    from keras_vit.cli import register_shots_flag
    from keras_vit.precision import PRECISIONS

    flags.DEFINE_string("model", None, "A .keras file, an official .npz or a Hugging Face ViT directory.",
                        required=True)
    flags.DEFINE_integer("image_size", None,
                         "Resolution for a checkpoint (position embeddings are interpolated); "
                         "default the checkpoint's.")
    flags.DEFINE_string("dataset", "fashion_mnist_local", "TFDS name (optionally name/config).")
    flags.DEFINE_string("data_dir", None, "TFDS data directory.")
    flags.DEFINE_string("image_dir", None,
                        "A split/label/image folder (JPEG, PNG, GIF, BMP) instead of --dataset.")
    flags.DEFINE_string("train_split", "train", "Split the shots are drawn from.")
    flags.DEFINE_string("test_split", None, "Split to score on (default: test, else validation).")
    flags.DEFINE_list("shots", ["1", "5", "10", "25"], "Training examples per class, one evaluation each.")
    flags.DEFINE_integer("seeds", 3, "Draws of the shots per count; accuracies are averaged over them.",
                         lower_bound=1)
    flags.DEFINE_integer("test_examples", None,
                         "Score on this many test images, drawn at random with --seed (default: all).",
                         lower_bound=1)
    flags.DEFINE_integer("linear_probe_examples", 0,
                         "Also fit a logistic-regression probe on this many random training images "
                         "(0: no probe).", lower_bound=0)
    flags.DEFINE_float("l2_reg", 2.0 ** 10, "Ridge penalty of the few-shot classifier.", lower_bound=0)
    flags.DEFINE_integer("batch_size", 64, "Images per forward pass.", lower_bound=1)
    flags.DEFINE_enum("precision", "auto", list(PRECISIONS),
                      "Dtype policy of the forward pass; auto picks bf16 on bf16 hardware.")
    flags.DEFINE_integer("seed", 0, "Seed of the test and probe subsets.")
    flags.DEFINE_string("output_json", None, "Also write the results to this JSON file.")
    register_shots_flag("shots")


def main(argv):
    del argv
    from keras_vit import data, storage
    from keras_vit.cli import exit_for_bad_config, load_model_or_exit
    from keras_vit.evaluation import FewShotPlan
    from keras_vit import precision

    data.quiet_info_logs()
    started = time.time()
    try:
        source = data.open_source(FLAGS.dataset, data_dir=FLAGS.data_dir, image_dir=FLAGS.image_dir)
        test_split = data.eval_split(source, FLAGS.test_split, option="--test_split")
        for name, split in (("train_split", FLAGS.train_split), ("test_split", test_split)):
            try:
                source.num_examples(split)
            except (ValueError, KeyError) as e:
                raise ValueError(f"--{name}={split}: {e}") from e
        # Before the model loads: a class with fewer images than the shots fails here.
        plan = FewShotPlan(source, FLAGS.train_split, test_split, [int(k) for k in FLAGS.shots], FLAGS.seeds,
                           FLAGS.test_examples, FLAGS.linear_probe_examples, FLAGS.seed)
    except (ValueError, FileNotFoundError) as e:
        exit_for_bad_config(str(e))
    model = load_model_or_exit(FLAGS.model, FLAGS.image_size)
    policy = precision.resolve_precision(FLAGS.precision)
    if policy != precision.model_policy(model):
        model = precision.with_policy(model, policy)
    print(f"{FLAGS.model}: {model.config.name} at {model.config.image_size}, {policy}; "
          f"{source.name} {FLAGS.train_split} -> {test_split}", file=sys.stderr)
    result = plan.run(model, FLAGS.batch_size, FLAGS.l2_reg, log=lambda m: print(m, file=sys.stderr))
    for k, acc in result["fewshot"].items():
        print(f"{k:>3}-shot: {acc['mean']:.4f} +- {acc['std']:.4f} over {FLAGS.seeds} seeds")
    if result["linear_probe"] is not None:
        print(f"linear probe ({result['linear_probe_examples']} images): {result['linear_probe']:.4f}")
    print(f"on {result['test_examples']} {test_split} images, in {time.time() - started:.0f} s")
    if FLAGS.output_json:
        result.update(model=FLAGS.model, dataset=source.name, train_split=FLAGS.train_split,
                      test_split=test_split, precision=policy)
        storage.write_text(FLAGS.output_json, json.dumps(result, indent=2))
        print(f"Results: {FLAGS.output_json}")


def run():
    """Console entry point; flags are defined here so importing the module defines none."""
    from keras_vit.cli import run_app

    define_flags()
    run_app(main)


if __name__ == "__main__":
    run()
