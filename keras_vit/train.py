"""Train or fine-tune a ViT with model.fit: `python -m keras_vit.train`.

    # From scratch on the offline Fashion-MNIST (docs/training.md has the measured figures).
    python -m keras_vit.train --model=FMNIST-ViT --epochs=10 --batch_size=256 --output_dir=runs/fmnist

    # Fine-tune an official checkpoint at 384 px.
    python -m keras_vit.train --recipe=finetune --weights=ViT-B_16.npz --model=ViT-B/16 \
        --dataset=cifar10 --image_size=384 --steps=10000

Batch sizes are global. A killed run resumes from its last checkpoint when started
again with the same --output_dir.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags

FLAGS = flags.FLAGS


def define_flags():
    from keras_vit.cli import register_json_object_flag, register_shots_flag
    from keras_vit.precision import PRECISIONS
    from keras_vit.training import RECIPES, STRATEGIES

    flags.DEFINE_string("model", "ViT-Ti/16", "Registered model name, or a ViTConfig JSON file.")
    flags.DEFINE_string("model_overrides", "{}", "JSON dict of config fields, e.g. '{\"patch_size\": 4}'.")
    register_json_object_flag("model_overrides")
    flags.DEFINE_string("dataset", "fashion_mnist_local", "TFDS name (optionally name/config).")
    flags.DEFINE_string("data_dir", None, "TFDS data directory.")
    flags.DEFINE_string("image_dir", None,
                        "A split/label/image folder (JPEG, PNG, GIF, BMP) instead of --dataset.")
    flags.DEFINE_string("train_split", "train", "TFDS split to train on, e.g. 'train[:90%]'.")
    flags.DEFINE_string("eval_split", None, "Split to evaluate on (default: test, else validation).")
    flags.DEFINE_integer("image_size", None, "Training resolution (a multiple of the patch stride); default: "
                         "the model's own (224 for the paper's models, 28 for FMNIST-ViT).")
    flags.DEFINE_float("epochs", None, "Passes over the training split.")
    flags.DEFINE_integer("steps", None, "Optimizer updates (overrides --epochs).")
    flags.DEFINE_integer("batch_size", None, "Global batch size (default: the recipe's).")
    flags.DEFINE_enum("recipe", "pretrain", list(RECIPES), "The paper's recipe.")
    flags.DEFINE_float("learning_rate", None, "Peak learning rate (default: the recipe's).")
    flags.DEFINE_float("weight_decay", None, "Decoupled weight decay on kernels.")
    flags.DEFINE_integer("warmup_steps", None, "Linear warmup steps.")
    flags.DEFINE_enum("decay", None, ["linear", "cosine"], "Decay after warmup.")
    flags.DEFINE_float("dropout_rate", None, "Dropout (default: the recipe's).")
    flags.DEFINE_float("label_smoothing", None, "Label smoothing.")
    flags.DEFINE_enum("loss", None, ["softmax", "sigmoid"], "Cross-entropy kind.")
    flags.DEFINE_string("weights", None, "Checkpoint to start from: an .npz or Hugging Face directory, or "
                        "pretrained weights by name or tag (python -m keras_vit.zoo --pretrained).")
    flags.DEFINE_enum("strategy", "auto", list(STRATEGIES), "tf.distribute strategy.")
    flags.DEFINE_string("tpu", None, "TPU name or grpc:// address for --strategy=tpu ('local' on a TPU VM).")
    flags.DEFINE_string("tpu_zone", None, "GCE zone of a Cloud TPU named by --tpu (default: from metadata).")
    flags.DEFINE_string("tpu_project", None,
                        "GCP project of a Cloud TPU named by --tpu (default: from metadata).")
    flags.DEFINE_enum("precision", "auto", list(PRECISIONS),
                      "Dtype policy; auto picks bf16 on bf16 hardware.")
    flags.DEFINE_bool("jit_compile", False, "XLA-compile the train step.")
    flags.DEFINE_integer("grad_accum", 1, "Gradient accumulation: micro-batches per update.")
    flags.DEFINE_integer("checkpoint_every", None, "Steps between checkpoints (default: one pass).")
    flags.DEFINE_integer("eval_every", 1, "Validate every N checkpoints; 0: only at the end.")
    flags.DEFINE_integer("fewshot_every", 0,
                         "Few-shot accuracy of the features on the eval split after the first checkpoint, "
                         "every N and the last, logged as fewshot_<k>shot (0: never).")
    flags.DEFINE_list("fewshot_shots", ["1", "5", "10", "25"], "Shot counts for --fewshot_every.")
    register_shots_flag("fewshot_shots")
    flags.DEFINE_string("output_dir", "runs/vit", "Where the model, logs and metrics go.")
    flags.DEFINE_string("export_dir", None, "Also export a TF Serving SavedModel under this base dir.")
    flags.DEFINE_integer("seed", 0, "Random seed.")
    flags.DEFINE_bool("cache", False, "Cache the encoded dataset in memory.")
    flags.DEFINE_bool("deterministic", False, "Deterministic input order and augmentation.")
    flags.DEFINE_bool("skip_bad_records", False,
                      "Drop and count bad training records instead of failing (bad evaluation records "
                      "still fail).")
    flags.DEFINE_float("crop_area_min", 0.05,
                       "Smallest Inception-crop area (the paper's 0.05; larger for tiny images).")


def _image_size(flag, model) -> int:
    # The model's own resolution when the flag is not given; a model name that does not
    # resolve keeps 224, and the config's checks name the problem.
    if flag is not None:
        return flag
    from keras_vit import configs

    try:
        height, width = configs.model_config(model).image_size if model else (224, 224)
    except (ValueError, OSError, TypeError):
        return 224
    return height if height == width else 224


def main(argv):
    del argv
    from keras_vit.cli import exit_for_bad_config
    from keras_vit.data import quiet_info_logs
    from keras_vit.training import ConfigError, TrainConfig, train

    quiet_info_logs()

    cfg = TrainConfig(
        model=FLAGS.model, model_overrides=json.loads(FLAGS.model_overrides), dataset=FLAGS.dataset,
        data_dir=FLAGS.data_dir, image_dir=FLAGS.image_dir, train_split=FLAGS.train_split,
        eval_split=FLAGS.eval_split, image_size=_image_size(FLAGS.image_size, FLAGS.model),
        epochs=FLAGS.epochs, steps=FLAGS.steps,
        batch_size=FLAGS.batch_size, recipe=FLAGS.recipe, learning_rate=FLAGS.learning_rate,
        weight_decay=FLAGS.weight_decay, warmup_steps=FLAGS.warmup_steps, decay=FLAGS.decay,
        dropout_rate=FLAGS.dropout_rate, label_smoothing=FLAGS.label_smoothing, loss=FLAGS.loss,
        weights=FLAGS.weights, strategy=FLAGS.strategy, tpu=FLAGS.tpu, tpu_zone=FLAGS.tpu_zone,
        tpu_project=FLAGS.tpu_project, precision=FLAGS.precision,
        jit_compile=FLAGS.jit_compile, gradient_accumulation_steps=FLAGS.grad_accum,
        checkpoint_every=FLAGS.checkpoint_every, output_dir=FLAGS.output_dir, seed=FLAGS.seed,
        cache=FLAGS.cache, deterministic=FLAGS.deterministic, skip_bad_records=FLAGS.skip_bad_records,
        crop_area_min=FLAGS.crop_area_min, eval_every=FLAGS.eval_every, fewshot_every=FLAGS.fewshot_every,
        fewshot_shots=tuple(int(k) for k in FLAGS.fewshot_shots),
        # A progress bar redraws itself with escape codes: a log file gets one line per chunk.
        verbose=1 if sys.stdout.isatty() else 2)
    import tensorflow as tf

    from keras_vit.data import bad_record

    try:
        summary = train(cfg)
    except ConfigError as e:
        exit_for_bad_config(str(e))
    except tf.errors.InvalidArgumentError as e:
        if bad_record(e) is None:
            raise
        sys.exit(f"bad record: {bad_record(e)}\n"
                 "--skip_bad_records drops and counts bad training records instead.")
    model = summary.pop("model_obj")
    paths = summary["paths"]
    print(f"eval {summary['eval_split']}: top-1 {summary['eval_top1']:.4f}, top-5 {summary['eval_top5']:.4f} "
          f"after {summary['steps']} steps in {summary['train_seconds']:.0f} s")
    if "fewshot" in summary:
        print("few-shot on " + summary["eval_split"] + ": "
              + ", ".join(f"{k}-shot {v['mean']:.4f}" for k, v in summary["fewshot"].items()))
    print(f"Model: {paths['model']}\nLogs (TensorBoard): {paths['logs']}\nHistory: {paths['history']}\n"
          f"Metrics: {paths['metrics']}")
    if FLAGS.export_dir:
        from keras_vit import data
        from keras_vit.export import export_saved_model

        source = data.open_source(cfg.dataset, data_dir=cfg.data_dir, image_dir=cfg.image_dir)
        out = export_saved_model(model, os.path.join(FLAGS.export_dir, model.name),
                                 class_names=source.class_names)
        print(f"SavedModel: {out}")


def run():
    from keras_vit.cli import run_app

    define_flags()
    run_app(main)


if __name__ == "__main__":
    run()
