"""The faster forms of the encoder's ops, behind one switch.

The layers compute the paper's maths with the functions here (`dense`, `dense_gelu`,
`gelu`, `softmax`, `softmax_dtype`, `layer_norm_form`). Each takes its fast form only
where `enabled()` and where that form wins (docs/performance.md has the figures):

- at inference on CPUs where TF's oneDNN runs the graph's dtype (`hardware.onednn_runs`):
  the residual adds fused into the projections, LayerNorm as oneDNN's one-pass kernel,
  a bfloat16 softmax, and in bfloat16 the projections as 1x1 convolutions (oneDNN's
  inner product does not run bf16 on AMX) with fc1's GELU as an XLA kernel where the
  graph is never saved (TF Serving refuses XLA kernels on CPU);
- in training: the tanh-GELU's and the bfloat16 softmax's gradients as XLA kernels.

Elsewhere (AVX2-only cores, GPUs, under XLA) and with `KERAS_VIT_FAST_PATHS=0` or inside
`disabled()`, every function computes the plain form: the reference the fast forms are
tested against.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading

import keras
import tensorflow as tf

from keras_vit import hardware

_state = threading.local()

# From this many rows on, a bfloat16 map runs as a 1x1 convolution; below it the
# convolution's fixed cost loses (one 224 px image is 197 rows; two already gain).
CONV_MIN_ROWS = 384


def enabled() -> bool:
    """The one switch: False with `KERAS_VIT_FAST_PATHS=0` or inside `disabled()`, where
    every op takes its plain form. Read when a graph is traced."""
    return os.environ.get("KERAS_VIT_FAST_PATHS", "1") != "0" and not getattr(_state, "disabled", 0)


@contextlib.contextmanager
def _counted(name):
    # A per-thread depth, so that nested uses of one context nest.
    setattr(_state, name, getattr(_state, name, 0) + 1)
    try:
        yield
    finally:
        setattr(_state, name, getattr(_state, name) - 1)


def disabled():
    """A context: traces inside take the plain forms only (the reference)."""
    return _counted("disabled")


# --- What kind of graph is being traced ----------------------------------------------

def compiling_with_xla() -> bool:
    """True while tracing inside a `tf.function(jit_compile=True)`, Keras's
    `jit_compile=True` included: XLA fuses elementwise work itself, so the forms written
    for TF's own executor lose there."""
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))


def never_saved():
    """A context marking what is traced inside as a graph Keras runs in this process and
    never saves: `VisionTransformer.predict_step` and `test_step`."""
    return _counted("never_saved")


def xla_kernels_allowed() -> bool:
    """True where an inference graph may call XLA-compiled kernels: eagerly, or in a
    trace under `never_saved`. Any other trace may end up in a SavedModel, and TF
    Serving's CPU build refuses XLA kernels unless started with
    --xla_cpu_compilation_enabled."""
    return tf.executing_eagerly() or getattr(_state, "never_saved", 0) > 0


def onednn_inference(training, dtype) -> bool:
    """The predicate of the inference forms: fast paths on, not training, traced for TF's
    own executor (not XLA), and TF hands the graph's `dtype` ops to oneDNN here."""
    return enabled() and not training and not compiling_with_xla() and hardware.onednn_runs(dtype)


# --- Projections ---------------------------------------------------------------------

def dense(tokens, kernel, bias, residual=None, training=None, few_rows=False):
    """`tokens @ kernel + bias`, plus `residual` if given.

    Args:
      tokens: `[N, K]`.
      kernel: `[K, M]`, cast to the tokens' dtype.
      bias: `[M]`, cast to the tokens' dtype.
      residual: None or `[N, M]`.
      training: the Keras training flag.
      few_rows: the rows are one per image (the class token's): the matmul at any
        number, with no `tf.cond`, whose output would hide from grappler that the rows
        are the residual's (and the residual add would then not fuse).

    Returns:
      `[N, M]` in the tokens' dtype. Where TF runs oneDNN, product, bias and residual
      are one op (in the convolution form, the residual only with a static batch).
    """
    kernel, bias = tf.cast(kernel, tokens.dtype), tf.cast(bias, tokens.dtype)
    if few_rows or not _bf16_onednn_inference(tokens, training):
        return _as_matmul(tokens, kernel, bias, residual)
    return _by_rows(tokens, lambda: _as_pointwise_conv(tokens, kernel, bias, residual),
                    lambda: _as_matmul(tokens, kernel, bias, residual))


