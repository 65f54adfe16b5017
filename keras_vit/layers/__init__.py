"""Keras 3 layers of the ViT and the BiT ResNet; each has get_config and is registered."""

from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.embedding import ClassToken, PatchEmbedding, PositionEmbedding
from keras_vit.layers.encoder import EncoderBlock, MlpBlock, StochasticDepth
from keras_vit.layers.normalization import LayerNorm
from keras_vit.layers.resnet import BottleneckUnit, GroupNorm, ResNetStem, StdConv2D

__all__ = [
    "BottleneckUnit",
    "ClassToken",
    "EncoderBlock",
    "GroupNorm",
    "LayerNorm",
    "MlpBlock",
    "MultiHeadSelfAttention",
    "PatchEmbedding",
    "PositionEmbedding",
    "ResNetStem",
    "StdConv2D",
    "StochasticDepth",
]
