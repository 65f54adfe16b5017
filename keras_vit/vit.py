"""The Vision Transformer and its hybrid (BiT ResNet + ViT), and `create_model`."""

from __future__ import annotations

import os
from typing import Optional, Union

import keras
from keras import ops

from keras_vit import storage
from keras_vit.configs import RELATIVE_KINDS, ViTConfig, model_config
from keras_vit.layers import (ClassToken, EncoderBlock, LayerNorm, PatchEmbedding, PositionEmbedding,
                              ResNetStem, fast_paths)


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(keras.Model):
    """ViT image classifier, `[B, H, W, C]` images in [-1, 1] -> `[B, num_classes]` logits.

    The backbone (optional ResNet stem, patch embedding, class token, position
    embedding, encoder blocks, final LayerNorm, pooling, optional pre-logits) is
    followed by a zero-initialised Dense head. With `num_classes=0` the model
    outputs the pooled `[B, D]` features instead.

    Logits are float32 under any dtype policy.
    """

    def __init__(self, config: Union[ViTConfig, dict], dtype=None, **kwargs):
        if isinstance(config, dict):
            config = ViTConfig.from_dict(config)
        c = config
        layer_kw = {"dtype": dtype} if dtype is not None else {}
        # === Layers (named as in the official checkpoints where Keras allows) ===
        self.resnet = (ResNetStem(c.resnet.num_layers, c.resnet.width_factor, name="resnet", **layer_kw)
                       if c.resnet else None)
        self.patch_embed = PatchEmbedding(c.hidden_size, c.patch_size, name="embedding", **layer_kw)
        self.class_token = ClassToken(name="cls", **layer_kw) if c.classifier == "token" else None
        self.position_embedding = PositionEmbedding(c.position_embedding, c.grid_size, c.num_prefix_tokens,
                                                    name="posembed_input", **layer_kw)
        self.embedding_dropout = keras.layers.Dropout(c.dropout_rate, name="embedding_dropout", **layer_kw)
        relative_kind = RELATIVE_KINDS.get(c.position_embedding)
        relative_grid = c.grid_size if relative_kind else None
        self.blocks = [
            EncoderBlock(
                c.num_heads, c.mlp_dim, c.dropout_rate, c.attention_dropout_rate,
                # Stochastic depth grows linearly with depth, from 0 at the first block.
                c.stochastic_depth_rate * i / max(c.num_layers - 1, 1),
                c.layer_norm_epsilon, c.gelu_approximate, relative_grid, c.num_prefix_tokens,
                relative_kind=relative_kind or "bias", name=f"encoderblock_{i}", **layer_kw)
            for i in range(c.num_layers)
        ]
        self.encoder_norm = LayerNorm(epsilon=c.layer_norm_epsilon, name="encoder_norm", **layer_kw)
        self.pre_logits = (keras.layers.Dense(c.representation_size, activation="tanh",
                                              kernel_initializer="lecun_normal", name="pre_logits",
                                              **layer_kw)
                           if c.representation_size else None)
        self.head = (keras.layers.Dense(c.num_classes, kernel_initializer="zeros",
                                        bias_initializer=keras.initializers.Constant(c.head_bias_init),
                                        dtype="float32", name="head")
                     if c.num_classes else None)

        # === Functional model ===
        images = keras.Input(shape=(*c.image_size, c.num_channels), name="images")
        outputs = self.forward(images)["logits"]
        super().__init__(inputs=images, outputs=outputs, name=kwargs.pop("name", _layer_name(c.name)),
                         **kwargs)
        self.config = c
        self._dtype_arg = dtype
        # Keras's own spec lets a last axis of 1 through for any channel count, so a
        # grayscale batch failed deep in the patch convolution; a 1-channel model
        # still takes [B, H, W].
        self.input_spec = keras.layers.InputSpec(shape=(None, *c.image_size, c.num_channels), name="images",
                                                 allow_last_axis_squeeze=c.num_channels == 1)

    def predict_step(self, data):
        # Keras runs these steps in process and never saves them, so they may take
        # XLA kernels (see `fast_paths.xla_kernels_allowed`).
        with fast_paths.never_saved():
            return super().predict_step(data)

    def test_step(self, data):
        with fast_paths.never_saved():
            return super().test_step(data)

    def forward(self, images, training=None, return_attention=False, return_tokens=False):
        """Runs the model and returns a dict of what it computed.

        Keys: `logits` `[B, C]` (the pooled features when there is no head),
        `pre_logits` `[B, R or D]`, `encoded` `[B, T, D]` (after the final LayerNorm);
        with `return_attention`, `attention`: one `[B, heads, T, T]` per block; with
        `return_tokens`, `tokens`: one `[B, T, D]` per block output. T counts the class
        token first when the classifier is `token`.
        """
        x = images
        if self.resnet is not None:
            x = self.resnet(x)
        x = self.patch_embed(x)
        if self.class_token is not None:
            x = self.class_token(x)
        x = self.position_embedding(x)
        x = self.embedding_dropout(x, training=training)
        attention, tokens = [], []
        for block in self.blocks:
            inputs = x
            if return_attention:
                x, weights = block(x, training=training, return_attention=True)
                attention.append(weights)
            else:
                x = block(x, training=training)
            if return_tokens:
                tokens.append(x)
        encoded = self.encoder_norm(x)
        if self.class_token is None:
            pooled = ops.mean(encoded, axis=1)
        else:
            # The head reads the class token alone, so the last block need carry no
            # other token past its keys and values (ViT-B/16: 7% of the work). In a
            # functional model the full last block, whose only use is `encoded`, is
            # pruned from the logits' graph. LayerNorm is per token.
            if self.blocks:
                x = self.blocks[-1](inputs, training=training, class_token_only=True)
            pooled = self.encoder_norm(x[:, 0])
        if self.pre_logits is not None:
            pooled = self.pre_logits(pooled)
        logits = self.head(pooled) if self.head is not None else pooled
        out = {"logits": logits, "pre_logits": pooled, "encoded": encoded}
        if return_attention:
            out["attention"] = attention
        if return_tokens:
            out["tokens"] = tokens
        return out

    def feature_extractor(self) -> keras.Model:
        """A model sharing these weights that outputs the pre-logits features `[B, R or D]`."""
        pre = self.forward(self.inputs[0])["pre_logits"]
        return keras.Model(self.inputs[0], pre, name=f"{self.name}_features")

    def get_config(self):
        return {"config": self.config.to_dict(), "dtype": self._dtype_arg, "name": self.name,
                "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def load_model(path: str, image_size=None) -> VisionTransformer:
    """A saved `.keras` ViT, or a checkpoint (official `.npz`, Hugging Face directory,
    or pretrained weights by name, see `create_model`) whose architecture is read from
    its tensors.

    `image_size` (int or (height, width)) applies to checkpoints, whose position
    embeddings are then interpolated; a `.keras` model keeps its own size.
    """
    path = os.fspath(path)
    if not path.endswith(".keras"):
        return create_model(None, weights=path, image_size=image_size)
    if image_size is not None:
        raise ValueError("image_size applies to checkpoints; a .keras model keeps its own size")
    if not storage.exists(path):
        raise FileNotFoundError(f"no model at {path}")
    model = keras.saving.load_model(path)
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"{path} holds a {type(model).__name__}, not a keras_vit VisionTransformer")
    return model


