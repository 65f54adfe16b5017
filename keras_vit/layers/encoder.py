"""The Transformer encoder block: pre-LayerNorm attention and MLP, each with a residual."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from keras_vit.layers import fast_paths
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
        """The block on tokens flattened to `[B * T, D]`, plus `residual` (`[B * T, D]`,
        at inference only, where dropout is the identity) added inside fc2's op.
        `few_rows`: one token per image (see `fast_paths.dense`)."""
        if residual is not None and training:
            raise ValueError("a residual is added inside fc2 at inference only")
        if training:
            x = fast_paths.gelu(self.fc1(tokens), self.gelu_approximate, training=True)
        else:
            x = fast_paths.dense_gelu(tokens, self.fc1.kernel, self.fc1.bias, self.gelu_approximate,
                                      few_rows=few_rows)
        x = fast_paths.dense(self.dropout(x, training=training), self.fc2.kernel, self.fc2.bias, residual,
                             training, few_rows)
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
                 relative_grid=None, num_prefix_tokens=0, relative_kind="bias", **kwargs):
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
        self.relative_kind = relative_kind
        policy = self.dtype_policy
        self.norm1 = LayerNorm(epsilon=self.layer_norm_epsilon, dtype=policy, name="LayerNorm_0")
        self.attention = MultiHeadSelfAttention(
            self.num_heads, self.attention_dropout_rate, relative_grid=self.relative_grid,
            num_prefix_tokens=self.num_prefix_tokens, relative_kind=self.relative_kind, dtype=policy,
            name="MultiHeadDotProductAttention_1")
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
        the first token (the class token, when the head reads nothing else) attends and
        goes through the MLP, with all T tokens as keys and values. With
        `return_attention`, also the weights `[B, H, T or 1, T]` in float32."""
        shape = ops.shape(x)
        # The residual stream runs as rows, [B*T, D] (or [B, D]), so that at inference
        # each residual add fuses into the projection before it. For the class token,
        # gathers on [B, T, D], not x[:, 0] after norm1 on rows: grappler then sees the
        # rows are x's batch, rewrites norm1 into oneDNN's layer norm, and the adds fuse.
        if class_token_only:
            tokens = self.norm1(x)
            x = tf.gather(x, 0, axis=1)
        else:
            x = ops.reshape(x, (-1, x.shape[-1]))
            tokens = self.norm1(x)
        if training:
            y, weights = self.attention.attend(tokens, shape, training=True, first_only=class_token_only)
            x = x + self._drop_path(self.dropout(y, training=True), shape)
            x = x + self._drop_path(self.mlp.transform(self.norm2(x), training=True), shape)
        else:  # dropout and drop path are the identity: each add goes inside a projection
            x, weights = self.attention.attend(tokens, shape, residual=x, first_only=class_token_only)
            x = self.mlp.transform(self.norm2(x), residual=x, few_rows=class_token_only)
        x = ops.reshape(x, (shape[0], 1 if class_token_only else shape[1], shape[2]))
        return (x, ops.cast(weights, "float32")) if return_attention else x

    def compute_output_spec(self, x, training=None, return_attention=False, class_token_only=False):
        # Shapes from the arguments, without tracing `call` for every block of a model.
        batch, seq, dim = x.shape
        out = keras.KerasTensor((batch, 1 if class_token_only else seq, dim), dtype=self.compute_dtype)
        if return_attention:
            return out, keras.KerasTensor((batch, self.num_heads, out.shape[1], seq), dtype="float32")
        return out

    def _drop_path(self, y, shape):
        # Stochastic depth drops whole examples: the [B, T, D] view of the rows.
        if self.drop_path.rate == 0.0:
            return y
        view = (shape[0], -1, shape[2])
        return ops.reshape(self.drop_path(ops.reshape(y, view), training=True), ops.shape(y))

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
            "relative_kind": self.relative_kind,
        }
