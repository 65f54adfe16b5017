"""LayerNorm: Keras's LayerNormalization with a leaner graph, a hand-written gradient, and
oneDNN's single-pass kernel at inference."""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.layers import fast_paths


class Float32Weights:
    """For a normalisation layer: its input is not autocast, and its weights are float32
    and never autocast under any policy, a 16-bit-variable one ("bfloat16") included.
    They enter a float32 normalisation as they are, so the twin of
    `precision.compute_dtype_twin` matches its mixed model bit for bit, and the numbers
    do not change with the Keras version (Keras 3.15's GroupNormalization does this,
    earlier ones autocast)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.autocast = False

    def add_weight(self, *args, **kwargs):
        kwargs["autocast"] = False
        if kwargs.get("dtype") is None and self.variable_dtype in ("bfloat16", "float16"):
            kwargs["dtype"] = "float32"
        return super().add_weight(*args, **kwargs)


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerNorm(Float32Weights, keras.layers.LayerNormalization):
    """Keras's LayerNormalization (same weights, config and maths) over the last axis.

    `[..., D] -> [..., D]` in the compute dtype; statistics and the normalisation run
    in float32, as in Keras, and gamma and beta are float32 under any 16-bit policy,
    "bfloat16" included. Keras's graph broadcasts `rsqrt(var) * gamma` to the
    whole input and its autodiff gradient adds a Tile and several passes more. Here
    the forward pass is `(x - mean) * rstd * gamma + beta` and the gradient is the
    closed form, `rstd * (g - mean(g) - x_hat * mean(g * x_hat))` with `g = dy * gamma`
    (faster in training: docs/performance.md).

    At inference on CPUs with oneDNN, an input in the compute dtype takes
    `fast_paths.layer_norm_form`, oneDNN's own one-pass layer norm, with gamma and beta
    cast to that dtype.
    """

    def call(self, inputs, training=None):
        if (self.axis not in ([-1], [len(inputs.shape) - 1]) or self.rms_scaling
                or not (self.scale and self.center)):
            return super().call(inputs)
        # oneDNN's kernel takes an input in the compute dtype only: a wider one (float32
        # into a bf16 layer) is normalised in float32, as Keras does.
        fast = fast_paths.layer_norm_form(inputs, self.gamma, self.beta, self.epsilon, self.compute_dtype,
                                          training)
        if fast is not None:
            return fast
        return _layer_norm(inputs, self.gamma, self.beta, self.epsilon, self.compute_dtype)


def _layer_norm(inputs, gamma, beta, epsilon, out_dtype):
    """`(x - mean) / sqrt(var + eps) * gamma + beta` over the last axis, with its gradient."""
    in_dtype = inputs.dtype
    gamma = ops.cast(gamma, "float32")
    beta = ops.cast(beta, "float32")

    @ops.custom_gradient
    def forward(x, gamma, beta):
        x = ops.cast(x, "float32")
        centred = x - ops.mean(x, axis=-1, keepdims=True)
        rstd = ops.rsqrt(ops.mean(ops.square(centred), axis=-1, keepdims=True) + epsilon)
        x_hat = centred * rstd

        def backward(*args, upstream=None):
            dy = ops.cast(args[0] if upstream is None else upstream, "float32")
            leading = tuple(range(len(dy.shape) - 1))
            g = dy * gamma
            dx = rstd * (g - ops.mean(g, axis=-1, keepdims=True)
                         - x_hat * ops.mean(g * x_hat, axis=-1, keepdims=True))
            return (ops.cast(dx, in_dtype), ops.sum(dy * x_hat, axis=leading), ops.sum(dy, axis=leading))

        return ops.cast(x_hat * gamma + beta, out_dtype), backward

    return forward(inputs, gamma, beta)