def dense_gelu(tokens, kernel, bias, approximate, training=None, few_rows=False):
    """`gelu(tokens @ kernel + bias)` at inference: the MLP's first map.

    Where TF runs oneDNN, product, bias and GELU are one op, an inner product, which in
    bfloat16 does not run on AMX; no convolution fuses a GELU. So where XLA kernels are
    allowed, bfloat16 inference from `CONV_MIN_ROWS` rows runs the map as the 1x1
    convolution, then the GELU as one XLA kernel.

    Args:
      tokens: `[N, K]`; kernel `[K, M]` and bias `[M]`, cast to the tokens' dtype.
      approximate: the tanh GELU if True, else the exact (erf) one.
      few_rows: one row per image: the fused op at any number (see `dense`).

    Returns:
      `[N, M]` in the tokens' dtype.
    """
    kernel, bias = tf.cast(kernel, tokens.dtype), tf.cast(bias, tokens.dtype)
    fused = lambda: tf.nn.gelu(_as_matmul(tokens, kernel, bias, None), approximate=approximate)  # noqa: E731
    if few_rows or not (_bf16_onednn_inference(tokens, training) and xla_kernels_allowed()):
        return fused()
    rows = tokens.shape[0]
    if rows is not None and rows < CONV_MIN_ROWS:
        return fused()
    # A dynamic number of rows takes this form too, with no tf.cond: inside a cond's
    # branch grappler no longer fuses the GELU into the matmul. Grappler infers no shape
    # out of an XLA call; with the shape asserted, fc2's residual add still fuses.
    return tf.ensure_shape(_xla_gelu(_as_pointwise_conv(tokens, kernel, bias, None), approximate),
                           [rows, kernel.shape[1]])


# In float32 inside the kernel, rounded to the input's dtype once: on bf16 input XLA
# would round after each of the GELU's ops. `approximate` is a Python bool, so each form
# is its own trace and kernel.
@tf.function(jit_compile=True)
def _xla_gelu(x, approximate):
    return tf.cast(tf.nn.gelu(tf.cast(x, tf.float32), approximate=approximate), x.dtype)


def _bf16_onednn_inference(tokens, training):
    # The only graphs where the convolution forms win: not float32, nor training (the
    # convolution's gradient is slower).
    return tokens.dtype == tf.bfloat16 and onednn_inference(training, tf.bfloat16)


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

    In bfloat16 grappler's fused MatMul + BiasAdd runs as oneDNN's inner product on TF's
    plain weight layout, which takes the AVX-512 gemm, not AMX (`ONEDNN_VERBOSE=1`:
    `x64:gemm:jit`); the convolution runs on AMX (`brgconv_1x1`).
    """
    width, out = kernel.shape
    y = tf.nn.conv2d(tf.reshape(tokens, [1, -1, 1, width]), tf.reshape(kernel, [1, 1, width, out]),
                     strides=1, padding="VALID")
    y = tf.nn.bias_add(y, bias)
    if residual is not None:
        # Fuses into the convolution only where grappler can tell that the shapes match,
        # which with a dynamic batch it cannot.
        y = tf.reshape(residual, [1, -1, 1, out]) + y
    return tf.reshape(y, [-1, out])


# --- Activations ---------------------------------------------------------------------

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def gelu(x, approximate, training=None):
    """GELU of `x` (any shape): in training, the tanh form's gradient in closed form as
    one XLA kernel each way (autodiff of `tf.nn.gelu` is about ten elementwise passes).
    Inference takes `dense_gelu`, which keeps XLA out of graphs that could be saved."""
    if training and approximate and enabled():
        return _gelu_tanh_for_training(x)
    return keras.activations.gelu(x, approximate=approximate)


@tf.function(jit_compile=True)
def _gelu_tanh_forward(x):
    t = tf.tanh(_GELU_C * x * (1.0 + _GELU_A * x * x))
    return 0.5 * x * (1.0 + t), t


@tf.function(jit_compile=True)
def _gelu_tanh_backward(x, t, dy):
    slope = _GELU_C * (1.0 + 3.0 * _GELU_A * x * x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope)


@tf.custom_gradient
def _gelu_tanh_for_training(x):
    y, t = _gelu_tanh_forward(x)
    return y, lambda dy: _gelu_tanh_backward(x, t, dy)


def softmax_dtype(compute_dtype) -> str:
    """The dtype attention's softmax runs in for a layer computing in `compute_dtype`.

    bfloat16 has float32's range, so its softmax is safe (as in flax) and saves two casts
    of `[B, H, T, T]`, where TF's oneDNN computes it in float32 inside. float16 overflows
    at 65504; under XLA only a float32 softmax maps to oneDNN's; and Eigen's bf16 softmax
    (cores where oneDNN does not run bf16) rounds its exps and sum in bf16. All float32.
    """
    if compute_dtype == "bfloat16" and enabled() and not compiling_with_xla() \
            and hardware.onednn_runs("bfloat16"):
        return "bfloat16"
    return "float32"


def softmax(logits, training=None):
    """Softmax over the last axis; in training on bfloat16 logits its gradient is one
    XLA kernel (float32 inside) where TF's is four passes over `[B, H, T, T]`."""
    if training and logits.dtype == "bfloat16" and enabled():
        return _softmax_for_training(logits)
    return keras.ops.softmax(logits, axis=-1)


