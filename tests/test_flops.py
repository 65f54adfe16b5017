"""FLOPs accounting: the published counts, and agreement with the built model's weights."""

import numpy as np
import pytest

import keras_vit
from keras_vit.flops import forward_macs


@pytest.mark.parametrize("name, gmacs", [("ViT-Ti/16", 1.26), ("ViT-S/16", 4.61), ("ViT-B/16", 17.58),
                                         ("ViT-B/32", 4.41), ("ViT-L/16", 61.60), ("ViT-H/14", 167.40)])
def test_published_counts_at_224(name, gmacs):
    assert round(forward_macs(name) / 1e9, 2) == gmacs


def test_dense_parts_equal_tokens_times_kernel_sizes():
    model = keras_vit.create_model("ViT-Ti/16", num_classes=10, image_size=64, representation_size=32)
    parts = forward_macs(model, breakdown=True)
    t = model.config.seq_len
    size = lambda v: int(np.prod(v.shape))  # noqa: E731
    assert parts["attention_projections"] == t * sum(
        size(b.attention.qkv_kernel) + size(b.attention.out_kernel) for b in model.blocks)
    assert parts["mlp"] == t * sum(size(b.mlp.fc1.kernel) + size(b.mlp.fc2.kernel) for b in model.blocks)
    assert parts["patch_embedding"] == (t - 1) * size(model.patch_embed.kernel)
    assert parts["pre_logits"] == size(model.pre_logits.kernel)
    assert parts["head"] == size(model.head.kernel)
    assert parts["attention_matmuls"] == 12 * 2 * t * t * 192
    assert sum(parts.values()) == forward_macs(model.config)


def test_resnet_convs_equal_output_size_times_kernel_size():
    model = keras_vit.create_model("R26+ViT-S/32", num_classes=10, image_size=64)
    stem = model.resnet
    shape = (1, 64, 64, 3)
    total = 0
    x_shape = stem.conv_root.compute_output_shape(shape)
    total += int(np.prod(x_shape[1:3])) * int(np.prod(stem.conv_root.kernel.shape))
    x_shape = stem.pool.compute_output_shape(x_shape)
    for unit in stem.units:
        out = unit.compute_output_shape(x_shape)
        for conv, in_shape in ((unit.conv1, x_shape), (unit.conv_proj, x_shape)):
            if conv is not None:
                total += int(np.prod(conv.compute_output_shape(in_shape)[1:3])) * int(np.prod(conv.kernel.shape))
        mid = unit.conv1.compute_output_shape(x_shape)
        total += int(np.prod(out[1:3])) * (int(np.prod(unit.conv2.kernel.shape)) + int(np.prod(unit.conv3.kernel.shape)))
        del mid
        x_shape = out
    assert forward_macs(model, breakdown=True)["resnet_conv"] == total


def test_rejects_other_things():
    with pytest.raises(TypeError):
        forward_macs(3)
