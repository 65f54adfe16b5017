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

    def conv_macs(output_shape, conv):
        return int(np.prod(output_shape[1:3])) * int(np.prod(conv.kernel.shape))

    x_shape = stem.conv_root.compute_output_shape(shape)
    total = conv_macs(x_shape, stem.conv_root)
    x_shape = stem.pool.compute_output_shape(x_shape)
    for unit in stem.units:
        out = unit.compute_output_shape(x_shape)
        for conv in (unit.conv1, unit.conv_proj):
            if conv is not None:
                total += conv_macs(conv.compute_output_shape(x_shape), conv)
        total += conv_macs(out, unit.conv2) + conv_macs(out, unit.conv3)
        x_shape = out
    assert forward_macs(model, breakdown=True)["resnet_conv"] == total


def test_rejects_other_things():
    with pytest.raises(TypeError):
        forward_macs(3)


def _graph_macs(model, image_size):
    """MACs of the MatMul, BatchMatMulV2 and Conv2D ops in the traced inference graph."""
    import tensorflow as tf

    spec = tf.TensorSpec((1, image_size, image_size, 3), tf.float32)
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
    total = 0
    for op in graph.get_operations():
        if op.type in ("MatMul", "BatchMatMulV2"):
            a = op.inputs[0].shape.as_list()
            contracted = a[-2] if op.get_attr("adj_x" if op.type != "MatMul" else "transpose_a") else a[-1]
            total += int(np.prod(op.outputs[0].shape.as_list())) * contracted
        elif op.type == "Conv2D":
            kh, kw, cin, _ = op.inputs[1].shape.as_list()
            total += int(np.prod(op.outputs[0].shape.as_list())) * kh * kw * cin
    return total


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_executed_count_is_what_the_traced_graph_multiplies(classifier):
    # With a class-token head, a last block that carried every token would count more.
    model = keras_vit.create_model("ViT-Ti/16", num_classes=10, image_size=64, num_layers=3,
                                   classifier=classifier)
    parts = forward_macs(model, breakdown=True, executed=True)
    products = sum(v for k, v in parts.items() if k != "norms")
    assert _graph_macs(model, 64) == products
    full = forward_macs(model)
    if classifier == "token":
        assert sum(parts.values()) < full
    else:
        assert sum(parts.values()) == full
