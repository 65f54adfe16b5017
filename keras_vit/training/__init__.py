"""Training with model.fit: recipes, precision, tf.distribute and resumable runs."""

from keras_vit.training.distribute import STRATEGIES, make_strategy, patch_keras_multi_worker
from keras_vit.training.fewshot import FewShotCallback
from keras_vit.training.precision import PRECISIONS, resolve_precision, set_precision
from keras_vit.training.recipes import RECIPES, Recipe, WarmupDecay, compile_model, get_recipe
from keras_vit.training.run import ConfigError, TrainConfig, train

__all__ = ["ConfigError", "FewShotCallback", "PRECISIONS", "RECIPES", "Recipe", "STRATEGIES", "TrainConfig",
           "WarmupDecay", "compile_model", "get_recipe", "make_strategy", "patch_keras_multi_worker",
           "resolve_precision", "set_precision", "train"]