@tf.function(jit_compile=True)
def _softmax_backward(y, dy):
    y32, dy32 = tf.cast(y, tf.float32), tf.cast(dy, tf.float32)
    return tf.cast((dy32 - tf.reduce_sum(dy32 * y32, axis=-1, keepdims=True)) * y32, dy.dtype)


@tf.custom_gradient
def _softmax_for_training(logits):
    weights = tf.nn.softmax(logits, axis=-1)
    return weights, lambda dy: _softmax_backward(weights, dy)


# --- LayerNorm -----------------------------------------------------------------------

def layer_norm_form(inputs, gamma, beta, epsilon, dtype, training=None):
    """LayerNorm over the last axis of a rank-2 or rank-3 `inputs` in `dtype` (float32 or
    bfloat16) as grappler matches it for oneDNN's one-pass `_MklLayerNorm`, where that
    rewrite happens (`onednn_inference`); None elsewhere, for the caller's plain form.

    The pattern (TF's remapper, FindMklLayerNorm) is Keras 2's: the input reshaped to
    `[1, rows, D, 1]` NCHW, a training-mode FusedBatchNormV3 with `Fill`ed unit scale and
    zero offset and empty mean and variance, reshaped back, times gamma plus beta. A
    SavedModel holding it computes the same where the rewrite does not happen.
    """
    if len(inputs.shape) not in (2, 3) or dtype not in ("float32", "bfloat16") \
            or keras.backend.standardize_dtype(inputs.dtype) != dtype:
        return None
    if not onednn_inference(training, dtype):
        return None
    shape = tf.shape(inputs)
    rows = tf.reduce_prod(shape[:-1])
    # With a static batch, constant folding would turn the Fills into Consts and the
    # remapper would no longer match; a PlaceholderWithDefault is never folded.
    rows = tf.raw_ops.PlaceholderWithDefault(input=rows, shape=[])
    fill_shape = tf.reshape(rows, [1])
    y, *_ = tf.raw_ops.FusedBatchNormV3(
        x=tf.reshape(inputs, tf.stack([1, rows, shape[-1], 1])),
        scale=tf.fill(fill_shape, tf.constant(1.0, tf.float32)),
        offset=tf.fill(fill_shape, tf.constant(0.0, tf.float32)),
        mean=tf.constant([], tf.float32), variance=tf.constant([], tf.float32),
        epsilon=float(epsilon), data_format="NCHW", is_training=True)
    return tf.reshape(y, shape) * tf.cast(gamma, dtype) + tf.cast(beta, dtype)
