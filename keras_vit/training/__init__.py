"""Training with model.fit: recipes, tf.distribute and resumable runs (precision: `keras_vit.precision`)."""

from keras_vit.training.distribute import STRATEGIES, make_strategy, patch_keras_multi_worker
from keras_vit.training.fewshot import FewShotCallback
from keras_vit.training.recipes import RECIPES, Recipe, WarmupDecay, compile_model, get_recipe
from keras_vit.training.run import ConfigError, TrainConfig, train

__all__ = ["ConfigError", "FewShotCallback", "RECIPES", "Recipe", "STRATEGIES", "TrainConfig",
           "WarmupDecay", "compile_model", "get_recipe", "make_strategy", "patch_keras_multi_worker", "train"]
