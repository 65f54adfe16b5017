"""The Transformer encoder block: pre-LayerNorm attention and MLP, each with a residual."""

from __future__ import annotations

import functools
import math

import keras
import tensorflow as tf
from keras import ops

from keras_vit.layers import projection
from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.normalization import LayerNorm


@keras.saving.register_keras_serializable(package="keras_vit")
class StochasticDepth(keras.layers.Layer):
    """Drops a whole residual branch per example with probability `rate` while training.

    Kept branches are scaled by 1 / (1 - rate) so the expectation is unchanged.
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=None):
        if not training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = ops.floor(keep + keras.random.uniform(shape, seed=self.seed_generator, dtype=x.dtype))
        return x / ops.cast(keep, x.dtype) * mask

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


@tf.function(jit_compile=True)
def _gelu_tanh_forward(x):
    t = tf.tanh(_GELU_C * x * (1.0 + _GELU_A * x * x))
    return 0.5 * x * (1.0 + t), t


@tf.function(jit_compile=True)
def _gelu_tanh_backward(x, t, dy):
    slope = _GELU_C * (1.0 + 3.0 * _GELU_A * x * x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope)


@tf.custom_gradient
def gelu_tanh_for_training(x):
    """tanh-GELU with its closed-form gradient, each side one XLA-fused kernel.

    Autodiff of `tf.nn.gelu` is about ten elementwise passes (Pow, Tanh, TanhGrad and
    Muls), slow in bf16 on CPU. With this, ViT-Ti/16 bf16 train steps (batch 32) ran
    1.53x faster on AMX cores, side by side in one process. Only for training:
    inference takes `projection.project_gelu`, which keeps XLA out of any graph that
    could be saved (TF Serving refuses XLA kernels on CPU by default).
    """
    y, t = _gelu_tanh_forward(x)
    return y, lambda dy: _gelu_tanh_backward(x, t, dy)


@keras.saving.register_keras_serializable(package="keras_vit")
class MlpBlock(keras.layers.Layer):
    """Dense(mlp_dim) -> GELU -> dropout -> Dense(D) -> dropout, on `[B, T, D]`."""

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu_approximate=True, **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.gelu_approximate = bool(gelu_approximate)
        bias_init = keras.initializers.RandomNormal(stddev=1e-6)
        self.fc1 = keras.layers.Dense(self.mlp_dim, kernel_initializer="glorot_uniform",
                                      bias_initializer=bias_init, dtype=self.dtype_policy, name="Dense_0")
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)
        self._fc2_bias_init = bias_init

    def build(self, input_shape):
        self.fc1.build(input_shape)
        self.fc2 = keras.layers.Dense(input_shape[-1], kernel_initializer="glorot_uniform",
                                      bias_initializer=self._fc2_bias_init, dtype=self.dtype_policy,
                                      name="Dense_1")
        self.fc2.build(tuple(input_shape[:-1]) + (self.mlp_dim,))

    def call(self, x, training=None):
        # Dense on [B*T, D], not [B, T, D]: see MultiHeadSelfAttention.call.
        return ops.reshape(self.transform(ops.reshape(x, (-1, x.shape[-1])), training), ops.shape(x))

    def transform(self, tokens, training=None, residual=None, few_rows=False):
        """The block on tokens flattened to `[B * T, D]`.

        With `residual` (`[B * T, D]`, at inference only, where dropout is the
        identity) the result is `residual + block(tokens)`, added inside fc2's op.
        `few_rows`: one token per image (see `projection.project`).
        """
        if residual is not None and training:
            raise ValueError("a residual is fused into fc2 at inference only")
        if not training:
            x = projection.project_gelu(tokens, self.fc1.kernel, self.fc1.bias, self.gelu_approximate,
                                        few_rows=few_rows)
        elif self.gelu_approximate:
            x = gelu_tanh_for_training(self.fc1(tokens))
        else:
            x = keras.activations.gelu(self.fc1(tokens), approximate=False)
        x = self.dropout(x, training=training)
        x = projection.project(x, self.fc2.kernel, self.fc2.bias, residual, training, few_rows)
        return self.dropout(x, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "mlp_dim": self.mlp_dim, "dropout_rate": self.dropout_rate,
                "gelu_approximate": self.gelu_approximate}


@keras.saving.register_keras_serializable(package="keras_vit")
class EncoderBlock(keras.layers.Layer):
    """x + attn(LN(x)), then x + mlp(LN(x)), on `[B, T, D]` tokens.

    `call(x, return_attention=True)` returns `(tokens, attention [B, H, T, T])`.
    """

    def __init__(self, num_heads, mlp_dim, dropout_rate=0.0, attention_dropout_rate=0.0,
                 stochastic_depth_rate=0.0, layer_norm_epsilon=1e-6, gelu_approximate=True,
                 relative_grid=None, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.stochastic_depth_rate = float(stochastic_depth_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.relative_grid = None if relative_grid is None else tuple(int(g) for g in relative_grid)
        self.num_prefix_tokens = int(num_prefix_tokens)
        policy = self.dtype_policy
        self.norm1 = LayerNorm(epsilon=self.layer_norm_epsilon, dtype=policy, name="LayerNorm_0")
        self.attention = MultiHeadSelfAttention(
            self.num_heads, self.attention_dropout_rate, relative_grid=self.relative_grid,
            num_prefix_tokens=self.num_prefix_tokens, dtype=policy, name="MultiHeadDotProductAttention_1")
        self.norm2 = LayerNorm(epsilon=self.layer_norm_epsilon, dtype=policy, name="LayerNorm_2")
        self.mlp = MlpBlock(self.mlp_dim, self.dropout_rate, self.gelu_approximate, dtype=policy,
                            name="MlpBlock_3")
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=policy)
        self.drop_path = StochasticDepth(self.stochastic_depth_rate, dtype=policy)

    def build(self, input_shape):
        for layer in (self.norm1, self.attention, self.norm2, self.mlp):
            layer.build(input_shape)

    def call(self, x, training=None, return_attention=False, class_token_only=False):
        """`[B, T, D]` -> `[B, T, D]`, or `[B, 1, D]` with `class_token_only`: then only
        the first token (the class token, when the head reads nothing else) attends
        and goes through the MLP, with all T tokens as keys and values. With
        `return_attention`, also the weights `[B, H, T or 1, T]` in float32."""
        shape = ops.shape(x)
        # The residual stream is [B*T, D] (or [B, D]) inside the block, so that at
        # inference each residual add fuses into the projection before it (one oneDNN
        # op): the out projection's and fc2's.
        if class_token_only:
            # Gathers, not x[:, 0], and norm1 on [B, T, D], not on the flattened
            # tokens: grappler then sees that the rows are x's batch and still rewrites
            # norm1 into oneDNN's layer norm, so the residual adds fuse and a static and
            # a dynamic batch compute alike (tests/test_layers.py).
            normed = self.norm1(x)
            attend = functools.partial(self.attention.attend_first, ops.reshape(normed, (-1, x.shape[-1])),
                                       tf.gather(normed, 0, axis=1), tf.shape(x))
            x = tf.gather(x, 0, axis=1)
            shape = (shape[0], 1, shape[2])
        else:
            x = ops.reshape(x, (-1, x.shape[-1]))
            attend = functools.partial(self.attention.attend, self.norm1(x), shape[0], shape[1])
        if training:
            y, weights = attend(training=True)
            x = x + self._drop_path(self.dropout(y, training=True), shape)
            x = x + self._drop_path(self.mlp.transform(self.norm2(x), training=True), shape)
        else:
            x, weights = attend(residual=x)
            x = self.mlp.transform(self.norm2(x), residual=x, few_rows=class_token_only)
        x = ops.reshape(x, shape)
        if return_attention:
            return x, ops.cast(weights, "float32")
        return x

    def compute_output_spec(self, x, training=None, return_attention=False, class_token_only=False):
        # Shapes from the arguments, without tracing `call` for every block of a model.
        batch, seq, dim = x.shape
        out = keras.KerasTensor((batch, 1 if class_token_only else seq, dim), dtype=self.compute_dtype)
        if return_attention:
            return out, keras.KerasTensor((batch, self.num_heads, out.shape[1], seq), dtype="float32")
        return out

    def _drop_path(self, y, shape):
        # In training only. Stochastic depth drops whole examples: the [B, T, D] view.
        if self.drop_path.rate == 0.0:
            return y
        return ops.reshape(self.drop_path(ops.reshape(y, shape), training=True), ops.shape(y))

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "stochastic_depth_rate": self.stochastic_depth_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            "relative_grid": None if self.relative_grid is None else list(self.relative_grid),
            "num_prefix_tokens": self.num_prefix_tokens,
        }
