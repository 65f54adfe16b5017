"""Every layer through Keras's own layer test harness, plus the maths each one owns."""

import contextlib

import numpy as np
import pytest
from keras import ops
from keras.src import testing

import bf16_bounds
from bf16_bounds import Bounded, assert_within
from conftest import skip_unless_onednn, skip_unless_xla_runs_bf16_products
from keras_vit import hardware, layers
from keras_vit.layers import fast_paths
from keras_vit.layers.attention import num_relative_positions, relative_position_index
from keras_vit.layers.embedding import sincos_2d


class LayerHarnessTest(testing.TestCase):
    def test_patch_embedding(self):
        self.run_layer_test(layers.PatchEmbedding, {"hidden_size": 8, "patch_size": (4, 4)},
                            input_shape=(2, 16, 8, 3), expected_output_shape=(2, 8, 8),
                            expected_num_trainable_weights=2)

    def test_class_token(self):
        self.run_layer_test(layers.ClassToken, {}, input_shape=(2, 5, 8), expected_output_shape=(2, 6, 8),
                            expected_num_trainable_weights=1)

    def test_position_embedding_learned(self):
        self.run_layer_test(layers.PositionEmbedding,
                            {"kind": "learned", "grid_size": (2, 3), "num_prefix_tokens": 1},
                            input_shape=(2, 7, 8), expected_output_shape=(2, 7, 8),
                            expected_num_trainable_weights=1)

    def test_position_embedding_sincos(self):
        self.run_layer_test(layers.PositionEmbedding, {"kind": "sincos2d", "grid_size": (2, 2)},
                            input_shape=(2, 4, 8), expected_output_shape=(2, 4, 8),
                            expected_num_trainable_weights=0, run_training_check=False)

    def test_attention(self):
        self.run_layer_test(layers.MultiHeadSelfAttention, {"num_heads": 2, "dropout_rate": 0.1},
                            input_shape=(2, 5, 8), expected_output_shape=(2, 5, 8),
                            expected_num_trainable_weights=4, expected_num_seed_generators=1)

    def test_attention_relative_bias(self):
        self.run_layer_test(layers.MultiHeadSelfAttention,
                            {"num_heads": 2, "relative_grid": (2, 2), "num_prefix_tokens": 1},
                            input_shape=(2, 5, 8), expected_output_shape=(2, 5, 8),
                            expected_num_trainable_weights=5, expected_num_seed_generators=0)

    def test_attention_relative_attention(self):
        self.run_layer_test(layers.MultiHeadSelfAttention,
                            {"num_heads": 2, "relative_grid": (2, 2), "num_prefix_tokens": 1,
                             "relative_kind": "attention"},
                            input_shape=(2, 5, 8), expected_output_shape=(2, 5, 8),
                            expected_num_trainable_weights=5, expected_num_seed_generators=0)

    def test_mlp_block(self):
        self.run_layer_test(layers.MlpBlock, {"mlp_dim": 16, "dropout_rate": 0.1}, input_shape=(2, 5, 8),
                            expected_output_shape=(2, 5, 8), expected_num_trainable_weights=4,
                            expected_num_seed_generators=1)

    def test_stochastic_depth(self):
        self.run_layer_test(layers.StochasticDepth, {"rate": 0.5, "seed": 1}, input_shape=(4, 5, 8),
                            expected_output_shape=(4, 5, 8), expected_num_trainable_weights=0,
                            expected_num_seed_generators=1, run_training_check=False)

    def test_encoder_block(self):
        self.run_layer_test(layers.EncoderBlock,
                            {"num_heads": 2, "mlp_dim": 16, "dropout_rate": 0.1,
                             "stochastic_depth_rate": 0.1},
                            input_shape=(2, 5, 8), expected_output_shape=(2, 5, 8),
                            expected_num_trainable_weights=12)

    def test_std_conv(self):
        self.run_layer_test(layers.StdConv2D, {"filters": 4, "kernel_size": 3, "strides": 2},
                            input_shape=(2, 8, 8, 3), expected_output_shape=(2, 4, 4, 4),
                            expected_num_trainable_weights=1)

    def test_layer_norm(self):
        self.run_layer_test(layers.LayerNorm, {"epsilon": 1e-6}, input_shape=(2, 5, 8),
                            expected_output_shape=(2, 5, 8), expected_num_trainable_weights=2)

    def test_group_norm(self):
        self.run_layer_test(layers.GroupNorm, {"groups": 4, "epsilon": 1e-6}, input_shape=(2, 3, 5, 8),
                            expected_output_shape=(2, 3, 5, 8), expected_num_trainable_weights=2)

    def test_bottleneck_projection(self):
        self.run_layer_test(layers.BottleneckUnit, {"features": 32, "strides": 2}, input_shape=(2, 8, 8, 64),
                            expected_output_shape=(2, 4, 4, 128), expected_num_trainable_weights=12)

    def test_bottleneck_identity(self):
        self.run_layer_test(layers.BottleneckUnit, {"features": 32}, input_shape=(2, 8, 8, 128),
                            expected_output_shape=(2, 8, 8, 128), expected_num_trainable_weights=9)

    def test_resnet_stem(self):
        self.run_layer_test(layers.ResNetStem, {"num_layers": (1, 1), "width_factor": 0.5},
                            input_shape=(2, 32, 32, 3), expected_output_shape=(2, 4, 4, 256),
                            expected_num_trainable_weights=3 + 12 + 12)


def test_sincos_values_and_similarity_falls_with_distance():
    table = sincos_2d((4, 5), 16)
    assert table.shape == (20, 16)
    # Row 0 is position (0, 0): sin terms 0, cos terms 1.
    np.testing.assert_allclose(table[0], [0] * 4 + [1] * 4 + [0] * 4 + [1] * 4, atol=1e-7)
    # Position (1, 2) is row 7: x = 2 with the highest frequency 1.
    assert table[7, 0] == pytest.approx(np.sin(2.0), abs=1e-6)
    assert table[7, 8] == pytest.approx(np.sin(1.0), abs=1e-6)
    sims = table @ table[0]
    assert sims[0] > sims[1] > sims[3]


def test_relative_position_index_is_translation_invariant():
    idx = relative_position_index((3, 4), num_prefix_tokens=1)
    assert idx.shape == (13, 13)
    assert idx.max() == num_relative_positions((3, 4), 1) - 1
    # Patch (0,0)->(1,1) and (1,2)->(2,3) share an offset, so an index.
    assert idx[1 + 0, 1 + 5] == idx[1 + 6, 1 + 11]
    assert idx[1 + 0, 1 + 5] != idx[1 + 5, 1 + 0]
    assert len({idx[0, 1], idx[1, 0], idx[0, 0]}) == 3
    assert len(np.unique(idx[1:, 1:])) == (2 * 3 - 1) * (2 * 4 - 1)


