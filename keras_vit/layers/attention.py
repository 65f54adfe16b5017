"""Multi-head self-attention with a fused QKV projection and optional relative positions."""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_vit.layers import fast_paths


def _glorot_blocks(num_blocks):
    """Xavier-uniform per (D, D) block, so a fused [D, 3D] kernel starts as the official q/k/v."""

    def init(shape, dtype=None):
        fan_in, total = shape
        block = total // num_blocks
        limit = math.sqrt(6.0 / (fan_in + block))
        return keras.random.uniform(shape, -limit, limit, dtype=dtype)

    return init


RELATIVE_KINDS = ("bias", "attention")


def relative_position_index(grid_size, num_prefix_tokens, kind="bias") -> np.ndarray:
    """`[T, T]` indices into a table of `num_relative_positions` rows, one per offset of
    a query's patch from a key's.

    - "bias": 2D offsets (dy, dx) on the patch grid.
    - "attention": the paper's 1D offsets `p_q - p_k` of the patches in raster order.

    With a class token, three extra rows hold class->patch, patch->class and
    class->class (as BEiT does).
    """
    gh, gw = grid_size
    n = gh * gw
    if kind == "bias":
        coords = np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij"), -1).reshape(-1, 2)
        rel = coords[:, None, :] - coords[None, :, :]
        index = (rel[..., 0] + gh - 1) * (2 * gw - 1) + (rel[..., 1] + gw - 1)
    elif kind == "attention":
        index = np.arange(n)[:, None] - np.arange(n)[None, :] + n - 1
    else:
        raise ValueError(f"relative kind must be one of {RELATIVE_KINDS}, got {kind!r}")
    if num_prefix_tokens:
        base = _num_offsets(grid_size, kind)
        full = np.empty((n + 1, n + 1), dtype=np.int64)
        full[1:, 1:] = index
        full[0, 1:] = base
        full[1:, 0] = base + 1
        full[0, 0] = base + 2
        index = full
    return index.astype("int32")


def _num_offsets(grid_size, kind):
    gh, gw = grid_size
    return (2 * gh - 1) * (2 * gw - 1) if kind == "bias" else 2 * gh * gw - 1


