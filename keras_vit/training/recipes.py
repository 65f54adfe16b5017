"""The paper's training recipes: optimizer, schedule, loss and metrics for `model.fit`.

Pre-training: Adam (0.9, 0.999) with decoupled weight decay on kernels only, linear
warmup then linear (or cosine) decay, global-norm clipping at 1, dropout 0.1.
Fine-tuning: SGD with momentum 0.9, no weight decay, clipping at 1, 500 warmup
steps, cosine decay, at a higher resolution with a zero head.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import keras
from keras import ops

DECAYS = ("linear", "cosine")  # after warmup
LOSSES = ("softmax", "sigmoid")  # cross-entropy kinds


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    optimizer: str  # "adam" (with decoupled weight decay) or "sgd"
    learning_rate: float
    weight_decay: float
    batch_size: int
    warmup_steps: int
    decay: str  # "linear" or "cosine"
    grad_clip_norm: Optional[float] = 1.0
    dropout_rate: float = 0.0
    label_smoothing: float = 0.0
    loss: str = "softmax"  # or "sigmoid"
    head_bias_init: float = 0.0
    momentum: float = 0.9
    beta_1: float = 0.9
    beta_2: float = 0.999
    end_learning_rate: float = 0.0

    def __post_init__(self):
        problems = recipe_problems(self)
        if problems:
            raise ValueError(f"recipe {self.name!r}: " + "; ".join(problems))

    def replace(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def recipe_problems(r: Recipe) -> list:
    """What is wrong with a recipe's values, as phrases (empty when nothing is)."""
    checks = [
        (r.optimizer in ("adam", "sgd"), f"optimizer must be 'adam' or 'sgd', got {r.optimizer!r}"),
        # 0 is allowed: a run that leaves the weights as they are is a baseline.
        (r.learning_rate >= 0, f"learning_rate must be >= 0, got {r.learning_rate}"),
        (r.weight_decay >= 0, f"weight_decay must be >= 0, got {r.weight_decay}"),
        (r.batch_size >= 1 and int(r.batch_size) == r.batch_size,
         f"batch_size must be a whole number >= 1, got {r.batch_size}"),
        (r.warmup_steps >= 0, f"warmup_steps must be >= 0, got {r.warmup_steps}"),
        (r.decay in DECAYS, f"decay must be 'linear' or 'cosine', got {r.decay!r}"),
        (r.grad_clip_norm is None or r.grad_clip_norm > 0,
         f"grad_clip_norm must be > 0 or None, got {r.grad_clip_norm}"),
        (0 <= r.dropout_rate < 1, f"dropout_rate must be in [0, 1), got {r.dropout_rate}"),
        (0 <= r.label_smoothing < 1, f"label_smoothing must be in [0, 1), got {r.label_smoothing}"),
        (r.loss in LOSSES, f"loss must be 'softmax' or 'sigmoid', got {r.loss!r}"),
        (0 <= r.momentum < 1, f"momentum must be in [0, 1), got {r.momentum}"),
        (0 <= r.beta_1 < 1 and 0 <= r.beta_2 < 1,
         f"beta_1 and beta_2 must be in [0, 1), got {r.beta_1}, {r.beta_2}"),
        (0 <= r.end_learning_rate and (r.learning_rate <= 0 or r.end_learning_rate <= r.learning_rate),
         f"end_learning_rate must be in [0, learning_rate], got {r.end_learning_rate}"),
    ]
    return [message for ok, message in checks if not ok]


RECIPES = {
    "pretrain": Recipe("pretrain", "adam", learning_rate=1e-3, weight_decay=0.1, batch_size=4096,
                       warmup_steps=10_000, decay="linear", dropout_rate=0.1),
    "finetune": Recipe("finetune", "sgd", learning_rate=0.01, weight_decay=0.0, batch_size=512,
                       warmup_steps=500, decay="cosine"),
}


