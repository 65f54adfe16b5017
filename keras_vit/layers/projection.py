"""The encoder's affine maps on flattened tokens, in the form TF's executor runs fastest."""

from __future__ import annotations

import tensorflow as tf

from keras_vit.layers import graph_kind

# From this many rows on, a bfloat16 map runs as a 1x1 convolution (see
# `_as_pointwise_conv`); below it the convolution's fixed cost loses (one 224 px image
# is 197 rows; two already gain).
CONV_MIN_ROWS = 384


def project(tokens, kernel, bias, residual=None, training=None, few_rows=False):
    """`tokens @ kernel + bias`, plus `residual` if given.

    Args:
      tokens: `[N, K]`.
      kernel: `[K, M]`, cast to the tokens' dtype.
      bias: `[M]`, cast to the tokens' dtype.
      residual: None or `[N, M]`.
      training: the Keras training flag. Only inference takes the convolution form.
      few_rows: the rows are one per image (the class token's), so the fused matmul
        is taken at any number, with no `tf.cond` (a batch seldom reaches
        `CONV_MIN_ROWS`, and a cond's output hides from grappler that the rows are
        the residual's, so with a dynamic batch the residual adds would not fuse).

    Returns:
      `[N, M]` in the tokens' dtype. Where TF runs oneDNN, product, bias and residual
      are one op (in the convolution form, the residual only with a static batch).
    """
    kernel, bias = tf.cast(kernel, tokens.dtype), tf.cast(bias, tokens.dtype)
    if few_rows or not _bf16_onednn_inference(tokens, training):
        return _as_matmul(tokens, kernel, bias, residual)
    return _by_rows(tokens, lambda: _as_pointwise_conv(tokens, kernel, bias, residual),
                    lambda: _as_matmul(tokens, kernel, bias, residual))


def project_gelu(tokens, kernel, bias, approximate, training=None, few_rows=False):
    """`gelu(tokens @ kernel + bias)`: the MLP's first map.

    Where TF runs oneDNN, product, bias and GELU are one op, an inner product, which in
    bfloat16 does not run on AMX (see `_as_pointwise_conv`); no convolution or other
    oneDNN op in TF 2.16 fuses a GELU. So where XLA kernels are allowed (eagerly and in
    Keras's predict and evaluate steps, never in a graph that could be saved: see
    `graph_kind.xla_kernels_allowed`), bfloat16 inference runs the map as the 1x1
    convolution with its bias, then the GELU as one XLA kernel, which wins from
    `CONV_MIN_ROWS` rows on (docs/performance.md); a static batch below keeps the fused op.

    Args:
      tokens: `[N, K]`.
      kernel: `[K, M]`, cast to the tokens' dtype.
      bias: `[M]`, cast to the tokens' dtype.
      approximate: the tanh GELU if True, else the exact (erf) one.
      training: the Keras training flag. Only inference takes the XLA form.
      few_rows: one row per image: the fused op at any number (see `project`).

    Returns:
      `[N, M]` in the tokens' dtype.
    """
    kernel, bias = tf.cast(kernel, tokens.dtype), tf.cast(bias, tokens.dtype)
    fused = lambda: tf.nn.gelu(_as_matmul(tokens, kernel, bias, None), approximate=approximate)  # noqa: E731
    if few_rows or not (_bf16_onednn_inference(tokens, training) and graph_kind.xla_kernels_allowed()):
        return fused()
    rows = tokens.shape[0]
    if rows is not None and rows < CONV_MIN_ROWS:
        return fused()
    # A dynamic number of rows takes this form too, with no tf.cond: in a cond's branch
    # grappler no longer fuses the GELU into the matmul, and its eight elementwise ops
    # then lose to this form at any number of rows.
    # Grappler infers no shape out of an XLA call (and merges a restating reshape
    # away); with the shape asserted, fc2's residual add still fuses into its convolution.
    return tf.ensure_shape(_xla_gelu(_as_pointwise_conv(tokens, kernel, bias, None), approximate),
                           [rows, kernel.shape[1]])


# In float32 inside the kernel, rounded to the input's dtype once: on bf16 input XLA
# rounds after each of the GELU's ops, which leaves about a quarter of the tanh GELU's
# outputs an ulp off; the kernel is bound by its tanh, so this costs nothing.
# `approximate` is a Python bool, so each form is its own trace and kernel.
@tf.function(jit_compile=True)
def _xla_gelu(x, approximate):
    return tf.cast(tf.nn.gelu(tf.cast(x, tf.float32), approximate=approximate), x.dtype)


def _bf16_onednn_inference(tokens, training):
    # The only graphs where the convolution forms beat the fused matmul: not in float32,
    # nor in training (the convolution's gradient is slower).
    return tokens.dtype == tf.bfloat16 and graph_kind.onednn_inference(training, tf.bfloat16)


def _by_rows(tokens, many, few):
    """`many()` from `CONV_MIN_ROWS` rows of `tokens` on, else `few()`: at trace time
    when the number of rows is static, else by a `tf.cond`."""
    rows = tokens.shape[0]
    if rows is not None:
        return many() if rows >= CONV_MIN_ROWS else few()
    return tf.cond(tf.shape(tokens)[0] >= CONV_MIN_ROWS, many, few)


def _as_matmul(tokens, kernel, bias, residual):
    # bias_add, not +: grappler folds r + (t @ W + b) into an AddN and fuses nothing.
    y = tf.nn.bias_add(tf.matmul(tokens, kernel), bias)
    return y if residual is None else residual + y


def _as_pointwise_conv(tokens, kernel, bias, residual):
    """The map as a 1x1 Conv2D over `[1, N, 1, K]`, with the same result bit for bit.

    Grappler fuses MatMul + BiasAdd into `_MklNativeFusedMatMul`, which oneDNN runs as
    an inner product on TF's plain weight layout: in bfloat16 that takes its AVX-512
    gemm, not the AMX kernels (`ONEDNN_VERBOSE=1`: `x64:gemm:jit`), far below the plain
    matmul's speed when K is the model width. The convolution, with its bias and
    residual, runs on AMX (`brgconv_1x1`) at the matmul's speed (docs/performance.md).
    In float32 the convolution is no faster, so float32 keeps the matmul.
    """
    width, out = kernel.shape
    y = tf.nn.conv2d(tf.reshape(tokens, [1, -1, 1, width]), tf.reshape(kernel, [1, 1, width, out]),
                     strides=1, padding="VALID")
    y = tf.nn.bias_add(y, bias)
    if residual is not None:
        # Fuses into the convolution only where grappler can tell that the shapes
        # match, which with a dynamic batch it cannot (measured no slower for it).
        y = tf.reshape(residual, [1, -1, 1, out]) + y
    return tf.reshape(y, [-1, out])
