"""The Trainer's code: `run_fn` trains with keras_vit and writes the serving model.

TFX calls `run_fn(fn_args)`. `fn_args.custom_config` holds `keras_vit.training`
`TrainConfig` fields (model, model_overrides, image_size, batch_size, learning_rate,
precision, strategy, ...), plus `model_name`, `code_digest` and `serving_precision`
(the dtype policy of the SavedModel written; None: the training precision).
`fn_args.train_steps` is the number of optimizer updates.
The examples are the pipeline's (`image`, `label`, `source_id`), read with the
same preprocessing and recipes as `python -m keras_vit.train`.
"""

from __future__ import annotations

import dataclasses
import json
import os

from tfx.components.trainer.fn_args_utils import FnArgs

from keras_vit import data, export
from keras_vit import precision
from keras_vit.training import run as training

_NOT_TRAIN_CONFIG = ("model_name", "code_digest", "serving_precision")


def _examples_root(file_patterns):
    # TFX passes `<examples uri>/Split-<name>/*`; the class names sit at the uri.
    return os.path.dirname(os.path.dirname(file_patterns[0]))


def train_config(custom_config: dict, train_steps: int, output_dir: str) -> training.TrainConfig:
    """The run a Trainer with this `custom_config` and `train_steps` does, writing to `output_dir`."""
    config = {k: v for k, v in (custom_config or {}).items() if k not in _NOT_TRAIN_CONFIG}
    known = {f.name for f in dataclasses.fields(training.TrainConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"custom_config keys {unknown} are not TrainConfig fields ({sorted(known)})")
    config.update(dataset=None, train_split="train", eval_split="eval", steps=int(train_steps),
                  epochs=None, output_dir=output_dir, eval_every=0)
    config.setdefault("verbose", 2)
    return training.TrainConfig(**config)


def run_fn(fn_args: FnArgs) -> None:
    from pipeline import components

    class_names = components.read_class_names(_examples_root(fn_args.train_files))
    files = {"train": fn_args.train_files, "eval": fn_args.eval_files}
    source = data.TFRecordSource("pipeline_examples", files, class_names)
    cfg = train_config(fn_args.custom_config, fn_args.train_steps, fn_args.model_run_dir)
    result = training.train(cfg, source=source)
    custom = fn_args.custom_config or {}
    model = result["model_obj"]
    if custom.get("serving_precision") is not None:
        model = precision.to_precision(model, custom["serving_precision"])
    export.write_saved_model(model, fn_args.serving_model_dir, class_names=class_names,
                             model_name=custom.get("model_name", "model"))
    metrics = {k: v for k, v in result.items() if k.startswith("eval_")}
    print(f"Trainer: {json.dumps(metrics)}; serving model ({precision.model_policy(model)}) in "
          f"{fn_args.serving_model_dir}", flush=True)
