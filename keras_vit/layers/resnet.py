"""The BiT ResNet of the hybrid models: weight-standardised convs and GroupNorm(32).

Keras has GroupNormalization but no weight-standardised convolution, so StdConv2D
is written here (tensorflow-addons, which had one, is end of life). GroupNorm is
Keras's layer with a faster `call`.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_vit.layers.normalization import Float32Weights


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Conv2D):
    """Conv2D whose kernel is standardised per output filter before every use.

    w' = (w - mean(w)) / (std(w) + eps) over (kh, kw, in), as BiT does; computed in
    float32 even under mixed precision.
    """

    def __init__(self, filters, kernel_size, eps=1e-5, **kwargs):
        kwargs.setdefault("padding", "same")
        kwargs.setdefault("use_bias", False)
        kwargs.setdefault("kernel_initializer", "lecun_normal")
        super().__init__(filters, kernel_size, **kwargs)
        self.eps = float(eps)

    def convolution_op(self, inputs, kernel):
        w = ops.cast(kernel, "float32")
        mean = ops.mean(w, axis=(0, 1, 2), keepdims=True)
        std = ops.std(w, axis=(0, 1, 2), keepdims=True)
        w = (w - mean) / (std + self.eps)
        return super().convolution_op(inputs, ops.cast(w, inputs.dtype))

    def get_config(self):
        return {**super().get_config(), "eps": self.eps}


@keras.saving.register_keras_serializable(package="keras_vit")
class GroupNorm(Float32Weights, keras.layers.GroupNormalization):
    """Keras's GroupNormalization (same weights, config and maths) for channels-last inputs.

    `[B, ..., C] -> [B, ..., C]`. TF reduces Keras's `[B, H, W, G, C/G]` view over
    (1, 2, 4) slowly: here the spatial axes are reduced first, to `[B, C]`, then each
    group, and the result is applied as one float32 scale and shift per image and
    channel. The variance is E[x^2] - E[x]^2, as in flax's GroupNorm, which the
    official models were trained with (faster: docs/performance.md).

    Under any policy the input is normalised as it comes, gamma and beta are float32
    (`Float32Weights`) and the output is in the compute dtype.
    """

    def call(self, inputs):
        rank = len(inputs.shape)
        if self.axis not in (-1, rank - 1) or rank < 3:
            return ops.cast(super().call(inputs), self.compute_dtype)
        channels = inputs.shape[-1]
        size = channels // self.groups
        spatial = tuple(range(1, rank - 1))
        x = ops.cast(inputs, "float32")

        def per_channel_of_group_mean(t):  # [B, C] -> the mean of each group, [B, C]
            t = ops.mean(ops.reshape(t, (-1, self.groups, size)), axis=-1, keepdims=True)
            return ops.reshape(ops.repeat(t, size, axis=-1), (-1, channels))

        mean = per_channel_of_group_mean(ops.mean(x, axis=spatial))
        mean_sq = per_channel_of_group_mean(ops.mean(ops.square(x), axis=spatial))
        scale = ops.rsqrt(ops.maximum(mean_sq - ops.square(mean), 0.0) + self.epsilon)
        if self.scale:
            scale = scale * ops.cast(self.gamma, "float32")
        shift = -mean * scale
        if self.center:
            shift = shift + ops.cast(self.beta, "float32")
        per_image = lambda t: ops.reshape(t, (-1,) + (1,) * len(spatial) + (channels,))  # noqa: E731
        return ops.cast(x * per_image(scale) + per_image(shift), self.compute_dtype)


def _group_norm(name, policy, zero_init=False):
    return GroupNorm(
        groups=32, epsilon=1e-6, gamma_initializer="zeros" if zero_init else "ones",
        dtype=policy, name=name)


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """Pre-activation-free BiT bottleneck: 1x1 -> 3x3 (strided) -> 1x1 (x4 width), + residual.

    `[B, H, W, C] -> [B, H / stride, W / stride, 4 * features]`. The residual is
    projected (StdConv 1x1 + GroupNorm) when the width or the stride changes.
    """

    def __init__(self, features, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.features = int(features)
        self.strides = int(strides)
        p = self.dtype_policy
        self.conv1 = StdConv2D(self.features, 1, dtype=p, name="conv1")
        self.gn1 = _group_norm("gn1", p)
        self.conv2 = StdConv2D(self.features, 3, strides=self.strides, dtype=p, name="conv2")
        self.gn2 = _group_norm("gn2", p)
        self.conv3 = StdConv2D(4 * self.features, 1, dtype=p, name="conv3")
        # Zero-init of the last scale makes every unit start as the identity (BiT).
        self.gn3 = _group_norm("gn3", p, zero_init=True)
        self.conv_proj = None
        self.gn_proj = None

    def build(self, input_shape):
        h, w = input_shape[1], input_shape[2]
        if input_shape[-1] != 4 * self.features or self.strides != 1:
            self.conv_proj = StdConv2D(4 * self.features, 1, strides=self.strides,
                                       dtype=self.dtype_policy, name="conv_proj")
            self.gn_proj = _group_norm("gn_proj", self.dtype_policy)
        down = lambda n: None if n is None else -(-n // self.strides)  # noqa: E731 (SAME padding)
        shapes = {
            "in": input_shape,
            "mid": (input_shape[0], h, w, self.features),
            "out": (input_shape[0], down(h), down(w), self.features),
            "wide": (input_shape[0], down(h), down(w), 4 * self.features),
        }
        self.conv1.build(shapes["in"])
        self.gn1.build(shapes["mid"])
        self.conv2.build(shapes["mid"])
        self.gn2.build(shapes["out"])
        self.conv3.build(shapes["out"])
        self.gn3.build(shapes["wide"])
        if self.conv_proj is not None:
            self.conv_proj.build(shapes["in"])
            self.gn_proj.build(shapes["wide"])

    def call(self, x):
        residual = x
        if self.conv_proj is not None:
            residual = self.gn_proj(self.conv_proj(x))
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        down = lambda n: None if n is None else -(-n // self.strides)  # noqa: E731
        return (input_shape[0], down(input_shape[1]), down(input_shape[2]), 4 * self.features)

    def get_config(self):
        return {**super().get_config(), "features": self.features, "strides": self.strides}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(keras.layers.Layer):
    """The BiT ResNet in front of a hybrid ViT: root block, then bottleneck stages.

    Root: StdConv 7x7/2 -> GroupNorm -> ReLU -> max-pool 3x3/2 (SAME). Stage i has
    `num_layers[i]` units of width `64 * width_factor * 2**i`, stride 2 from the second
    stage on. `[B, H, W, 3] -> [B, H / s, W / s, C]` with s = 4 * 2**(stages - 1).
    """

    def __init__(self, num_layers, width_factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = tuple(int(n) for n in num_layers)
        self.width_factor = float(width_factor)
        width = int(64 * self.width_factor)
        p = self.dtype_policy
        self.conv_root = StdConv2D(width, 7, strides=2, dtype=p, name="conv_root")
        self.gn_root = _group_norm("gn_root", p)
        self.pool = keras.layers.MaxPooling2D(3, strides=2, padding="same", dtype=p)
        # One flat list: Keras's saver does not look inside nested lists.
        self.units = [
            BottleneckUnit(width * 2 ** i, 2 if (i > 0 and u == 0) else 1, dtype=p,
                           name=f"block{i + 1}_unit{u + 1}")
            for i, count in enumerate(self.num_layers) for u in range(count)
        ]

    @property
    def stages(self):
        """The units grouped by stage: `stages[i][u]` is official `block{i+1}/unit{u+1}`."""
        out, start = [], 0
        for count in self.num_layers:
            out.append(self.units[start:start + count])
            start += count
        return out

    def build(self, input_shape):
        self.conv_root.build(input_shape)
        shape = self.conv_root.compute_output_shape(input_shape)
        self.gn_root.build(shape)
        shape = self.pool.compute_output_shape(shape)
        for unit in self.units:
            unit.build(shape)
            shape = unit.compute_output_shape(shape)

    def call(self, images):
        x = ops.relu(self.gn_root(self.conv_root(images)))
        x = self.pool(x)
        for unit in self.units:
            x = unit(x)
        return x

    def compute_output_shape(self, input_shape):
        shape = self.pool.compute_output_shape(self.conv_root.compute_output_shape(input_shape))
        for unit in self.units:
            shape = unit.compute_output_shape(shape)
        return shape

    def get_config(self):
        return {**super().get_config(), "num_layers": list(self.num_layers),
                "width_factor": self.width_factor}
