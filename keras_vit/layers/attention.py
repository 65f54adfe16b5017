"""Multi-head self-attention with a fused QKV projection and optional relative position bias."""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_vit import hardware
from keras_vit.layers import graph_kind, projection


def _glorot_blocks(num_blocks):
    """Xavier-uniform per (D, D) block, so a fused [D, 3D] kernel starts as the official q/k/v."""

    def init(shape, dtype=None):
        fan_in, total = shape
        block = total // num_blocks
        limit = math.sqrt(6.0 / (fan_in + block))
        return keras.random.uniform(shape, -limit, limit, dtype=dtype)

    return init


def relative_position_index(grid_size, num_prefix_tokens) -> np.ndarray:
    """`[T, T]` indices into a relative-bias table of `num_relative_positions` rows.

    Patch pairs index by their 2D offset (dy, dx); with a class token, three extra
    rows hold class->patch, patch->class and class->class (as BEiT does).
    """
    gh, gw = grid_size
    coords = np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij"), -1).reshape(-1, 2)
    rel = coords[:, None, :] - coords[None, :, :]
    index = (rel[..., 0] + gh - 1) * (2 * gw - 1) + (rel[..., 1] + gw - 1)
    if num_prefix_tokens:
        base = (2 * gh - 1) * (2 * gw - 1)
        n = gh * gw
        full = np.empty((n + 1, n + 1), dtype=np.int64)
        full[1:, 1:] = index
        full[0, 1:] = base
        full[1:, 0] = base + 1
        full[0, 0] = base + 2
        index = full
    return index.astype("int32")


def num_relative_positions(grid_size, num_prefix_tokens) -> int:
    gh, gw = grid_size
    return (2 * gh - 1) * (2 * gw - 1) + (3 if num_prefix_tokens else 0)


@tf.function(jit_compile=True)
def _softmax_backward(y, dy):
    y32, dy32 = tf.cast(y, tf.float32), tf.cast(dy, tf.float32)
    return tf.cast((dy32 - tf.reduce_sum(dy32 * y32, axis=-1, keepdims=True)) * y32, dy.dtype)