def num_relative_positions(grid_size, num_prefix_tokens, kind="bias") -> int:
    return _num_offsets(grid_size, kind) + (3 if num_prefix_tokens else 0)


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Scaled dot-product self-attention over `[B, T, D]` tokens.

    The q, k and v projections are one `[D, 3D]` matmul; loaders fill it from the
    official per-tensor `[D, H, D/H]` kernels. With `relative_grid` set, the logits
    also depend on where each key's patch lies from the query's (`relative_kind`):

    - "attention", the paper's relative attention (its appendix on position
      embeddings): each 1D offset has a learned key per head, `[R, H, D/H]`; the
      queries attend to them too, and those logits are added to the content logits
      before the softmax, so the bias depends on the query's content.
    - "bias": a learned scalar per head and 2D offset, `[R, H]`, as in Swin; it does
      not depend on the query.

    `call(x, return_attention=True)` also returns the attention weights `[B, H, T, T]`
    in float32. The softmax runs in `fast_paths.softmax_dtype`.
    """

    def __init__(self, num_heads, dropout_rate=0.0, relative_grid=None, num_prefix_tokens=0,
                 relative_kind="bias", **kwargs):
        super().__init__(**kwargs)
        if relative_kind not in RELATIVE_KINDS:
            raise ValueError(f"relative_kind must be one of {RELATIVE_KINDS}, got {relative_kind!r}")
        self.num_heads = int(num_heads)
        self.dropout_rate = float(dropout_rate)
        self.relative_grid = None if relative_grid is None else tuple(int(g) for g in relative_grid)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.relative_kind = relative_kind
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
            rows = num_relative_positions(self.relative_grid, self.num_prefix_tokens, self.relative_kind)
            if self.relative_kind == "bias":
                self.relative_bias = self.add_weight(name="relative_bias", shape=(rows, self.num_heads),
                                                     initializer="zeros")
            else:
                # As the learned absolute position embeddings are initialised.
                self.relative_key = self.add_weight(
                    name="relative_key", shape=(rows, self.num_heads, dim // self.num_heads),
                    initializer=keras.initializers.RandomNormal(stddev=0.02))
            self._relative_index = relative_position_index(self.relative_grid, self.num_prefix_tokens,
                                                           self.relative_kind)

    def call(self, x, training=None, return_attention=False):
        out, weights = self.attend(x, ops.shape(x), training)
        out = ops.reshape(out, ops.shape(x))
        return (out, ops.cast(weights, "float32")) if return_attention else out

    def attend(self, tokens, shape, training=None, residual=None, first_only=False):
        """Attention of `tokens`, an input of shape `shape` (`[B, T, D]`), as rows.

        Args:
          tokens: `[B * T, D]` (any rank with `first_only`), normalised tokens.
          shape: the `[B, T, D]` shape of the input (`ops.shape` or `tf.shape`).
          residual: None or the rows of the output, added to it (at inference inside
            the out projection's op).
          first_only: only each image's first token attends (to all T), as the last
            block does when the head reads the class token alone.

        Returns:
          The projected output `[B * T, D]` (`[B, D]` with `first_only`) and the weights
          `[B, H, T or 1, T]` in the softmax dtype.
        """
        dim = tokens.shape[-1]
        # Projections run on [B*T, D] rows: a [B, T, D] @ [D, N] matmul is a broadcast
        # batch matmul whose kernel gradient is B small matmuls plus a sum over B.
        rows = tokens if len(tokens.shape) == 2 else ops.reshape(tokens, (-1, dim))
        if first_only:
            # Queries from the first tokens alone; the heads' shapes come from `shape`
            # (not the batch as a number), so grappler knows the output's rows are the
            # residual's and the add fuses with a dynamic batch too.
            first = tf.gather(tokens, 0, axis=1)
            k, v = self._heads(fast_paths.dense(rows, self.qkv_kernel[:, dim:], self.qkv_bias[dim:],
                                                training=training), [shape[:2]], 2)
            (q,) = self._heads(fast_paths.dense(first, self.qkv_kernel[:, :dim], self.qkv_bias[:dim],
                                                training=training, few_rows=True), [shape[:1], [1]], 1)
            out_shape = tf.shape(first)
        else:
            q, k, v = self._heads(fast_paths.dense(rows, self.qkv_kernel, self.qkv_bias, training=training),
                                  (shape[0], shape[1]), 3)
            # The rows' own shape, not (-1, D): with a dynamic batch, grappler must see
            # that the residual and the output match for the add to fuse.
            out_shape = tf.shape(rows)
        if first_only and q.dtype == "bfloat16" and fast_paths.compiling_with_xla():
            # XLA's CPU backend has no bf16 kernel for a batch of one-row products
            # ("unsupported operand type BF16 in op dot"): these run in float32.
            q, k, v = (ops.cast(t, "float32") for t in (q, k, v))
        # q is scaled, not the [T, T] logits (as flax does): a third of the work at T=197.
        q = q * ops.cast(1.0 / math.sqrt(q.shape[-1]), q.dtype)
        # transpose_b, not a matmul of a transposed k: under XLA with bf16 q and k, the
        # latter compiled to a float32 product of upcast q and k.
        logits = ops.cast(tf.matmul(q, k, transpose_b=True), fast_paths.softmax_dtype(tokens.dtype))
        if self.relative_grid is not None:
            logits = logits + ops.cast(self._relative_logits(q), logits.dtype)
        weights = fast_paths.softmax(logits, training)
        mixed = ops.matmul(self.attention_dropout(ops.cast(weights, v.dtype), training=training), v)
        mixed = tf.reshape(ops.transpose(ops.cast(mixed, tokens.dtype), (0, 2, 1, 3)), out_shape)
        out = fast_paths.dense(mixed, self.out_kernel, self.out_bias, residual, training, few_rows=first_only)
        return out, weights

    def _relative_logits(self, q):
        """What the keys' offsets from each query add to its logits: `[1, H, Tq, T]`
        ("bias") or `[B, H, Tq, T]` ("attention"), for scaled queries `[B, H, Tq, Dh]`
        (the first Tq tokens)."""
        index = self._relative_index[:q.shape[2]]  # the queries' rows
        if self.relative_kind == "bias":
            bias = ops.take(ops.cast(self.relative_bias, q.dtype), index, axis=0)
            return ops.transpose(bias, (2, 0, 1))[None]
        # Each query against the keys of its own row of offsets, [Tq, T, H, Dh] gathered
        # from the table: the gather (and its gradient, a scatter) touches the weights
        # alone, not a batch of logits, and the product runs on the T keys rather than
        # all R offsets (4-6x faster to train than gathering [B, H, Tq, R] logits; the
        # keys, Tq * T * D values, do not grow with the batch).
        keys = ops.take(ops.cast(self.relative_key, q.dtype), index, axis=0)
        return tf.einsum("bhqd,qkhd->bhqk", q, keys)

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
        x = ops.transpose(x, (2, 0, 3, 1, 4))  # [parts, B, H, T, Dh]
        # Unstack, not x[0], x[1], x[2]: each slice's gradient is a zero-padded copy of
        # all of x, summed, where unstack's is one stack.
        return ops.unstack(x, parts, axis=0)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "dropout_rate": self.dropout_rate,
            "relative_grid": None if self.relative_grid is None else list(self.relative_grid),
            "num_prefix_tokens": self.num_prefix_tokens,
            "relative_kind": self.relative_kind,
        }
