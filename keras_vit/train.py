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

import os
import sys

from absl import flags

FLAGS = flags.FLAGS


def define_flags():
    from keras_vit import cli
    from keras_vit.training import TrainConfig

    # One flag per TrainConfig field (its help text is the field's), shown by --helpshort
    # as this tool's own; then the CLI's own.
    cli.define_config_flags(TrainConfig)
    flags.adopt_module_key_flags(cli)
    flags.DEFINE_string("export_dir", None, "Also export a TF Serving SavedModel under this base dir.")


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
    from keras_vit.cli import config_from_flags, exit_for_bad_config
    from keras_vit.data import quiet_info_logs
    from keras_vit.training import ConfigError, TrainConfig, train

    quiet_info_logs()

    # A progress bar redraws itself with escape codes: a log file gets one line per chunk.
    cfg = config_from_flags(TrainConfig, image_size=_image_size(FLAGS.image_size, FLAGS.model),
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
        # One write, not sys.exit's line by line: libjpeg's warnings from decoder threads
        # still running go to the same stream and could land between the two lines.
        sys.stderr.write(f"bad record: {bad_record(e)}\n"
                         "--skip_bad_records drops and counts bad training records instead.\n")
        sys.stderr.flush()
        sys.exit(1)
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
