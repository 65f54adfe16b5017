"""Patch embedding, class token and absolute position embeddings."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Cuts an image (or a ResNet feature map) into patches and projects each one.

    A convolution with stride equal to the patch size, as the official code does.
    Input `[B, H, W, C]`, output `[B, (H / ph) * (W / pw), hidden_size]`.
    """

    def __init__(self, hidden_size, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = int(hidden_size)
        self.patch_size = tuple(int(p) for p in patch_size)

    def build(self, input_shape):
        ph, pw = self.patch_size
        self.kernel = self.add_weight(
            name="kernel",
            shape=(ph, pw, input_shape[-1], self.hidden_size),
            initializer="lecun_normal",  # flax's Conv default
        )
        self.bias = self.add_weight(name="bias", shape=(self.hidden_size,), initializer="zeros")
        # TF reads an input with k times the kernel's channels as a grouped convolution
        # and returns numbers, so a wrong channel count must be stopped here.
        self.input_spec = keras.layers.InputSpec(ndim=4, axes={-1: input_shape[-1]})

    def call(self, images):
        x = ops.conv(images, self.kernel, strides=self.patch_size, padding="valid")
        x = x + self.bias
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1] * shape[2], self.hidden_size))

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        n = None if h is None or w is None else (h // self.patch_size[0]) * (w // self.patch_size[1])
        return (b, n, self.hidden_size)

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size,
                "patch_size": list(self.patch_size)}


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends a learned, zero-initialised class token: `[B, N, D] -> [B, N + 1, D]`."""

    def build(self, input_shape):
        self.cls = self.add_weight(name="cls", shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        cls = ops.cast(ops.broadcast_to(self.cls, (batch, 1, ops.shape(tokens)[-1])), tokens.dtype)
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + 1, d)


def sincos_2d(grid_size, width, temperature=10_000.0) -> np.ndarray:
    """Fixed 2D sine-cosine embeddings, `[gh * gw, width]`, row-major over the grid.

    A quarter of the channels each for sin(x), cos(x), sin(y), cos(y), with
    frequencies spaced geometrically up to 1 / temperature (as big_vision does).
    """
    gh, gw = grid_size
    if width % 4:
        raise ValueError(f"sincos2d needs a width divisible by 4, got {width}")
    quarter = width // 4
    omega = 1.0 / temperature ** (np.arange(quarter) / max(quarter - 1, 1))
    y, x = np.mgrid[:gh, :gw]
    x = x.reshape(-1, 1) * omega[None]
    y = y.reshape(-1, 1) * omega[None]
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype("float32")


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds absolute position embeddings to `[B, T, D]` tokens.

    kind:
      - "learned": a `[1, T, D]` weight, N(0, 0.02), covering the class token too
        (the official layout, so checkpoints load as they are).
      - "sincos2d": fixed 2D sine-cosine embeddings on the patch grid; prefix tokens get zeros.
      - "none", "relative", "relative_bias": adds nothing (relative positions live in
        the attention).
    """

    def __init__(self, kind, grid_size, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def build(self, input_shape):
        seq_len = self.grid_size[0] * self.grid_size[1] + self.num_prefix_tokens
        if input_shape[1] is not None and input_shape[1] != seq_len:
            raise ValueError(
                f"PositionEmbedding built for {seq_len} tokens (grid {self.grid_size} + "
                f"{self.num_prefix_tokens} prefix) got {input_shape[1]}"
            )
        if self.kind == "learned":
            self.embedding = self.add_weight(
                name="pos_embedding",
                shape=(1, seq_len, input_shape[-1]),
                initializer=keras.initializers.RandomNormal(stddev=0.02),
            )
        elif self.kind == "sincos2d":
            table = sincos_2d(self.grid_size, input_shape[-1])
            table = np.concatenate([np.zeros((self.num_prefix_tokens, table.shape[1]), "float32"), table])
            self._table = table[None]

    def call(self, tokens):
        if self.kind == "learned":
            return tokens + ops.cast(self.embedding, tokens.dtype)
        if self.kind == "sincos2d":
            return tokens + ops.cast(self._table, tokens.dtype)
        return tokens

    def table(self):
        """What is added to each token, `[T, D]` numpy; None for "none" and the relative kinds."""
        if self.kind == "learned":
            return np.asarray(keras.ops.convert_to_numpy(self.embedding))[0]
        if self.kind == "sincos2d":
            return self._table[0]
        return None

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "kind": self.kind, "grid_size": list(self.grid_size),
                "num_prefix_tokens": self.num_prefix_tokens}