@tf.custom_gradient
def softmax_for_training(logits):
    """Softmax over the last axis whose gradient is one XLA-fused kernel (float32 inside).

    TF's softmax gradient is four passes over `[B, H, T, T]` (two Muls, a Sum, a
    Sub), slow in bfloat16 on CPU. Used for bfloat16 logits while training, like the
    encoder's GELU: the SavedModel must not need XLA.
    """
    weights = tf.nn.softmax(logits, axis=-1)
    return weights, lambda dy: _softmax_backward(weights, dy)


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Scaled dot-product self-attention over `[B, T, D]` tokens.

    The q, k and v projections are one `[D, 3D]` matmul; loaders fill it from the
    official per-tensor `[D, H, D/H]` kernels. With `relative_grid` set, a learned
    per-head bias over 2D offsets of the patch grid is added to the logits.

    `call(x, return_attention=True)` also returns the attention weights `[B, H, T, T]`
    in float32. Softmax runs in bfloat16 under mixed_bfloat16 where TF's oneDNN runs
    bfloat16 (as in flax), and in float32 otherwise.
    """

    def __init__(self, num_heads, dropout_rate=0.0, relative_grid=None, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.dropout_rate = float(dropout_rate)
        self.relative_grid = None if relative_grid is None else tuple(int(g) for g in relative_grid)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.attention_dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim % self.num_heads:
            raise ValueError(f"width {dim} is not divisible by num_heads {self.num_heads}")
        self.qkv_kernel = self.add_weight(name="qkv_kernel", shape=(dim, 3 * dim),
                                          initializer=_glorot_blocks(3))
        self.qkv_bias = self.add_weight(name="qkv_bias", shape=(3 * dim,), initializer="zeros")
        self.out_kernel = self.add_weight(name="out_kernel", shape=(dim, dim),
                                          initializer="glorot_uniform")
        self.out_bias = self.add_weight(name="out_bias", shape=(dim,), initializer="zeros")
        if self.relative_grid is not None:
            self.relative_bias = self.add_weight(
                name="relative_bias",
                shape=(num_relative_positions(self.relative_grid, self.num_prefix_tokens), self.num_heads),
                initializer="zeros",
            )
            self._relative_index = relative_position_index(self.relative_grid, self.num_prefix_tokens)

    def call(self, x, training=None, return_attention=False):
        shape = ops.shape(x)
        out, weights = self.attend(ops.reshape(x, (-1, x.shape[-1])), shape[0], shape[1], training)
        out = ops.reshape(out, shape)
        if return_attention:
            return out, ops.cast(weights, "float32")
        return out

    def attend(self, tokens, batch, seq, training=None, residual=None):
        """Attention over tokens flattened to `[B * T, D]`.

        Returns the projected output `[B * T, D]` (plus `residual` `[B * T, D]` if
        given, which then fuses into the out projection at inference) and the weights
        `[B, H, T, T]` (in the softmax dtype).
        """
        # Projections run on [B*T, D]: a [B, T, D] @ [D, N] matmul is a broadcast batch
        # matmul whose kernel gradient is B small matmuls plus a sum over B.
        qkv = projection.project(tokens, self.qkv_kernel, self.qkv_bias, training=training)
        q, k, v = self._heads(qkv, (batch, seq), 3)
        # To tokens' own shape, not (-1, D): with a dynamic batch, grappler must see
        # that the residual and this output match for the Add to fuse.
        return self._mix(q, k, v, tokens.dtype, tf.shape(tokens), training, residual)

    def attend_first(self, tokens, first, shape, training=None, residual=None):
        """Attention from each image's first token alone, to all T tokens.

        Args:
          tokens: `[B * T, D]`, flattened from an input of shape `shape`.
          first: `[B, D]`, each image's first token, normalised as `tokens` are.
          shape: `tf.shape` of that `[B, T, D]` input.
          residual: None or `[B, D]`, added as in `attend`.

        Returns:
          The projected output `[B, D]` and the weights `[B, H, 1, T]`.
        """
        dim = tokens.shape[-1]
        # The heads' shapes are built from `shape`, not from the batch size as a
        # number: grappler then knows the output's rows are the residual's, and with
        # a dynamic batch too the add fuses into the out projection (as it does with a
        # static one, so that in bfloat16 a SavedModel's logits equal predict's).
        k, v = self._heads(projection.project(tokens, self.qkv_kernel[:, dim:], self.qkv_bias[dim:],
                                              training=training), [shape[:2]], 2)
        (q,) = self._heads(projection.project(first, self.qkv_kernel[:, :dim], self.qkv_bias[:dim],
                                              training=training, few_rows=True), [shape[:1], [1]], 1)
        return self._mix(q, k, v, tokens.dtype, tf.shape(first), training, residual)

    def _heads(self, projected, lead, parts):
        """`[N, parts * D]` -> `parts` tensors of `[B, H, T, Dh]`, where `lead` is
        `(B, T)` as numbers, or a list of shape tensors that concatenate to it (one
        concatenation, which grappler reads as a shape where it would not read two)."""
        head_dim = projected.shape[-1] // (parts * self.num_heads)
        tail = (parts, self.num_heads, head_dim)
        if isinstance(lead, tuple):
            x = ops.reshape(projected, lead + tail)
        else:
            x = tf.reshape(projected, tf.concat([*lead, tail], 0))
        # Not ops.dot_product_attention: on the TF backend it is einsums too. Measured
        # side by side (ViT-Ti/16, batch 8, 2 AVX2 cores) it was slower without XLA
        # (0.83x in float32, 0.37x in mixed_bfloat16) and no faster with it.
        x = ops.transpose(x, (2, 0, 3, 1, 4))  # [parts, B, H, T, Dh]
        # Unstack, not x[0], x[1], x[2]: each slice's gradient is a zero-padded copy of
        # all of x, summed, where unstack's is one stack. Measured side by side: train
        # steps 1.2x faster (README Fashion-MNIST ViT), 1.14x (ViT-Ti/16).
        return ops.unstack(x, parts, axis=0)

    def _mix(self, q, k, v, dtype, out_shape, training, residual):
        """softmax(q k^T / sqrt(Dh)) v, projected: `[B, H, Tq, Dh]` queries (the first Tq
        tokens, all T or the class token) -> output in `dtype` reshaped to `out_shape`,
        and the weights `[B, H, Tq, T]`."""
        one_row = q.shape[2] == 1  # one query per image: the class token's
        if one_row and q.dtype == "bfloat16" and graph_kind.compiling_with_xla():
            # XLA's CPU backend has no bf16 kernel for a batch of one-row products
            # ("unsupported operand type BF16 in op dot" from 32 images of ViT-Ti/16):
            # these run in float32, 2 x T x D MACs per image.
            q, k, v = (ops.cast(t, "float32") for t in (q, k, v))
        # q is scaled, not the [T, T] logits (as flax does): a third of the work at T=197.
        q = q * ops.cast(1.0 / math.sqrt(q.shape[-1]), q.dtype)
        # transpose_b, not a matmul of a transposed k: under XLA with bf16 q and k, the
        # latter (then cast to the float32 softmax) compiled to a float32 product of
        # upcast q and k. Without XLA the two are the same graph.
        logits = ops.cast(tf.matmul(q, k, transpose_b=True), self._softmax_dtype(dtype))
        if self.relative_grid is not None:
            index = self._relative_index[:q.shape[2]]  # the queries' rows
            bias = ops.take(ops.cast(self.relative_bias, logits.dtype), index, axis=0)
            logits = logits + ops.transpose(bias, (2, 0, 1))[None]
        if training and logits.dtype == "bfloat16":
            weights = softmax_for_training(logits)  # float32's own gradient measured no faster
        else:
            weights = ops.softmax(logits, axis=-1)
        dropped = self.attention_dropout(ops.cast(weights, v.dtype), training=training)
        out = ops.cast(ops.matmul(dropped, v), dtype)  # [B, H, Tq, Dh]
        out = tf.reshape(ops.transpose(out, (0, 2, 1, 3)), out_shape)
        return projection.project(out, self.out_kernel, self.out_bias, residual, training, one_row), weights

    @staticmethod
    def _softmax_dtype(compute_dtype):
        # bfloat16 has float32's range, so its softmax (oneDNN computes it in float32
        # internally) is safe, as in flax and Keras's MultiHeadAttention; it saves two
        # casts of [B, H, T, T] and ran 1.4x faster on AMX cores. Its gradient's error
        # against exact float32 measured 0.0086 against the float32 softmax's 0.0078.
        # float16 overflows at 65504, so its softmax stays float32. Under XLA, float32:
        # XLA maps only a float32 softmax to oneDNN's and fuses the casts (ViT-Ti/16
        # bf16 inference with XLA 1.17x). Where TF's oneDNN does not run bfloat16 (AVX2-only
        # cores), float32 too: Eigen's bf16 softmax rounds its exps and sum in bf16, 6-8
        # ulps off against one for the float32 softmax rounded once.
        if compute_dtype == "bfloat16" and not graph_kind.compiling_with_xla() \
                and hardware.onednn_runs("bfloat16"):
            return "bfloat16"
        return "float32"

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "dropout_rate": self.dropout_rate,
            "relative_grid": None if self.relative_grid is None else list(self.relative_grid),
            "num_prefix_tokens": self.num_prefix_tokens,
        }