def _layer_name(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_").lower() or "vit"


def create_model(
    name_or_config: Union[str, ViTConfig, dict, None] = "ViT-B/16",
    num_classes: Optional[int] = None,
    image_size=None,
    weights: Optional[str] = None,
    dtype=None,
    **overrides,
) -> VisionTransformer:
    """Builds a ViT or hybrid model, optionally filled from a checkpoint.

    Args:
      name_or_config: a paper name (`"ViT-B/16"`, `"R50+ViT-B/16"`, case-insensitive),
        a `ViTConfig`, its dict or JSON file path, or None to take the architecture
        from `weights`; or the name of pretrained weights
        (`"vit_base_patch16_224.augreg_in21k_ft_in1k"`, `"hf://google/vit-base-patch16-224"`),
        which gives both the architecture and the weights, at the name's resolution.
      num_classes: size of the head; 0 for a headless feature model. Default: the
        config's (1000 for named models), or the checkpoint's when loading weights.
      image_size: int or (height, width), a multiple of the total patch stride.
        Position embeddings of a checkpoint at another size are interpolated.
      weights: an official `.npz` (released, Flax or big_vision naming) or a Hugging
        Face ViT directory (`config.json` + `model.safetensors`), local or on storage
        tf.io.gfile reads; an http(s) URL; or pretrained weights by name (see
        `keras_vit.list_pretrained`): a registered name, an official AugReg file
        name, `hf://owner/repo`, or a tag of the named model (`"augreg_in21k_ft_in1k"`).
        Named weights are downloaded once into `keras_vit.pretrained.cache_dir()`.
      dtype: a Keras dtype policy name for every layer; default the global policy.
      **overrides: official config fields: `hidden_size`, `patch_size`, `mlp_dim`,
        `num_heads`, `num_layers`, `dropout_rate`, `attention_dropout_rate`,
        `stochastic_depth_rate`, `classifier`, `representation_size`, `resnet`,
        `position_embedding`, `gelu_approximate`, `layer_norm_epsilon`, ...

    Returns:
      A built `VisionTransformer` mapping `[B, H, W, C]` images in [-1, 1] to logits.
    """
    from keras_vit import checkpoints, pretrained  # the loaders import this module

    name_or_config, weights, entry = pretrained.locate(name_or_config, weights, image_size)
    source = checkpoints.open_checkpoint(weights) if weights is not None else None
    if name_or_config is None:
        if source is None:
            raise ValueError("create_model needs a model name, a config, or weights to infer one from")
        config = source.infer_config()
        if entry is not None:
            config = config.replace(name=entry.name)
    else:
        config = model_config(name_or_config)

    if source is not None:
        # What the checkpoint's own config fixes (HF's exact GELU, its epsilon)
        # applies unless the caller overrides it explicitly.
        implied = {k: v for k, v in source.implied_overrides().items() if k not in overrides}
        overrides = {**implied, **overrides}
        if num_classes is None:
            num_classes = source.num_classes()
    if entry is not None and not entry.on_hub and "representation_size" not in overrides:
        overrides["representation_size"] = entry.representation_size  # its pre-logits layer, if any
    if num_classes is not None:
        overrides["num_classes"] = num_classes
    if image_size is not None:
        overrides["image_size"] = image_size
    config = config.replace(**overrides)
    model = VisionTransformer(config, dtype=dtype)
    if source is not None:
        checkpoints.load_into(model, source)
    return model
