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
import warnings
from typing import List, Optional, Tuple

import keras

from keras_vit import configs, data, flops, hardware, pretrained, storage
from keras_vit.evaluation import FewShotPlan
from keras_vit import precision
from keras_vit.training import distribute, recipes
from keras_vit.training.clock import TrainingClock
from keras_vit.training.csv_history import CSVHistory
from keras_vit.training.fewshot import FewShotCallback


RUN_IDENTITY = "run.json"  # in the backup directory: what its checkpoints are of


class ConfigError(ValueError):
    """A training config that cannot work; the message names every problem, one per line."""


def _flag(default=None, help=None, **cli):
    """A field that `python -m keras_vit.train` offers as a flag (`cli.define_config_flags`):
    `help` is its text; `cli` may rename it (`flag=`), restrict it (`choices=`) or give
    the command line its own default (`flag_default=`)."""
    if isinstance(default, dict):  # mutable: each config its own copy
        return dataclasses.field(default_factory=lambda: dict(default), metadata={"help": help, **cli})
    return dataclasses.field(default=default, metadata={"help": help, **cli})


@dataclasses.dataclass
class TrainConfig:
    """Everything one training run needs; each field with help text is also a flag of
    `python -m keras_vit.train`, of the same name unless it says otherwise."""

    model: str = _flag("ViT-Ti/16", "Registered model name, or a ViTConfig JSON file.")
    model_overrides: dict = _flag({}, "JSON dict of config fields, e.g. '{\"patch_size\": 4}'.")
    dataset: Optional[str] = _flag("fashion_mnist_local", "TFDS name (optionally name/config).")
    data_dir: Optional[str] = _flag(None, "TFDS data directory.")
    image_dir: Optional[str] = _flag(
        None, "A split/label/image folder (JPEG, PNG, GIF, BMP) instead of --dataset.")
    train_split: str = _flag("train", "TFDS split to train on, e.g. 'train[:90%]'.")
    eval_split: Optional[str] = _flag(None, "Split to evaluate on (default: test, else validation).")
    image_size: int = _flag(224, "Training resolution (a multiple of the patch stride); default: the "
                            "model's own (224 for the paper's models, 28 for FMNIST-ViT).", flag_default=None)
    epochs: Optional[float] = _flag(None, "Passes over the training split.")
    steps: Optional[int] = _flag(None, "Optimizer updates (overrides --epochs).")
    batch_size: Optional[int] = _flag(None, "Global batch size (default: the recipe's).")
    recipe: str = _flag("pretrain", "The paper's recipe.", choices=tuple(recipes.RECIPES))
    learning_rate: Optional[float] = _flag(None, "Peak learning rate (default: the recipe's).")
    weight_decay: Optional[float] = _flag(None, "Decoupled weight decay on kernels.")
    warmup_steps: Optional[int] = _flag(None, "Linear warmup steps.")
    decay: Optional[str] = _flag(None, "Decay after warmup.", choices=recipes.DECAYS)
    dropout_rate: Optional[float] = _flag(None, "Dropout (default: the recipe's).")
    label_smoothing: Optional[float] = _flag(None, "Label smoothing.")
    loss: Optional[str] = _flag(None, "Cross-entropy kind.", choices=recipes.LOSSES)
    weights: Optional[str] = _flag(None, "Checkpoint to start from: an .npz or Hugging Face directory, or "
                                   "pretrained weights by name or tag "
                                   "(python -m keras_vit.zoo --pretrained).")
    strategy: str = _flag("auto", "tf.distribute strategy.", choices=distribute.STRATEGIES)
    tpu: Optional[str] = _flag(None, "TPU name or grpc:// address for --strategy=tpu "
                               "('local' on a TPU VM).")
    tpu_zone: Optional[str] = _flag(None, "GCE zone of a Cloud TPU named by --tpu (default: from metadata).")
    tpu_project: Optional[str] = _flag(None, "GCP project of a Cloud TPU named by --tpu "
                                       "(default: from metadata).")
    precision: str = _flag("auto", "Dtype policy; auto picks bf16 on bf16 hardware.",
                           choices=precision.PRECISIONS)
    jit_compile: bool = _flag(False, "XLA-compile the train step.")
    gradient_accumulation_steps: int = _flag(1, "Gradient accumulation: micro-batches per update.",
                                             flag="grad_accum")
    checkpoint_every: Optional[int] = _flag(None, "Steps between checkpoints (default: one pass).")
    output_dir: str = _flag("runs/vit", "Where the model, logs and metrics go.")
    seed: int = _flag(0, "Random seed.")
    cache: bool = _flag(False, "Cache the encoded dataset in memory.")
    deterministic: bool = _flag(False, "Deterministic input order and augmentation.")
    skip_bad_records: bool = _flag(False, "Drop and count bad training records instead of failing (bad "
                                   "evaluation records still fail).")
    crop_area_min: float = _flag(0.05, "Smallest Inception-crop area (the paper's 0.05; larger for "
                                 "tiny images).")
    eval_every: int = _flag(1, "Validate every N checkpoints; 0: only at the end.")
    fewshot_every: int = _flag(0, "Few-shot accuracy of the features on the eval split after the first "
                               "checkpoint, every N and the last, logged as fewshot_<k>shot (0: never).")
    fewshot_shots: Tuple[int, ...] = _flag((1, 5, 10, 25), "Shot counts for --fewshot_every.")
    fewshot_test_examples: int = _flag(1000, "Few-shot test images: a fixed random subset of the eval split.")
    verbose: int = 1  # Keras's fit verbosity; the CLI picks it from its terminal

    def recipe_obj(self) -> recipes.Recipe:
        return recipes.get_recipe(
            self.recipe, learning_rate=self.learning_rate, weight_decay=self.weight_decay,
            warmup_steps=self.warmup_steps, decay=self.decay, dropout_rate=self.dropout_rate,
            label_smoothing=self.label_smoothing, loss=self.loss, batch_size=self.batch_size)

    def validate(self, check_model: bool = True, check_paths: bool = True) -> None:
        """Raises ConfigError naming every field that cannot work, before data or a model is touched.

        `check_model=False` leaves out `model` and `model_overrides` (for a caller's own
        model builder). `check_paths=False` leaves out whether `weights` exists on this
        machine (for a pipeline compiled here and run elsewhere).
        """
        problems = []

        def need(ok, message):
            if not ok:
                problems.append(message)

        if self.steps is None and self.epochs is None:
            problems.append("set steps or epochs (how long to train)")
        need(self.steps is None or self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        need(self.epochs is None or self.epochs > 0, f"epochs must be > 0, got {self.epochs}")
        need(self.precision in precision.PRECISIONS,
             f"precision must be one of {precision.PRECISIONS}, got {self.precision!r}")
        need(self.strategy in distribute.STRATEGIES,
             f"strategy must be one of {distribute.STRATEGIES}, got {self.strategy!r}")
        need(self.gradient_accumulation_steps >= 1,
             f"gradient_accumulation_steps must be >= 1, got {self.gradient_accumulation_steps}")
        need(self.checkpoint_every is None or self.checkpoint_every >= 1,
             f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        need(self.eval_every >= 0, f"eval_every must be >= 0 (0: only at the end), got {self.eval_every}")
        need(0 < self.crop_area_min <= 1, f"crop_area_min must be in (0, 1], got {self.crop_area_min}")
        need(self.fewshot_every >= 0, f"fewshot_every must be >= 0 (0: never), got {self.fewshot_every}")
        if self.fewshot_every:
            need(len(self.fewshot_shots) > 0 and all(int(k) >= 1 for k in self.fewshot_shots),
                 f"fewshot_shots must be positive shot counts, got {self.fewshot_shots}")
            need(self.fewshot_test_examples >= 1,
                 f"fewshot_test_examples must be >= 1, got {self.fewshot_test_examples}")
        try:
            recipe = self.recipe_obj()
        except ValueError as e:
            problems.append(str(e))
        else:
            accum = self.gradient_accumulation_steps
            need(accum < 1 or recipe.batch_size % accum == 0,
                 f"batch_size {recipe.batch_size} is not divisible by gradient_accumulation_steps {accum}")
        if check_model:
            if not isinstance(self.model_overrides, dict):
                problems.append(
                    f"model_overrides must be a dict of config fields, got {self.model_overrides!r}")
            elif (self.model is not None or not self.weights) and not (
                    isinstance(self.model, str) and pretrained.names_weights(self.model)):
                try:
                    configs.model_config(self.model).replace(image_size=self.image_size,
                                                             **self.model_overrides)
                except (ValueError, TypeError, OSError) as e:
                    problems.append(f"model {self.model!r}: {e}")
        if check_paths and self.weights and "://" not in self.weights and not pretrained.names_weights(
                self.weights, self.model if isinstance(self.model, str) else None):
            need(storage.exists(self.weights), f"weights {self.weights} not found (nor a pretrained name: "
                                               "python -m keras_vit.zoo --pretrained)")
        if problems:
            raise ConfigError("bad training config:\n  " + "\n  ".join(problems))


def _resume_point(backup_dir: str) -> Optional[int]:
    path = storage.join(backup_dir, "training_metadata.json")
    if storage.exists(path):
        return int(json.loads(storage.read_text(path))["epoch"])
    return None


def _differences(old, new, prefix="") -> List[str]:
    """'key: old -> new' for each leaf where two JSON-like values differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new))
                for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix[:-1]} {json.dumps(old)} -> {json.dumps(new)}"]


def _check_same_run(backup_dir: str, identity: dict, resume: Optional[int]) -> None:
    """Records what the checkpoints in `backup_dir` are of, or refuses to resume another run from them.

    Keras would load the weights of another model with an error about variable
    counts, and another schedule or chunking without one.
    """
    path = storage.join(backup_dir, RUN_IDENTITY)
    identity = json.loads(json.dumps(identity))
    if resume is None:
        storage.write_text(path, json.dumps(identity, indent=2, sort_keys=True))
        return
    if not storage.exists(path):  # a backup written before this check
        return
    recorded = json.loads(storage.read_text(path))
    differences = _differences(recorded, identity)
    if differences:
        chunks = (recorded["steps"] * recorded["gradient_accumulation_steps"]
                  // recorded["micro_steps_per_chunk"])
        raise ConfigError(
            f"{storage.parent(backup_dir)} holds the checkpoint of another run (after chunk {resume} of "
            f"{chunks}), so this one cannot resume from it. It differs in:\n  " + "\n  ".join(differences)
            + "\nStart it with the settings it had to resume it, or give another output_dir to start afresh.")


def train(cfg: TrainConfig, source=None, build_model=None) -> dict:
    """Trains, evaluates and saves; returns the final metrics and where things went.

    `source` (a `data.Source` or `data.TFRecordSource`) replaces the dataset the
    config names, e.g. the TFX pipeline's examples. `build_model(num_classes,
    image_size)` replaces `cfg.model` with any Keras classifier of `[B, H, W, C]`
    images in [-1, 1] to logits (a CNN baseline, say); it is called in the
    strategy's scope.
    """
    cfg.validate(check_model=build_model is None)
    keras.utils.set_random_seed(cfg.seed)
    policy = precision.set_precision(cfg.precision)
    strategy = distribute.make_strategy(cfg.strategy, tpu=cfg.tpu, tpu_zone=cfg.tpu_zone,
                                        tpu_project=cfg.tpu_project)
    recipe = cfg.recipe_obj()
    if source is None:
        source = data.open_source(cfg.dataset, data_dir=cfg.data_dir, image_dir=cfg.image_dir)
    eval_split = data.eval_split(source, cfg.eval_split)
    accum = int(cfg.gradient_accumulation_steps)
    micro_batch = recipe.batch_size // accum
    train_examples = source.num_examples(cfg.train_split)
    if not train_examples:
        raise ValueError(f"{source.name} {cfg.train_split} has no records to train on")
    fewshot_plan = None
    if cfg.fewshot_every:
        try:  # draws the shots now: a split too small for them fails before training
            fewshot_plan = FewShotPlan(source, cfg.train_split, eval_split, cfg.fewshot_shots,
                                       test_examples=cfg.fewshot_test_examples, seed=cfg.seed)
        except ValueError as e:
            raise ConfigError(f"bad training config:\n  fewshot_shots {tuple(cfg.fewshot_shots)}: {e}") from e
    if cfg.steps:
        total_updates = int(cfg.steps)
    else:
        # An epoch is the whole batches of one pass (the last partial batch is dropped).
        total_updates = max(int(round(cfg.epochs * (train_examples // recipe.batch_size))), 1)
    micro_steps = total_updates * accum
    chunk = int(cfg.checkpoint_every or max(train_examples // micro_batch, 1))
    num_chunks = int(math.ceil(micro_steps / min(chunk, micro_steps)))
    if not cfg.checkpoint_every:
        # Equal chunks that add up to the run (one step short of a pass at most).
        chunk = int(math.ceil(micro_steps / num_chunks))
    chunk = int(math.ceil(chunk / accum)) * accum  # whole updates per chunk
    micro_steps = num_chunks * chunk  # the schedule is set for exactly these
    total_updates = micro_steps // accum

    storage.check(cfg.output_dir)
    storage.makedirs(cfg.output_dir)
    paths = {name: storage.join(cfg.output_dir, leaf) for name, leaf in (
        ("model", "model.keras"), ("logs", "logs"), ("history", "history.csv"), ("metrics", "metrics.json"),
        ("backup", "backup"))}
    resume = _resume_point(paths["backup"])

    stats = data.DataStats()
    with strategy.scope():
        import keras_vit

        overrides = dict(cfg.model_overrides)
        overrides.setdefault("dropout_rate", recipe.dropout_rate)
        if recipe.head_bias_init:
            overrides.setdefault("head_bias_init", recipe.head_bias_init)
        if cfg.recipe == "finetune":
            overrides.setdefault("representation_size", None)  # the paper drops it to fine-tune
        if build_model is not None:
            model = build_model(source.num_classes, cfg.image_size)
        else:
            model = keras_vit.create_model(cfg.model, num_classes=source.num_classes,
                                           image_size=cfg.image_size, weights=cfg.weights, **overrides)
        recipes.compile_model(model, recipe, total_updates, jit_compile=cfg.jit_compile,
                              gradient_accumulation_steps=accum if accum > 1 else None)
    _check_same_run(paths["backup"], {
        "model": model.config.to_dict() if hasattr(model, "config") else model.name,
        "recipe": dataclasses.asdict(recipe), "steps": total_updates, "micro_steps_per_chunk": chunk,
        "gradient_accumulation_steps": accum, "precision": policy, "dataset": source.name,
        "train_split": cfg.train_split, "image_size": cfg.image_size}, resume)
    if resume is not None:
        print(f"Resuming from {paths['backup']}: chunk {resume} of {num_chunks} "
              f"(step {resume * chunk // accum} of {total_updates})", flush=True)
    channels = int(model.inputs[0].shape[-1])
    model_name = model.config.name if hasattr(model, "config") else model.name
    train_ds = data.make_dataset(source, cfg.train_split, image_size=cfg.image_size, batch_size=micro_batch,
                                 training=True, channels=channels, cache=cfg.cache, seed=cfg.seed,
                                 deterministic=cfg.deterministic, skip_bad_records=cfg.skip_bad_records,
                                 stats=stats, crop_area=(cfg.crop_area_min, 1.0))
    eval_ds = data.make_dataset(source, eval_split, image_size=cfg.image_size,
                                batch_size=max(micro_batch, 64), training=False, channels=channels,
                                cache=cfg.cache, deterministic=cfg.deterministic)
    fewshot = (FewShotCallback(fewshot_plan, every=cfg.fewshot_every, batch_size=max(micro_batch, 64))
               if fewshot_plan else None)
    clock = TrainingClock(paths["backup"], resumed=resume is not None)
    callbacks = [
        *([fewshot] if fewshot else []),  # first, so that the loggers below record its scores
        keras.callbacks.BackupAndRestore(paths["backup"], save_freq="epoch", delete_checkpoint=False),
        clock,  # after the checkpoint it times
        keras.callbacks.TensorBoard(paths["logs"], update_freq=max(chunk // 10, 1)),
        CSVHistory(paths["history"]),
        keras.callbacks.TerminateOnNaN(),
    ]
    # The registry name alone would call a 141k-parameter variant "ViT-Ti/16".
    changed = "".join(f", {k}={v}" for k, v in cfg.model_overrides.items())
    print(f"Training {model_name} ({model.count_params():,} params{changed}, {policy}) on {source.name} "
          f"{cfg.train_split}: {total_updates} steps of batch {recipe.batch_size}"
          + (f" ({accum} x {micro_batch})" if accum > 1 else "")
          + f", {num_chunks} chunks of {chunk}, {strategy.num_replicas_in_sync} replica(s)", flush=True)
    # Validate every `eval_every` chunks and always after the last one.
    every = range(cfg.eval_every, num_chunks + 1, cfg.eval_every) if cfg.eval_every > 0 else ()
    validation_freq = sorted({*every, num_chunks})
    with warnings.catch_warnings():
        # Keras's words when the training split runs dry, which is reported below with
        # its reason.
        warnings.filterwarnings("ignore", message="Your input ran out of data", category=UserWarning)
        # shuffle=False: train_ds is shuffled already, and Keras 3.15 warns at each fit of a
        # dataset under the default shuffle=True that it ignores it.
        history = model.fit(train_ds, epochs=num_chunks, steps_per_epoch=chunk, validation_data=eval_ds,
                            validation_freq=validation_freq, callbacks=callbacks, verbose=cfg.verbose,
                            shuffle=False)
    seconds = clock.seconds
    logs = history.history
    # Keras ends fit with no error when TerminateOnNaN fires or the data runs out (then
    # a chunk logs no training loss); neither model is worth evaluating or saving.
    if model.stop_training:
        raise FloatingPointError(
            f"the loss became NaN or infinite in chunk {history.epoch[-1] + 1} of {num_chunks}; nothing "
            f"was saved. The checkpoint in {paths['backup']} holds that state, so start again with "
            "another output_dir (with a lower learning rate, more warmup or float32).")
    if len(logs.get("loss", ())) < len(history.epoch):
        raise RuntimeError(
            f"{source.name} {cfg.train_split} gave no training batch"
            + (" (every record was skipped as bad)" if cfg.skip_bad_records else ""))
    if logs.get("val_loss") and len(history.epoch) and history.epoch[-1] == num_chunks - 1:
        results = {k[len("val_"):]: float(v[-1]) for k, v in logs.items() if k.startswith("val_")}
    else:  # nothing left to train (a finished run started again): evaluate what was saved
        results = {k: float(v) for k, v in model.evaluate(eval_ds, return_dict=True, verbose=0).items()}
    model.save(paths["model"])
    config = getattr(model, "config", None)
    summary = {"model": model_name, "model_overrides": dict(cfg.model_overrides),
               "model_config": config.to_dict() if config is not None else None,
               "params": model.count_params(),
               "macs": flops.forward_macs(config) if config is not None else None,
               "dataset": source.name, "eval_split": eval_split, "recipe": dataclasses.asdict(recipe),
               "steps": total_updates, "batch_size": recipe.batch_size, "precision": policy,
               "machine": hardware.machine(), "train_seconds": round(seconds, 1),
               "skipped_records": stats.skipped_count, "bad_records": stats.skipped,
               **{f"eval_{k}": v for k, v in results.items()}, "paths": paths}
    if fewshot is not None and fewshot.last is not None:
        summary["fewshot"] = fewshot.last["fewshot"]
    storage.write_text(paths["metrics"], json.dumps(summary, indent=2))
    summary["model_obj"] = model
    return summary
