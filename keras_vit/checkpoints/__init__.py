"""Loaders for official .npz and Hugging Face ViT checkpoints."""

from keras_vit.checkpoints.errors import CheckpointError
from keras_vit.checkpoints.loading import (CheckpointSource, checkpoint_class_names, inspect_checkpoint,
                                           load_into, open_checkpoint, save_npz)
from keras_vit.checkpoints.posemb import interpolate_posembed

__all__ = ["CheckpointError", "CheckpointSource", "checkpoint_class_names", "inspect_checkpoint",
           "interpolate_posembed", "load_into", "open_checkpoint", "save_npz"]