def test_the_papers_relative_offsets_are_1d_in_raster_order():
    """Each pair of patches indexes its offset p_q - p_k in raster order (the paper's
    1-dimensional relative attention), whatever the 2D grid; the class token's pairs
    have rows of their own."""
    idx = relative_position_index((3, 4), num_prefix_tokens=1, kind="attention")
    n = 12
    assert idx.shape == (13, 13) and num_relative_positions((3, 4), 1, "attention") == 2 * n - 1 + 3
    patches = idx[1:, 1:]
    for q in range(n):
        for k in range(n):
            assert patches[q, k] == q - k + n - 1
    # (0,3) -> (1,0) is one step in raster order, as (0,0) -> (0,1) is; in 2D they differ.
    assert patches[4, 3] == patches[1, 0]
    in_2d = relative_position_index((3, 4), 1)
    assert in_2d[1 + 4, 1 + 3] != in_2d[1 + 1, 1 + 0]
    assert sorted({idx[0, 1], idx[1, 0], idx[0, 0]}) == [2 * n - 1, 2 * n, 2 * n + 1]
    assert set(idx[0, 1:]) == {2 * n - 1} and set(idx[1:, 0]) == {2 * n}
    with pytest.raises(ValueError, match="relative_kind must be one of"):
        layers.MultiHeadSelfAttention(2, relative_grid=(2, 2), relative_kind="2d")


