"""keras_vit: the Vision Transformer (Dosovitskiy et al., 2020) in Keras 3."""

import warnings

# TensorFlow imports google-api-core, which warns on every start that Python 3.10 is
# unsupported. This stack needs 3.10 (TFX 1.16), so the warning is noise no user can act on.
# It must be filtered before the imports below (setup.cfg lets this file import late).
warnings.filterwarnings("ignore", message="You are using a non-supported Python version",
                        category=FutureWarning)

from keras_vit.checkpoints import CheckpointError, inspect_checkpoint, interpolate_posembed, save_npz
from keras_vit.configs import ResNetConfig, ViTConfig, list_models, model_config
from keras_vit.pretrained import list_pretrained
from keras_vit.precision import compute_dtype_twin
from keras_vit.vit import VisionTransformer, create_model, load_model

# A trained model.keras holds its compiled optimizer, whose schedule and loss are ours:
# registering them here lets `keras.saving.load_model` read it after `import keras_vit`.
from keras_vit.training import recipes as _recipes  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ResNetConfig",
    "ViTConfig",
    "VisionTransformer",
    "compute_dtype_twin",
    "create_model",
    "inspect_checkpoint",
    "interpolate_posembed",
    "list_models",
    "list_pretrained",
    "load_model",
    "model_config",
    "save_npz",
]