def get_recipe(name: str, **changes) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"recipe must be one of {list(RECIPES)}, got {name!r}")
    return RECIPES[name].replace(**changes)


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `learning_rate` over `warmup_steps`, then linear or cosine
    decay to `end_learning_rate` at `total_steps` (all counted in optimizer updates).

    `steps_per_update`: Keras 3.12 calls schedules with the micro-step counter when
    gradients are accumulated (`_get_current_learning_rate` reads `_iterations`),
    so the step is divided back into updates here.
    """

    def __init__(self, learning_rate, total_steps, warmup_steps=0, decay="linear", end_learning_rate=0.0,
                 steps_per_update=1):
        if decay not in DECAYS:
            raise ValueError(f"decay must be 'linear' or 'cosine', got {decay!r}")
        if total_steps <= 0 or warmup_steps < 0:
            raise ValueError(f"need total_steps > 0 and warmup_steps >= 0, got {total_steps}, {warmup_steps}")
        self.learning_rate = float(learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(min(warmup_steps, total_steps))
        self.decay = decay
        self.end_learning_rate = float(end_learning_rate)
        self.steps_per_update = int(steps_per_update)

    def __call__(self, step):
        step = ops.floor(ops.cast(step, "float32") / self.steps_per_update)
        warm = self.learning_rate * step / max(self.warmup_steps, 1)
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        if self.decay == "linear":
            shape = 1.0 - progress
        else:
            shape = 0.5 * (1.0 + ops.cos(math.pi * progress))
        decayed = self.end_learning_rate + (self.learning_rate - self.end_learning_rate) * shape
        return ops.where(step < self.warmup_steps, warm, decayed)

    def get_config(self):
        return {"learning_rate": self.learning_rate, "total_steps": self.total_steps,
                "warmup_steps": self.warmup_steps, "decay": self.decay,
                "end_learning_rate": self.end_learning_rate, "steps_per_update": self.steps_per_update}


@keras.saving.register_keras_serializable(package="keras_vit")
class SparseSigmoidCrossEntropy(keras.losses.Loss):
    """Sigmoid cross-entropy on one-hot targets from sparse labels, summed over classes
    (as big_vision's `sigmoid_xent`), averaged over the batch."""

    def __init__(self, num_classes, label_smoothing=0.0, name="sigmoid_xent", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = int(num_classes)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        targets = ops.one_hot(ops.reshape(ops.cast(y_true, "int32"), (-1,)), self.num_classes)
        if self.label_smoothing:
            targets = targets * (1 - self.label_smoothing) + self.label_smoothing / self.num_classes
        logits = ops.cast(y_pred, "float32")
        per_class = ops.maximum(logits, 0) - logits * targets + ops.log1p(ops.exp(-ops.abs(logits)))
        return ops.sum(per_class, axis=-1)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes,
                "label_smoothing": self.label_smoothing}


def make_optimizer(recipe: Recipe, total_steps: int, model: keras.Model,
                   gradient_accumulation_steps: Optional[int] = None) -> keras.optimizers.Optimizer:
    """The recipe's optimizer; `total_steps` counts optimizer updates (after accumulation)."""
    schedule = WarmupDecay(recipe.learning_rate, total_steps, recipe.warmup_steps, recipe.decay,
                           recipe.end_learning_rate, steps_per_update=gradient_accumulation_steps or 1)
    common = dict(learning_rate=schedule, global_clipnorm=recipe.grad_clip_norm,
                  gradient_accumulation_steps=gradient_accumulation_steps)
    if recipe.optimizer == "sgd":
        if recipe.weight_decay:
            common["weight_decay"] = recipe.weight_decay
        opt = keras.optimizers.SGD(momentum=recipe.momentum, **common)
    elif recipe.optimizer == "adam":
        opt = keras.optimizers.AdamW(weight_decay=recipe.weight_decay, beta_1=recipe.beta_1,
                                     beta_2=recipe.beta_2, **common)
    else:
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {recipe.optimizer!r}")
    if recipe.weight_decay:
        # Decay kernels only: not biases, norms, embeddings or the class token.
        opt.exclude_from_weight_decay(
            var_list=[v for v in model.trainable_variables if not v.name.endswith("kernel")])
    return opt


def make_loss(recipe: Recipe, num_classes: int) -> keras.losses.Loss:
    if recipe.loss == "sigmoid":
        return SparseSigmoidCrossEntropy(num_classes, recipe.label_smoothing)
    if recipe.loss != "softmax":
        raise ValueError(f"loss must be 'softmax' or 'sigmoid', got {recipe.loss!r}")
    if recipe.label_smoothing:
        return _SmoothedSparseCrossEntropy(num_classes, recipe.label_smoothing)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@keras.saving.register_keras_serializable(package="keras_vit")
class _SmoothedSparseCrossEntropy(keras.losses.Loss):
    def __init__(self, num_classes, label_smoothing, name="smoothed_xent", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = int(num_classes)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        targets = ops.one_hot(ops.reshape(ops.cast(y_true, "int32"), (-1,)), self.num_classes)
        return keras.losses.categorical_crossentropy(targets, ops.cast(y_pred, "float32"), from_logits=True,
                                                     label_smoothing=self.label_smoothing)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes,
                "label_smoothing": self.label_smoothing}


def metrics(num_classes: int):
    """Top-1 and top-5 accuracy (top-k with k = min(5, classes))."""
    return [keras.metrics.SparseCategoricalAccuracy(name="top1"),
            keras.metrics.SparseTopKCategoricalAccuracy(k=min(5, num_classes), name="top5")]


def compile_model(model: keras.Model, recipe: Recipe, total_steps: int, jit_compile="auto",
                  gradient_accumulation_steps: Optional[int] = None,
                  steps_per_execution: int = 1) -> keras.Model:
    """Compiles `model` for `model.fit` with the recipe's optimizer, loss and top-1/top-5.

    `steps_per_execution`: steps per call of Keras's train function (fewer host round
    trips on an accelerator)."""
    num_classes = int(model.outputs[0].shape[-1])
    model.compile(optimizer=make_optimizer(recipe, total_steps, model, gradient_accumulation_steps),
                  loss=make_loss(recipe, num_classes), metrics=metrics(num_classes), jit_compile=jit_compile,
                  steps_per_execution=steps_per_execution)
    return model