def _relative_reference(layer, x, grid, prefix):
    """The paper's relative attention in numpy: logits q.k + q.r[p_q - p_k], scaled."""
    w, b = ops.convert_to_numpy(layer.qkv_kernel), ops.convert_to_numpy(layer.qkv_bias)
    n, t, d = x.shape
    h = layer.num_heads
    q, k, _ = (u.reshape(n, t, h, d // h).transpose(0, 2, 1, 3) for u in np.split(x @ w + b, 3, axis=-1))
    table = ops.convert_to_numpy(layer.relative_key)  # [R, H, Dh]
    offsets = relative_position_index(grid, prefix, kind="attention")
    rel_keys = table[offsets]  # [T, T, H, Dh]
    logits = (q @ k.transpose(0, 1, 3, 2) + np.einsum("bhqd,qkhd->bhqk", q, rel_keys)) / np.sqrt(d // h)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("prefix", [0, 1])
def test_relative_attention_adds_the_queries_logits_against_their_offsets_keys(prefix):
    grid = (2, 3)
    layer = layers.MultiHeadSelfAttention(2, relative_grid=grid, num_prefix_tokens=prefix,
                                          relative_kind="attention")
    rng = np.random.RandomState(0)
    x = rng.normal(size=(3, 6 + prefix, 8)).astype("float32")
    layer.build(x.shape)
    for v in layer.weights:
        v.assign(rng.normal(0, 0.5, v.shape))
    _, weights = layer(x, return_attention=True)
    np.testing.assert_allclose(weights, _relative_reference(layer, x, grid, prefix), atol=1e-5)


def test_relative_attentions_bias_depends_on_the_query_and_relative_bias_does_not():
    """What the offsets add to the logits: the paper's variant scales with the query
    (it is the query against a key per offset); the bias variant ignores it."""
    import tensorflow as tf

    rng = np.random.RandomState(0)
    q = tf.constant(rng.normal(size=(2, 2, 5, 4)).astype("float32"))
    added = {}
    for kind in ("attention", "bias"):
        layer = layers.MultiHeadSelfAttention(2, relative_grid=(2, 2), num_prefix_tokens=1,
                                              relative_kind=kind)
        layer.build((None, 5, 8))
        for v in layer.weights:
            v.assign(rng.normal(0, 0.5, v.shape))
        added[kind] = [np.broadcast_to(layer._relative_logits(s * q), (2, 2, 5, 5)) for s in (1.0, -2.0)]
    one, other = added["attention"]
    np.testing.assert_allclose(other, -2.0 * one, rtol=1e-5, atol=1e-6)
    assert np.abs(one).min() > 0 and not np.allclose(one[0], one[1])  # per image, as its queries
    np.testing.assert_array_equal(*added["bias"])


def test_relative_bias_changes_attention():
    layer = layers.MultiHeadSelfAttention(2, relative_grid=(2, 2))
    x = np.random.RandomState(0).normal(size=(1, 4, 8)).astype("float32")
    _, before = layer(x, return_attention=True)
    table = np.zeros(layer.relative_bias.shape, "float32")
    table[relative_position_index((2, 2), 0)[0, 3], 0] = 20.0  # strongly favour offset (0,0)->(1,1), head 0
    layer.relative_bias.assign(table)
    _, after = layer(x, return_attention=True)
    assert float(after[0, 0, 0, 3]) > 0.99
    np.testing.assert_allclose(after[0, 1], before[0, 1], atol=1e-6)


def test_attention_matches_explicit_softmax():
    layer = layers.MultiHeadSelfAttention(2)
    x = np.random.RandomState(1).normal(size=(2, 3, 4)).astype("float32")
    out, weights = layer(x, return_attention=True)
    w, b = ops.convert_to_numpy(layer.qkv_kernel), ops.convert_to_numpy(layer.qkv_bias)
    q, k, v = np.split(x @ w + b, 3, axis=-1)
    split = lambda t: t.reshape(2, 3, 2, 2).transpose(0, 2, 1, 3)  # noqa: E731
    logits = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(2)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, p, atol=1e-6)
    mixed = (p @ split(v)).transpose(0, 2, 1, 3).reshape(2, 3, 4)
    expected = mixed @ ops.convert_to_numpy(layer.out_kernel) + ops.convert_to_numpy(layer.out_bias)
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("relative", [None, "bias", "attention"])
@pytest.mark.parametrize("training", [False, True])
def test_a_class_token_only_block_computes_the_full_blocks_first_token(policy, relative, training):
    """The model's class-token path: one token out, equal to the full block's first,
    with the same gradients. 80 images of 5 tokens are 400 rows, so bf16 inference
    takes the convolution form for the keys and values (from `CONV_MIN_ROWS`) and the
    matmul for the queries, in a trace of any batch size."""
    import tensorflow as tf

    def make(policy):
        block = layers.EncoderBlock(2, 16, relative_grid=(2, 2) if relative else None, num_prefix_tokens=1,
                                    relative_kind=relative or "bias", dtype=policy)
        block.build((None, 5, 8))
        return block

    block = make(policy)
    rng = np.random.RandomState(0)
    for v in block.weights:
        v.assign(rng.normal(0, 0.5, v.shape))
    x = tf.constant(rng.normal(size=(80, 5, 8)).astype("float32"))
    probe = tf.constant(rng.normal(size=(80, 1, 8)).astype("float32"))

    def both(block):
        @tf.function(input_signature=[tf.TensorSpec((None, 5, 8))])
        def run(x):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(x)
                full, _ = block(x, training=training, return_attention=True)
                part, weights = block(x, training=training, return_attention=True, class_token_only=True)
                losses = [tf.reduce_sum(tf.cast(y[:, :1], "float32") * probe) for y in (full, part)]
            grads = [tape.gradient(loss, [x] + block.trainable_weights) for loss in losses]
            return (tf.cast(full[:, :1], "float32"), tf.cast(part, "float32"), weights,
                    [[tf.cast(tf.convert_to_tensor(g), "float32") for g in gs] for gs in grads])
        return run(x)

    full, part, weights, (full_grads, part_grads) = both(block)
    assert part.shape == (80, 1, 8) and weights.shape == (80, 2, 1, 5)
    if policy == "float32":
        np.testing.assert_allclose(part, full, atol=1e-5, rtol=1e-5)
        for a, b in zip(part_grads, full_grads):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-5)
        return
    exact_block = make("float32")
    exact_block.set_weights(block.get_weights())
    exact, _, _, (exact_grads, _) = both(exact_block)
    bf16_bounds.assert_as_accurate(part, full, exact, "class token")
    names = ["x"] + [v.path for v in block.trainable_weights]
    for name, a, b, e in zip(names, part_grads, full_grads, exact_grads):
        bf16_bounds.assert_as_accurate(a, b, e, f"gradient of {name}")


def test_a_blocks_symbolic_outputs_follow_its_arguments():
    import keras

    block = layers.EncoderBlock(2, 16, dtype="mixed_bfloat16")
    x = keras.Input((5, 8))
    assert block(x).shape == (None, 5, 8) and block(x).dtype == "bfloat16"
    out, weights = block(x, return_attention=True, class_token_only=True)
    assert out.shape == (None, 1, 8) and weights.shape == (None, 2, 1, 5) and weights.dtype == "float32"
    assert block(x, return_attention=True)[1].shape == (None, 2, 5, 5)


@pytest.mark.parametrize("training", [False, True])
def test_a_class_token_only_block_compiles_under_xla_in_bf16(training):
    """XLA's CPU backend has no bf16 kernel for a batch of one-row products of these
    sizes (32 images, 3 heads of 64, 17 tokens), so the block's class-token path runs
    them in float32 there, forward and backward."""
    import tensorflow as tf

    block, exact_block = (layers.EncoderBlock(3, 64, dtype=p) for p in ("mixed_bfloat16", "float32"))
    for b in (block, exact_block):
        b.build((None, 17, 192))
    exact_block.set_weights(block.get_weights())
    x = tf.constant(np.random.RandomState(0).normal(size=(32, 17, 192)).astype("float32"))

    def run(block, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.cast(block(x, training=training, class_token_only=True), "float32")
            loss = tf.reduce_sum(y)
        return y, tape.gradient(loss, x)

    compiled = tf.function(lambda x: run(block, x), jit_compile=True)(x)
    for what, a, b, e in zip(("class token", "gradient"), compiled, run(block, x), run(exact_block, x)):
        bf16_bounds.assert_as_accurate(a, b, e, what)


def test_encoder_projections_are_plain_matmuls_in_the_train_step():
    """qkv, out, fc1 and fc2 on [B*T, D]: a broadcast [B, T, D] @ [D, N] BatchMatMulV2
    has a kernel gradient of B small matmuls plus a sum (measured 1.04-1.22x slower)."""
    import tensorflow as tf

    block = layers.EncoderBlock(num_heads=2, mlp_dim=16)
    block.build((None, 5, 8))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(block(x, training=True))
        return tape.gradient(loss, block.trainable_weights)

    graph = step.get_concrete_function(tf.TensorSpec((None, 5, 8))).graph
    kinds = [op.type for op in graph.get_operations()]
    # Forward: the four projections are MatMul; only q @ k^T and weights @ v are batched.
    # Backward: two MatMuls per projection, two BatchMatMuls per batched product.
    assert kinds.count("MatMul") == 4 * 3
    assert kinds.count("BatchMatMulV2") == 2 * 3


def _executed_graph(fn, *args):
    """The nodes that TF runs for `fn(*args)`: after grappler and the oneDNN rewrites."""
    from tensorflow.python.eager import context

    context.enable_run_metadata()
    try:
        context.export_run_metadata()  # drops what calls before this one left behind
        fn(*args)
        meta = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    return [n for f in meta.function_graphs for g in f.partition_graphs for n in g.node]


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("class_token_only", [False, True])
def test_residual_adds_fuse_into_the_projections_at_inference(class_token_only, policy):
    """x + (o @ W + b) runs as one MatMul + BiasAdd + Add op for the out projection
    and fc2, with a dynamic batch too, and in the class-token-only last block. A
    residual added after a reshape, a bias added with + or a (-1, D) reshape before
    the out projection fuses nothing. (With the bfloat16 softmax: ViT-Ti/16 bf16
    inference 1.12x, side by side. Unfused in bf16, the add also rounds once more, so
    a SavedModel's logits would differ from predict's static-batch ones.) In bf16
    with a dynamic batch the projections are tf.conds; this counts their matmul
    branches, which 10 rows take."""
    import keras
    import tensorflow as tf

    skip_unless_onednn(keras.DTypePolicy(policy).compute_dtype)
    block = layers.EncoderBlock(num_heads=2, mlp_dim=32, dtype=policy)
    block.build((None, 5, 16))
    fn = tf.function(lambda x: block(x, training=False, class_token_only=class_token_only),
                     input_signature=[tf.TensorSpec((None, 5, 16))])
    nodes = _executed_graph(fn, np.zeros((2, 5, 16), "float32"))
    fused = [list(n.attr["fused_ops"].list.s) for n in nodes if "FusedMatMul" in n.op]
    assert fused.count([b"BiasAdd", b"Add"]) == 2, fused


def _xla_calls(nodes):
    return sum(n.attr["_XlaMustCompile"].b for n in nodes)


def _projection_ops(policy, batch, static, training=False, never_saved=False):
    """{"conv": [fused ops of each Conv2D], "matmul": [...], "adds": AddV2 count, "xla":
    XLA-compiled calls} that TF runs for an EncoderBlock of 64 tokens per example,
    traced as any tf.function or (`never_saved`) as Keras's predict step is."""
    import tensorflow as tf

    block = layers.EncoderBlock(num_heads=2, mlp_dim=32, dtype=policy)
    block.build((None, 64, 16))
    spec = tf.TensorSpec((batch if static else None, 64, 16))
    fn = tf.function(lambda x: block(x, training=training), input_signature=[spec])
    with fast_paths.never_saved() if never_saved else contextlib.nullcontext():
        nodes = _executed_graph(fn, np.zeros((batch, 64, 16), "float32"))
    fused = lambda kind: sorted([s.decode() for s in n.attr["fused_ops"].list.s]  # noqa: E731
                                for n in nodes if n.op.endswith("Fused" + kind))
    return {"conv": fused("Conv2D"), "matmul": fused("MatMul"), "xla": _xla_calls(nodes),
            # (Eager ops run meanwhile appear as one-node graphs, unscoped.)
            "adds": sum(n.op == "AddV2" and "/" in n.name for n in nodes)}


def test_bf16_projections_run_as_pointwise_convolutions_from_enough_rows():
    """In bf16 at inference, qkv, the out projection and fc2 run as 1x1 convolutions
    with their bias (and residual) fused in, from CONV_MIN_ROWS rows; fc1 keeps the
    matmul, the only op that fuses its GELU. (ViT-B/16 bf16 inference 1.20x and
    Ti/16 1.15x at batch 32, side by side.)"""
    from keras_vit.layers.fast_paths import CONV_MIN_ROWS

    skip_unless_onednn("bfloat16")
    batch = -(-CONV_MIN_ROWS // 64)
    ops_ = _projection_ops("mixed_bfloat16", batch, static=True)
    assert ops_["conv"] == [["BiasAdd"], ["BiasAdd", "Add"], ["BiasAdd", "Add"]], ops_
    assert ops_["matmul"] == [["BiasAdd", "GeluApproximate"]], ops_
    assert ops_["adds"] == 0 and ops_["xla"] == 0, ops_
    fewer = _projection_ops("mixed_bfloat16", batch - 1, static=True)
    assert fewer["conv"] == [] and fewer["matmul"].count(["BiasAdd", "Add"]) == 2, fewer
    # A dynamic batch holds both forms and picks one by the rows it gets.
    dynamic = _projection_ops("mixed_bfloat16", batch, static=False)
    assert len(dynamic["conv"]) == 3 and len(dynamic["matmul"]) == 4, dynamic
    for policy, training in (("float32", False), ("mixed_bfloat16", True)):
        assert _projection_ops(policy, batch, static=True, training=training)["conv"] == []


def test_bf16_fc1_runs_as_a_convolution_and_an_xla_gelu_only_where_never_saved():
    """In Keras's own predict and evaluate steps (`fast_paths.never_saved`), bf16 fc1
    runs as a 1x1 convolution with its bias, then its GELU as one XLA kernel: from
    CONV_MIN_ROWS rows, and with a dynamic batch. Any other trace could be saved, and
    TF Serving refuses XLA kernels on CPU: it keeps the fused GELU matmul. (ViT-S/16
    bf16 predict 1.10x at batch 32, side by side.)"""
    from keras_vit.layers.fast_paths import CONV_MIN_ROWS

    skip_unless_onednn("bfloat16")
    batch = -(-CONV_MIN_ROWS // 64)
    ops_ = _projection_ops("mixed_bfloat16", batch, static=True, never_saved=True)
    assert ops_["conv"] == [["BiasAdd"], ["BiasAdd"], ["BiasAdd", "Add"], ["BiasAdd", "Add"]], ops_
    assert ops_["matmul"] == [] and ops_["xla"] == 1 and ops_["adds"] == 0, ops_
    fewer = _projection_ops("mixed_bfloat16", batch - 1, static=True, never_saved=True)
    assert fewer["xla"] == 0 and ["BiasAdd", "GeluApproximate"] in fewer["matmul"], fewer
    dynamic = _projection_ops("mixed_bfloat16", batch, static=False, never_saved=True)
    assert dynamic["xla"] == 1 and len(dynamic["conv"]) == 4, dynamic
    for static in (True, False):
        saved = _projection_ops("mixed_bfloat16", batch, static=static)
        assert saved["xla"] == 0 and ["BiasAdd", "GeluApproximate"] in saved["matmul"], saved
    assert _projection_ops("float32", batch, static=True, never_saved=True)["xla"] == 0


def test_vit_predict_and_evaluate_steps_are_never_saved_traces():
    """`VisionTransformer.predict_step` and `test_step` trace under
    `fast_paths.never_saved`; `predict` in either form gives the portable graph's
    logits, to bf16 rounding."""
    import tensorflow as tf
    from conftest import randomise, tiny

    from keras_vit.precision import with_policy

    skip_unless_onednn("bfloat16")
    model = with_policy(randomise(tiny(patch_size=4)), "mixed_bfloat16")
    x = np.random.RandomState(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")  # 8 x 65 rows: convolutions
    step = tf.function(model.predict_step)
    # The first block's fc1; the last block's MLP runs on the 8 class tokens alone.
    assert _xla_calls(_executed_graph(step, x)) == 1
    portable = tf.function(lambda t: model(t, training=False))
    assert _xla_calls(_executed_graph(portable, x)) == 0
    expected = portable(x).numpy()
    exact = with_policy(model, "float32")(x, training=False)
    for data in (x, tf.data.Dataset.from_tensor_slices(x).batch(8)):  # static, then dynamic batch
        bf16_bounds.assert_as_accurate(model.predict(data, verbose=0), expected, exact, "logits")
    seen = []
    model.compile(loss=lambda y, logits: (seen.append(fast_paths.xla_kernels_allowed()), ops.mean(logits))[1])
    model.evaluate(x, np.zeros(8), verbose=0)
    assert seen == [True]


def _bf16_operands(rows, k=48, m=40, seed=0):
    """Tokens `[rows, k]`, kernel `[k, m]`, bias `[m]` and residual `[rows, m]`, each
    already representable in bfloat16 (float32 arrays), so that the exact map of these
    operands is what a bf16 computation approximates."""
    import tensorflow as tf

    rng = np.random.RandomState(seed)
    shapes = ((rows, k), (k, m), (m,), (rows, m))
    return [tf.cast(tf.cast(rng.normal(size=s), tf.bfloat16), tf.float32).numpy() for s in shapes]


def _affine(x, w, b, residual=None):
    """`x @ w + b (+ residual)` with its bf16 bound: every intermediate rounded, as
    unfused bf16 ops do (a fused op rounds once, well within it)."""
    y = Bounded(x) @ w + b
    return (y if residual is None else y + residual).bound()


def _affine_gelu(x, w, b, approximate):
    return bf16_bounds.gelu(Bounded(x) @ w + b, approximate).bound()


def _in_a_trace(fn, rows, static, *args):
    """`fn(tokens, *args)` in a tf.function over bf16 tokens `[rows or None, 48]`."""
    import tensorflow as tf

    spec = tf.TensorSpec((rows if static else None, 48), tf.bfloat16)
    return tf.function(lambda t: fn(t, *args), input_signature=[spec])


@pytest.mark.parametrize("rows", [CONV_ROWS := 384, 100])
@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("with_residual", [True, False])
def test_projection_computes_the_affine_map(rows, static, with_residual):
    """In whichever form these cores take at `rows`, within what bf16 arithmetic allows
    (tests/bf16_bounds.py)."""
    import tensorflow as tf

    assert CONV_ROWS == fast_paths.CONV_MIN_ROWS
    x, w, b, res = _bf16_operands(rows)
    operands = (x, w, b) + ((res,) if with_residual else ())
    residual = tf.cast(res, tf.bfloat16) if with_residual else None
    y = _in_a_trace(fast_paths.dense, rows, static, w, b, residual)(tf.cast(x, tf.bfloat16))
    assert y.dtype == tf.bfloat16
    assert_within(tf.cast(y, tf.float32), _affine(*operands))


@pytest.mark.parametrize("with_residual", [True, False])
def test_both_projection_forms_compute_the_affine_map_on_these_cores(with_residual):
    """The 1x1 convolution (bf16 inference where TF's oneDNN runs bf16) and the matmul
    (everywhere else) compute the same map on whatever cores run the suite."""
    import tensorflow as tf

    x, w, b, res = _bf16_operands(CONV_ROWS)
    operands = (x, w, b) + ((res,) if with_residual else ())
    expected = _affine(*operands)
    args = [tf.cast(a, tf.bfloat16) for a in (w, b)] + [tf.cast(res, tf.bfloat16) if with_residual else None]
    for form in (fast_paths._as_pointwise_conv, fast_paths._as_matmul):
        y = _in_a_trace(form, CONV_ROWS, True, *args)(tf.cast(x, tf.bfloat16))
        assert_within(tf.cast(y, tf.float32), expected)


@pytest.mark.parametrize("rows", [CONV_ROWS, 100])
@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("approximate", [True, False])
def test_project_gelu_computes_the_map(rows, static, approximate):
    """In whichever form these cores take, in a trace that could be saved and in one
    that is never saved (where bf16 fc1 may run its GELU as an XLA kernel)."""
    import tensorflow as tf

    x, w, b, _ = _bf16_operands(rows)
    expected = _affine_gelu(x, w, b, approximate)
    for never_saved in (True, False):
        fn = _in_a_trace(fast_paths.dense_gelu, rows, static, w, b, approximate)
        with fast_paths.never_saved() if never_saved else contextlib.nullcontext():
            y = fn(tf.cast(x, tf.bfloat16))
        assert y.dtype == tf.bfloat16
        assert_within(tf.cast(y, tf.float32), expected)


@pytest.mark.parametrize("approximate", [True, False])
def test_both_fc1_forms_compute_the_map_on_these_cores(approximate):
    """The 1x1 convolution then an XLA GELU (bf16 inference in Keras's predict step where
    TF's oneDNN runs bf16) and the matmul with its GELU compute the same map on
    whatever cores run the suite."""
    import tensorflow as tf

    x, w, b, _ = _bf16_operands(CONV_ROWS)
    expected = _affine_gelu(x, w, b, approximate)
    w16, b16 = tf.cast(w, tf.bfloat16), tf.cast(b, tf.bfloat16)
    forms = (lambda t: fast_paths._xla_gelu(fast_paths._as_pointwise_conv(t, w16, b16, None), approximate),
             lambda t: tf.nn.gelu(fast_paths._as_matmul(t, w16, b16, None), approximate=approximate))
    for form in forms:
        assert_within(tf.cast(_in_a_trace(form, CONV_ROWS, True)(tf.cast(x, tf.bfloat16)), tf.float32),
                      expected)


@pytest.mark.parametrize("class_token_only", [False, True])
def test_a_block_computes_the_same_with_and_without_the_onednn_forms(monkeypatch, class_token_only):
    """The forms written for oneDNN's rewrites (the LayerNorm pattern, the residual adds
    inside the projections), taken here whatever the cores, and the plain forms
    (`fast_paths.disabled`) compute the same block in float32."""
    import tensorflow as tf

    block = layers.EncoderBlock(num_heads=2, mlp_dim=32)
    block.build((None, 5, 16))
    rng = np.random.RandomState(0)
    for v in block.weights:
        v.assign(rng.normal(0, 0.5, v.shape) + (1.0 if "gamma" in v.path else 0.0))
    x = rng.normal(size=(3, 5, 16)).astype("float32")
    monkeypatch.setattr(fast_paths, "onednn_inference",
                        lambda training, dtype: fast_paths.enabled() and not training)
    outputs = []
    for forms in (True, False):
        with contextlib.nullcontext() if forms else fast_paths.disabled():
            fn = tf.function(lambda t: block(t, training=False, class_token_only=class_token_only),
                             input_signature=[tf.TensorSpec((None, 5, 16))])
            kinds = {op.type for op in fn.get_concrete_function().graph.get_operations()}
        assert ("FusedBatchNormV3" in kinds) is forms
        outputs.append(fn(x).numpy())
    np.testing.assert_allclose(*outputs, rtol=1e-5, atol=1e-5 * np.abs(outputs[1]).max())


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("training", [False, True])
def test_a_model_computes_the_same_with_and_without_fast_paths(policy, training):
    """Whatever fast forms these cores take (`fast_paths`), a whole ViT's logits and, in
    training, its gradients are the plain forms' (`KERAS_VIT_FAST_PATHS=0`): equal in
    float32 to float32 rounding, and in bf16 as accurate against the float32 model."""
    import tensorflow as tf
    from conftest import randomise, tiny

    from keras_vit.precision import with_policy

    model = with_policy(randomise(tiny(patch_size=4)), policy)
    exact = with_policy(model, "float32")
    x = tf.constant(np.random.RandomState(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32"))

    def run(model, plain):
        with fast_paths.disabled() if plain else contextlib.nullcontext():
            @tf.function(input_signature=[tf.TensorSpec((None, 32, 32, 3))])
            def step(x):
                with tf.GradientTape() as tape:
                    logits = tf.cast(model(x, training=training), "float32")
                    loss = tf.reduce_sum(logits * tf.range(1.0, logits.shape[-1] + 1.0))
                grads = tape.gradient(loss, model.trainable_weights) if training else []
                return logits, [tf.cast(tf.convert_to_tensor(g), "float32") for g in grads]
            step.get_concrete_function()
        return step(x)

    (fast, fast_grads), (plain, plain_grads) = run(model, False), run(model, True)
    if policy == "float32":
        np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5 * np.abs(plain).max())
        for a, b in zip(fast_grads, plain_grads):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b.numpy()).max())
        return
    reference, reference_grads = run(exact, True)
    bf16_bounds.assert_as_accurate(fast, plain, reference, "logits")
    for v, a, b, e in zip(model.trainable_weights, fast_grads, plain_grads, reference_grads):
        bf16_bounds.assert_as_accurate(a, b, e, f"gradient of {v.path}")


def test_the_bf16_bound_refuses_bfloat16_accumulation():
    """The bound would catch products accumulated in bfloat16 (where float32 is meant),
    and holds for the correctly rounded result of the exact float32 sum."""
    import tensorflow as tf

    x, w, b, _ = _bf16_operands(64, k=256)
    exact, bound = _affine(x, w, b)
    to_bf16 = lambda a: tf.cast(tf.cast(a, tf.bfloat16), tf.float64).numpy()  # noqa: E731
    assert_within(to_bf16(x.astype(np.float64) @ w + b), (exact, bound))
    partial = np.zeros((x.shape[0], w.shape[1]))
    for k in range(x.shape[1]):  # a bf16 accumulator: each partial sum rounded
        partial = to_bf16(partial + to_bf16(np.outer(x[:, k], w[k])))
    with pytest.raises(AssertionError, match="beyond the bf16 bound"):
        assert_within(to_bf16(partial + b), (exact, bound))


def test_as_accurate_refuses_bfloat16_accumulation_and_allows_one_more_rounding():
    """`assert_as_accurate`, the check through whole blocks: a product accumulated in
    bf16 fails it against the float32-accumulated one; storing the product in bf16
    before adding the bias (one rounding more, as an unfused fast path does) passes."""
    import tensorflow as tf

    x, w, b, _ = _bf16_operands(64, k=256)
    to_bf16 = lambda a: tf.cast(tf.cast(a, tf.bfloat16), tf.float64).numpy()  # noqa: E731
    exact = x.astype(np.float64) @ w + b
    plain = to_bf16(exact)
    bf16_bounds.assert_as_accurate(plain, plain, exact)
    bf16_bounds.assert_as_accurate(to_bf16(to_bf16(x.astype(np.float64) @ w) + b), plain, exact)
    partial = np.zeros((x.shape[0], w.shape[1]))
    for k in range(x.shape[1]):
        partial = to_bf16(partial + to_bf16(np.outer(x[:, k], w[k])))
    with pytest.raises(AssertionError, match="RMS error"):
        bf16_bounds.assert_as_accurate(to_bf16(partial + b), plain, exact)


def _gelu64(h, approximate):
    # libm's scalar tanh and erf, not numpy's SIMD kernels: the reference must hold on
    # every core, and under qemu's emulation of AVX2 cores numpy's float64 tanh was wrong.
    from math import erf, tanh

    if approximate:
        return 0.5 * h * (1 + np.vectorize(tanh)(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    return 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))


@pytest.mark.parametrize("approximate", [True, False])
def test_xla_gelu_kernels_are_the_named_gelu(approximate):
    """In float32, where the tanh form and the exact one differ (by up to ~5e-4)."""
    import tensorflow as tf

    h = np.linspace(-5, 5, 1001)
    y = fast_paths._xla_gelu(tf.constant(h, tf.float32), approximate)
    np.testing.assert_allclose(y.numpy(), _gelu64(h, approximate), atol=2e-6)


@pytest.mark.parametrize("approximate", [True, False])
def test_xla_gelu_kernels_round_bf16_once(approximate):
    """On bf16 input the GELU runs in float32 and rounds once: rounding after each op,
    as XLA does for bf16 ops, left a quarter of the tanh GELU's outputs an ulp off."""
    import tensorflow as tf

    h = tf.cast(tf.random.stateless_normal([20000], seed=[1, 2]) * 2, tf.bfloat16)
    y = fast_paths._xla_gelu(h, approximate)
    assert y.dtype == tf.bfloat16
    exact = _gelu64(np.asarray(tf.cast(h, tf.float64)), approximate)
    correctly_rounded = tf.cast(exact, tf.bfloat16).numpy()
    # Where GELU is below 1e-4 (h under about -3.5), float32's 1 + tanh cancels to 0.
    visible = np.abs(exact) > 1e-4
    assert np.mean(y.numpy()[visible] == correctly_rounded[visible]) > 0.99


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("spec", [(None, 5, 16), (3, 5, 16), (None, 16)])
def test_layer_norm_runs_as_one_onednn_op_at_inference(policy, spec):
    """At inference every LayerNorm is one `_MklLayerNorm` where TF runs oneDNN, with a
    static batch too (constant folding must not break the pattern). In training there
    is no FusedBatchNormV3: the hand-written gradient is kept. (ViT-Ti/16 bf16
    inference 1.18x and B/16 1.16x, side by side.)"""
    import keras
    import tensorflow as tf

    dtype = keras.DTypePolicy(policy).compute_dtype
    skip_unless_onednn(dtype)
    layer = layers.LayerNorm(epsilon=1e-6, dtype=policy)
    layer.build(spec)
    x = tf.cast(np.random.RandomState(0).normal(size=[3 if d is None else d for d in spec]), dtype)
    infer = tf.function(lambda x: layer(x, training=False), input_signature=[tf.TensorSpec(spec, dtype)])
    ops_run = [n.op for n in _executed_graph(infer, x)]
    assert ops_run.count("_MklLayerNorm") == 1, ops_run
    assert not any("BatchNorm" in op for op in ops_run), ops_run
    if dtype != "float32":  # a float32 input is normalised in float32, as in Keras
        wide = tf.function(lambda x: layer(x, training=False)).get_concrete_function(tf.TensorSpec(spec))
        assert not any("BatchNorm" in op.type for op in wide.graph.get_operations())
    train = tf.function(lambda x: layer(x, training=True), input_signature=[tf.TensorSpec(spec, dtype)])
    assert not any("BatchNorm" in op.type for op in train.get_concrete_function().graph.get_operations())


def test_layer_norm_training_flag_reaches_the_blocks_norms():
    """Keras passes `training` down to LayerNorm inside the encoder: fit's graph keeps the
    hand-written gradient, and inference takes oneDNN's pattern."""
    import tensorflow as tf

    block = layers.EncoderBlock(num_heads=2, mlp_dim=32)
    block.build((None, 5, 16))

    def batch_norms(training):
        fn = tf.function(lambda x: block(x, training=training))
        graph = fn.get_concrete_function(tf.TensorSpec((None, 5, 16))).graph
        return sum(op.type == "FusedBatchNormV3" for op in graph.get_operations())

    assert batch_norms(True) == 0
    assert batch_norms(False) == (2 if hardware.onednn_runs("float32") else 0)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_softmax_runs_in_bfloat16_only_under_mixed_bfloat16_on_onednn(policy):
    """Where TF's oneDNN runs bfloat16 (which computes its softmax in float32 inside);
    elsewhere Eigen's bf16 softmax rounds its exps and sum in bf16, and float32 is kept."""
    import tensorflow as tf

    fast = policy == "mixed_bfloat16" and hardware.onednn_runs("bfloat16")
    softmax_dtype = "bfloat16" if fast else "float32"

    layer = layers.MultiHeadSelfAttention(2, dtype=policy)
    layer.build((None, 5, 8))
    graph = tf.function(lambda x: layer(x, return_attention=True)).get_concrete_function(
        tf.TensorSpec((None, 5, 8))).graph
    (softmax,) = [op for op in graph.get_operations() if op.type == "Softmax"]
    assert softmax.get_attr("T").name == softmax_dtype
    x = np.random.RandomState(0).normal(size=(2, 5, 8)).astype("float32")
    _, weights = layer(x, return_attention=True)
    assert weights.dtype == "float32"
    # Each weight stored in its softmax dtype is off by less than one ulp of itself.
    ulp = bf16_bounds.FAITHFUL if softmax_dtype == "bfloat16" else 2 * bf16_bounds.F32_UNIT_ROUNDOFF
    np.testing.assert_allclose(ops.sum(weights, axis=-1), 1.0, atol=ulp + 5 * bf16_bounds.F32_UNIT_ROUNDOFF)


def test_under_xla_the_block_keeps_the_forms_xla_fuses():
    """Inside jit_compile: a float32 softmax (XLA maps only that one to oneDNN's) and the
    plain LayerNorm graph (the oneDNN pattern's FusedBatchNormV3 fuses worse in XLA).
    ViT-Ti/16 bf16 inference with XLA ran 1.17x faster for it, side by side."""
    import tensorflow as tf

    from keras_vit.layers.fast_paths import compiling_with_xla

    block = layers.EncoderBlock(num_heads=2, mlp_dim=32, dtype="mixed_bfloat16")
    block.build((None, 5, 16))
    seen = {}

    def forward(x):
        seen["xla"] = compiling_with_xla()
        return block(x, training=False)

    for jit in (False, True):
        traced = tf.function(forward, jit_compile=jit)
        graph = traced.get_concrete_function(tf.TensorSpec((None, 5, 16))).graph
        kinds = {op.type: op for op in graph.get_operations()}
        assert seen["xla"] is jit
        bf16_softmax = not jit and hardware.onednn_runs("bfloat16")
        assert kinds["Softmax"].get_attr("T").name == ("bfloat16" if bf16_softmax else "float32")
        assert ("FusedBatchNormV3" in kinds) is (not jit and hardware.onednn_runs("bfloat16"))
    x = np.random.RandomState(0).normal(size=(2, 5, 16)).astype("float32")
    compiled, plain = (tf.cast(tf.function(forward, jit_compile=jit)(x), "float32") for jit in (True, False))
    exact_block = layers.EncoderBlock(num_heads=2, mlp_dim=32)
    exact_block.build((None, 5, 16))
    exact_block.set_weights(block.get_weights())
    bf16_bounds.assert_as_accurate(compiled, plain, exact_block(x, training=False))


def test_under_xla_bf16_attention_products_stay_bf16():
    """q @ k^T written as a matmul of a transposed k, then cast to the float32 softmax,
    was compiled by XLA as a float32 product of upcast q and k. As `transpose_b` it
    stays bf16, as the other products do (ViT-Ti/16 bf16 with XLA: inference 1.03x,
    training steps 1.05x, side by side)."""
    import re

    import tensorflow as tf

    skip_unless_xla_runs_bf16_products()
    # Big enough for XLA to hand the products to oneDNN (below that, XLA's own dots run
    # every bf16 product in float32).
    layer = layers.MultiHeadSelfAttention(2, dtype="mixed_bfloat16")
    layer.build((None, 50, 128))
    x = tf.zeros((2, 50, 128))
    hlo = tf.function(lambda x: layer(x, training=False), jit_compile=True) \
        .experimental_get_compiler_ir(x)(stage="optimized_hlo")
    products = [line for line in hlo.splitlines()
                if re.search(r"\[2,2,50,(50|64)\]\S* (dot\(|custom-call\(.*onednn\$matmul)", line)]
    assert len(products) == 2, hlo
    assert all(re.search(r"= bf16\[2,2,50,", line) for line in products), products


def test_stochastic_depth_drops_whole_examples_inside_the_block():
    """The block's residual stream is [B*T, D]; stochastic depth must still drop
    an example's whole branch, never single tokens."""
    block = layers.EncoderBlock(num_heads=2, mlp_dim=16, stochastic_depth_rate=0.5)
    block.build((None, 7, 8))
    block.mlp.fc2.kernel.assign(np.zeros(block.mlp.fc2.kernel.shape, "float32"))  # MLP branch adds 0
    x = np.random.RandomState(0).normal(size=(64, 7, 8)).astype("float32")
    changed = np.abs(ops.convert_to_numpy(block(x, training=True)) - x).max(axis=-1) > 1e-6  # [B, T]
    assert np.all(changed.all(axis=1) | ~changed.any(axis=1))
    assert 0 < changed[:, 0].sum() < 64


def _bf16_exact(shape, seed, scale=1.0):
    """float64 values that bfloat16 holds exactly, so every dtype sees the same inputs."""
    import tensorflow as tf

    values = np.random.RandomState(seed).normal(0, scale, shape)
    return tf.cast(tf.cast(values, tf.bfloat16), tf.float64)


def _value_and_grad(fn, x, dy, dtype):
    """`fn(x)` and its gradient for the upstream `dy`, computed in `dtype`, as float64."""
    import tensorflow as tf

    xs = tf.cast(x, dtype)
    with tf.GradientTape() as tape:
        tape.watch(xs)
        y = fn(xs)
    return np.float64(y), np.float64(tape.gradient(y, xs, output_gradients=tf.cast(dy, dtype)))


def test_training_gelu_is_tanh_gelu_with_its_gradient():
    """Training's fast GELU (XLA-fused, closed-form gradient) must equal tf.nn.gelu's tanh form."""
    import tensorflow as tf

    gelu_tanh_for_training = fast_paths._gelu_tanh_for_training

    x, dy = _bf16_exact((64, 48), 0, scale=3.0), _bf16_exact((64, 48), 1)
    value_and_grad = lambda fn, dtype: _value_and_grad(fn, x, dy, dtype)  # noqa: E731
    reference = lambda t: tf.nn.gelu(t, approximate=True)  # noqa: E731
    y64, g64 = value_and_grad(reference, tf.float64)
    y, g = value_and_grad(gelu_tanh_for_training, tf.float32)
    np.testing.assert_allclose(y, y64, atol=1e-5)
    np.testing.assert_allclose(g, g64, atol=1e-5)
    # In bfloat16, no less accurate than autodiff of tf.nn.gelu.
    ours = value_and_grad(gelu_tanh_for_training, tf.bfloat16)
    autodiff = value_and_grad(reference, tf.bfloat16)
    assert np.abs(ours[0] - y64).max() <= 1.5 * np.abs(autodiff[0] - y64).max()
    assert np.abs(ours[1] - g64).max() <= 1.5 * np.abs(autodiff[1] - g64).max()


def test_training_softmax_is_softmax_with_its_gradient():
    """bf16 training's fast softmax (XLA-fused gradient) must be tf.nn.softmax and its gradient."""
    import tensorflow as tf

    softmax_for_training = fast_paths._softmax_for_training

    logits, dy = _bf16_exact((2, 3, 17, 17), 0, scale=3.0), _bf16_exact((2, 3, 17, 17), 1)
    value_and_grad = lambda fn, dtype: _value_and_grad(fn, logits, dy, dtype)  # noqa: E731
    reference = lambda t: tf.nn.softmax(t, axis=-1)  # noqa: E731
    y64, g64 = value_and_grad(reference, tf.float64)
    y, g = value_and_grad(softmax_for_training, tf.float32)
    np.testing.assert_allclose(y, y64, atol=1e-6)
    np.testing.assert_allclose(g, g64, atol=1e-5)
    ours, autodiff = value_and_grad(softmax_for_training, tf.bfloat16), value_and_grad(reference, tf.bfloat16)
    np.testing.assert_array_equal(ours[0], autodiff[0])
    assert np.abs(ours[1] - g64).max() <= 1.5 * np.abs(autodiff[1] - g64).max()


def test_std_conv_standardises_each_filter():
    layer = layers.StdConv2D(3, 3)
    layer.build((None, 5, 5, 2))
    kernel = np.random.RandomState(0).normal(2.0, 3.0, size=(3, 3, 2, 3)).astype("float32")
    layer.kernel.assign(kernel)
    x = np.random.RandomState(1).normal(size=(1, 5, 5, 2)).astype("float32")
    std = (kernel - kernel.mean((0, 1, 2))) / (kernel.std((0, 1, 2)) + 1e-5)
    expected = ops.conv(x, std, padding="same")
    np.testing.assert_allclose(layer(x), expected, atol=1e-5)


def test_group_norm_is_the_same_under_every_keras():
    """Keras 3.15's GroupNormalization stopped autocasting its input and weights; ours
    never does, so the numbers do not change with the Keras version: float32 gamma and
    beta under any policy (the bfloat16 twin's too), the input normalised as it comes,
    the output in the compute dtype."""
    import tensorflow as tf

    for policy in ("mixed_bfloat16", "bfloat16", "mixed_float16"):
        layer = layers.GroupNorm(groups=2, epsilon=1e-6, dtype=policy)
        layer.build((None, 3, 3, 4))
        assert [(w.dtype, w._autocast) for w in layer.weights] == [("float32", False)] * 2, policy
    # Spread 3e-3 around 1: rounded to bf16 first (spacing 2^-7 there), the input would be
    # nearly constant and its normalised values noise.
    x = (1.0 + 3e-3 * np.random.RandomState(0).normal(size=(2, 3, 3, 4))).astype("float32")
    layer = layers.GroupNorm(groups=2, epsilon=1e-9, dtype="mixed_bfloat16")
    y = layer(x)
    assert y.dtype == tf.bfloat16
    g = x.reshape(2, 9, 2, 2).astype("float64")
    exact = ((g - g.mean((1, 3), keepdims=True)) / g.std((1, 3), keepdims=True)).reshape(x.shape)
    np.testing.assert_allclose(tf.cast(y, "float32"), exact, atol=0.02 * np.abs(exact).max())


def _norm_pairs():
    import keras

    return {
        "group": (lambda p: layers.GroupNorm(groups=32, epsilon=1e-6, dtype=p),
                  lambda p: keras.layers.GroupNormalization(groups=32, epsilon=1e-6, dtype=p)),
        "layer": (lambda p: layers.LayerNorm(epsilon=1e-6, dtype=p),
                  lambda p: keras.layers.LayerNormalization(epsilon=1e-6, dtype=p)),
    }


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("policy, input_dtype", [("float32", "float32"), ("mixed_bfloat16", "float32"),
                                                 ("mixed_bfloat16", "bfloat16")])
@pytest.mark.parametrize("kind, shape", [("group", (2, 6, 5, 64)), ("group", (3, 7, 32)),
                                         ("layer", (2, 7, 48)), ("layer", (5, 16))])
def test_norms_match_keras(kind, policy, input_dtype, shape, training):
    """Outputs and gradients of our norms' `call` against Keras's own layers on the same
    weights, fed float32 or (as inside the model) the compute dtype. In bf16 they must be
    as accurate as Keras's, against Keras's in float32.

    LayerNorm takes a different graph at inference (oneDNN's pattern) than in training.
    """
    import tensorflow as tf

    rng = np.random.RandomState(0)
    # An offset larger than the spread: the one-pass variance must still be right.
    x = tf.cast(rng.normal(3.0, 0.5, size=shape), input_dtype)
    make_ours, make_ref = _norm_pairs()[kind]
    ours, ref, exact = make_ours(policy), make_ref(policy), make_ref("float32")
    for layer in (ours, ref, exact):
        layer.build(shape)
    ours.gamma.assign(rng.normal(size=shape[-1:]).astype("float32"))
    ours.beta.assign(rng.normal(size=shape[-1:]).astype("float32"))
    for layer in (ref, exact):
        layer.set_weights(ours.get_weights())

    def run(layer, x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=training)
            loss = tf.reduce_sum(tf.cast(y, "float32") * tf.sin(tf.cast(x, "float32")))
        grads = tape.gradient(loss, [x, layer.gamma, layer.beta])
        return [np.asarray(tf.cast(t, "float32")) for t in (y, *grads)]

    assert ours.compute_dtype == ref.compute_dtype
    if policy == "float32":
        for a, b in zip(run(ours, x), run(ref, x)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(b).max()))
        return
    for what, a, b, e in zip(("y", "dx", "dgamma", "dbeta"), run(ours, x), run(ref, x),
                             run(exact, tf.cast(x, "float32"))):
        bf16_bounds.assert_as_accurate(a, b, e, what)


def test_stochastic_depth_drops_whole_examples_and_keeps_the_mean():
    layer = layers.StochasticDepth(0.5, seed=3)
    x = np.ones((2000, 3, 4), "float32")
    y = ops.convert_to_numpy(layer(x, training=True))
    per_example = y.reshape(2000, -1)
    assert set(np.unique(per_example)) <= {0.0, 2.0}
    assert (per_example.min(1) == per_example.max(1)).all()
    assert abs(y.mean() - 1.0) < 0.1
    np.testing.assert_array_equal(layer(x, training=False), x)
