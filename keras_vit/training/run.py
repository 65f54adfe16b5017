"""One training run: data, model, recipe, strategy and callbacks, resumable after a kill.

The run is cut into chunks of `checkpoint_every` steps, which Keras sees as epochs
of a repeated dataset. BackupAndRestore saves weights and optimizer state after
each chunk, so a run killed at any point restarts from the last chunk boundary
with the learning-rate schedule where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Optional

import keras

from keras_vit import data
from keras_vit.training import distribute, precision, recipes


@dataclasses.dataclass
class TrainConfig:
    model: str = "ViT-Ti/16"
    model_overrides: dict = dataclasses.field(default_factory=dict)
    dataset: Optional[str] = "fashion_mnist_local"
    data_dir: Optional[str] = None
    image_dir: Optional[str] = None
    train_split: str = "train"
    eval_split: Optional[str] = None  # default: test, else validation
    image_size: int = 224
    epochs: Optional[float] = None
    steps: Optional[int] = None  # optimizer updates; overrides epochs
    batch_size: Optional[int] = None  # global; default the recipe's
    recipe: str = "pretrain"
    learning_rate: Optional[float] = None
    weight_decay: Optional[float] = None
    warmup_steps: Optional[int] = None
    decay: Optional[str] = None
    dropout_rate: Optional[float] = None
    label_smoothing: Optional[float] = None
    loss: Optional[str] = None
    weights: Optional[str] = None
    strategy: str = "auto"
    tpu: Optional[str] = None
    precision: str = "auto"
    jit_compile: bool = False
    gradient_accumulation_steps: int = 1
    checkpoint_every: Optional[int] = None  # steps per chunk; default one pass over the data
    output_dir: str = "runs/vit"
    seed: int = 0
    cache: bool = False
    deterministic: bool = False
    skip_bad_records: bool = False
    crop_area_min: float = 0.05
    verbose: int = 1

    def recipe_obj(self) -> recipes.Recipe:
        return recipes.get_recipe(
            self.recipe, learning_rate=self.learning_rate, weight_decay=self.weight_decay,
            warmup_steps=self.warmup_steps, decay=self.decay, dropout_rate=self.dropout_rate,
            label_smoothing=self.label_smoothing, loss=self.loss, batch_size=self.batch_size)


def _resume_point(backup_dir: str) -> Optional[int]:
    path = os.path.join(backup_dir, "training_metadata.json")
    if os.path.exists(path):
        with open(path) as f:
            return int(json.load(f)["epoch"])
    return None


def train(cfg: TrainConfig) -> dict:
    """Trains, evaluates and saves; returns the final metrics and where things went."""
    keras.utils.set_random_seed(cfg.seed)
    policy = precision.set_precision(cfg.precision)
    strategy = distribute.make_strategy(cfg.strategy, tpu=cfg.tpu)
    recipe = cfg.recipe_obj()
    source = data.open_source(cfg.dataset, data_dir=cfg.data_dir, image_dir=cfg.image_dir)
    eval_split = cfg.eval_split or ("test" if "test" in source.splits else "validation")
    accum = max(int(cfg.gradient_accumulation_steps), 1)
    if recipe.batch_size % accum:
        raise ValueError(f"batch_size {recipe.batch_size} is not divisible by gradient_accumulation_steps {accum}")
    micro_batch = recipe.batch_size // accum
    train_examples = source.num_examples(cfg.train_split)
    if cfg.steps:
        total_updates = int(cfg.steps)
    elif cfg.epochs:
        total_updates = max(int(math.ceil(cfg.epochs * train_examples / recipe.batch_size)), 1)
    else:
        raise ValueError("set steps or epochs")
    micro_steps = total_updates * accum
    chunk = int(cfg.checkpoint_every or max(train_examples // micro_batch, 1))
    chunk = min(chunk, micro_steps)
    num_chunks = int(math.ceil(micro_steps / chunk))
    micro_steps = num_chunks * chunk  # whole chunks; the schedule is set for these
    total_updates = micro_steps // accum

    os.makedirs(cfg.output_dir, exist_ok=True)
    paths = {"model": os.path.join(cfg.output_dir, "model.keras"),
             "logs": os.path.join(cfg.output_dir, "logs"),
             "history": os.path.join(cfg.output_dir, "history.csv"),
             "metrics": os.path.join(cfg.output_dir, "metrics.json"),
             "backup": os.path.join(cfg.output_dir, "backup")}
    resume = _resume_point(paths["backup"])
    if resume is not None:
        print(f"Resuming from {paths['backup']}: chunk {resume} of {num_chunks} "
              f"(step {resume * chunk // accum} of {total_updates})", flush=True)

    stats = data.DataStats()
    with strategy.scope():
        import keras_vit

        overrides = dict(cfg.model_overrides)
        overrides.setdefault("dropout_rate", recipe.dropout_rate)
        if recipe.head_bias_init:
            overrides.setdefault("head_bias_init", recipe.head_bias_init)
        if cfg.recipe == "finetune":
            overrides.setdefault("representation_size", None)  # the paper drops it to fine-tune
        model = keras_vit.create_model(cfg.model, num_classes=source.num_classes, image_size=cfg.image_size,
                                       weights=cfg.weights, **overrides)
        recipes.compile_model(model, recipe, total_updates, jit_compile=cfg.jit_compile,
                              gradient_accumulation_steps=accum if accum > 1 else None)
    channels = model.config.num_channels
    train_ds = data.make_dataset(source, cfg.train_split, image_size=cfg.image_size, batch_size=micro_batch,
                                 training=True, channels=channels, cache=cfg.cache, seed=cfg.seed,
                                 deterministic=cfg.deterministic, skip_bad_records=cfg.skip_bad_records,
                                 stats=stats, crop_area=(cfg.crop_area_min, 1.0))
    eval_ds = data.make_dataset(source, eval_split, image_size=cfg.image_size, batch_size=max(micro_batch, 64),
                                training=False, channels=channels, cache=cfg.cache,
                                deterministic=cfg.deterministic)
    callbacks = [
        keras.callbacks.BackupAndRestore(paths["backup"], save_freq="epoch", delete_checkpoint=False),
        keras.callbacks.TensorBoard(paths["logs"], update_freq=max(chunk // 10, 1)),
        keras.callbacks.CSVLogger(paths["history"], append=True),
        keras.callbacks.TerminateOnNaN(),
    ]
    print(f"Training {model.config.name} ({model.count_params():,} params, {policy}) on {source.name} "
          f"{cfg.train_split}: {total_updates} steps of batch {recipe.batch_size}"
          + (f" ({accum} x {micro_batch})" if accum > 1 else "")
          + f", {num_chunks} chunks of {chunk}, {strategy.num_replicas_in_sync} replica(s)", flush=True)
    start = time.time()
    model.fit(train_ds, epochs=num_chunks, steps_per_epoch=chunk, validation_data=eval_ds,
              callbacks=callbacks, verbose=cfg.verbose)
    seconds = time.time() - start
    results = model.evaluate(eval_ds, return_dict=True, verbose=0)
    results = {k: float(v) for k, v in results.items()}
    model.save(paths["model"])
    summary = {"model": model.config.name, "dataset": source.name, "eval_split": eval_split,
               "steps": total_updates, "batch_size": recipe.batch_size, "precision": policy,
               "train_seconds": round(seconds, 1), "skipped_records": stats.skipped_count,
               **{f"eval_{k}": v for k, v in results.items()}, "paths": paths}
    with open(paths["metrics"], "w") as f:
        json.dump(summary, f, indent=2)
    summary["model_obj"] = model
    return summary
