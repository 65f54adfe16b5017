"""keras_vit.visualize: the maths on hand-made attention, on models, the plots and the CLI."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import visualize as vis
from conftest import data_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(**changes):
    fields = dict(hidden_size=32, mlp_dim=64, num_heads=4, num_layers=3, patch_size=8, image_size=32)
    fields.update(changes)
    model = keras_vit.create_model("ViT-Ti/16", num_classes=10, **fields)
    rng = np.random.RandomState(0)
    # Random weights everywhere, so attention is far from uniform and nothing is zero.
    model.set_weights([w + rng.normal(0, 0.3, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def images(n=3, size=32, seed=0):
    return np.random.RandomState(seed).uniform(-1, 1, (n, size, size, 3)).astype("float32")


def uniform_attention(n, heads, tokens):
    return np.full((n, heads, tokens, tokens), 1.0 / tokens, "float32")


# === Attention rollout ===

def test_rollout_rows_sum_to_one_on_a_model():
    attention = vis.attention_weights(tiny(), images())
    assert len(attention) == 3 and attention[0].shape == (3, 4, 17, 17)
    r = vis.rollout(attention)
    assert r.shape == (3, 17, 17) and r.min() >= 0
    np.testing.assert_allclose(r.sum(axis=-1), 1.0, atol=1e-5)


def test_attention_weights_are_the_forward_pass_s_computed_in_a_traced_graph(monkeypatch):
    model, x = tiny(), images(n=5)
    expected = model.forward(x, training=False, return_attention=True)["attention"]
    eager, forward = [], model.forward

    def recording_forward(*args, **kwargs):
        eager.append(tf.executing_eagerly())
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", recording_forward)
    attention = vis.attention_weights(model, x, batch_size=2)
    assert eager == [False, False]  # one trace per batch shape (2, then the last 1), not op by op
    for got, want in zip(attention, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # graph vs eager rounding


def test_rollout_of_uniform_attention_is_analytic():
    # With U the uniform matrix, each block is (U + I) / 2 and U is idempotent,
    # so L blocks give U + (I - U) / 2^L.
    t, layers = 5, 3
    r = vis.rollout([uniform_attention(2, 3, t)] * layers)
    u = np.full((t, t), 1.0 / t)
    np.testing.assert_allclose(r[0], u + (np.eye(t) - u) / 2 ** layers, atol=1e-6)


def test_rollout_multiplies_blocks_in_order_and_renormalises_rows():
    rng = np.random.RandomState(1)
    a1, a2 = (rng.dirichlet(np.ones(4), size=(1, 2, 4)).astype("float32") for _ in range(2))

    def block(a):
        m = a[0].mean(axis=0) + np.eye(4)
        return m / m.sum(axis=1, keepdims=True)

    np.testing.assert_allclose(vis.rollout([a1, a2])[0], block(a2) @ block(a1), atol=1e-6)
    # A whole-matrix normalisation (as some published code does) would break the row sums.
    np.testing.assert_allclose(vis.rollout([a1 * 3.0, a2])[0].sum(axis=1), 1.0, atol=1e-6)


def test_rollout_map_reads_the_class_token_or_the_mean_for_gap():
    t, layers = 5, 2  # a 2x2 grid
    u = uniform_attention(1, 1, t)
    token_map = vis.rollout_maps([u] * layers, (2, 2), num_prefix_tokens=1)
    np.testing.assert_allclose(token_map[0], np.full((2, 2), (1 - 2.0 ** -layers) / t), atol=1e-6)
    gap_map = vis.rollout_maps([uniform_attention(1, 1, 4)] * layers, (2, 2), num_prefix_tokens=0)
    np.testing.assert_allclose(gap_map[0], np.full((2, 2), 0.25), atol=1e-6)
    with pytest.raises(ValueError, match="grid"):
        vis.rollout_maps([u], (3, 3), num_prefix_tokens=1)


def test_attention_rollout_of_models():
    x = images()
    model = tiny()
    maps = vis.attention_rollout(model, x, batch_size=2)
    assert maps.shape == (3, 4, 4)
    np.testing.assert_allclose(maps, vis.rollout(vis.attention_weights(model, x))[:, 0, 1:].reshape(3, 4, 4),
                               atol=1e-6)
    gap = tiny(classifier="gap")
    maps = vis.attention_rollout(gap, x)
    np.testing.assert_allclose(maps.sum(axis=(1, 2)), 1.0, atol=1e-5)  # no class column to lose
    with pytest.raises(ValueError, match=r"\[N, 32, 32, 3\]"):
        vis.attention_rollout(model, images(size=16))


# === Position-embedding similarity ===

def test_sincos_similarity_peaks_on_the_diagonal_and_falls_with_distance():
    model = tiny(position_embedding="sincos2d", hidden_size=64, patch_size=4)  # 8x8 grid
    sim = vis.position_embedding_similarity(model)
    assert sim.shape == (8, 8, 8, 8)
    flat = sim.reshape(64, 64)
    np.testing.assert_allclose(np.diag(flat), 1.0, atol=1e-5)
    assert (flat.argmax(axis=1) == np.arange(64)).all()
    y, x = np.mgrid[:8, :8]
    coords = np.stack([y.ravel(), x.ravel()], axis=1)
    ring = np.abs(coords[:, None] - coords[None]).max(axis=-1)
    means = [flat[ring == r].mean() for r in range(4)]
    assert all(a > b for a, b in zip(means, means[1:])), means
    euclid = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    assert all(np.corrcoef(flat[i], euclid[i])[0, 1] < -0.3 for i in range(64))


def test_learned_similarity_is_the_cosine_of_the_weights():
    model = tiny()
    table = np.asarray(model.position_embedding.embedding)[0, 1:]  # class token dropped
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    similarity = vis.position_embedding_similarity(model).reshape(16, 16)
    np.testing.assert_allclose(similarity, unit @ unit.T, atol=1e-5)


@pytest.mark.parametrize("kind", ["none", "relative", "relative_bias"])
def test_similarity_needs_an_absolute_embedding(kind):
    with pytest.raises(ValueError, match="adds no embedding"):
        vis.position_embedding_similarity(tiny(position_embedding=kind))


# === Embedding filters ===

def test_filters_are_the_orthonormal_principal_components():
    from sklearn.decomposition import PCA

    model = tiny(hidden_size=64)
    filters = vis.embedding_filters(model, n=10)
    assert filters.shape == (10, 8, 8, 3)
    flat = filters.reshape(10, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(10), atol=1e-5)
    kernel = np.asarray(model.patch_embed.kernel).reshape(-1, 64).T  # 64 filters of 8x8x3
    reference = PCA(n_components=10, svd_solver="full").fit(kernel).components_
    np.testing.assert_allclose(np.abs(np.sum(flat * reference, axis=1)), 1.0, atol=1e-4)  # equal up to sign


def test_filters_refuse_hybrids_and_too_many_components():
    with pytest.raises(ValueError, match="must be in"):
        vis.embedding_filters(tiny(), n=32)  # 32 filters give 31 components after centring
    hybrid = keras_vit.create_model(None, weights=data_path("r_tiny_hybrid.npz"))
    with pytest.raises(ValueError, match="hybrid"):
        vis.embedding_filters(hybrid)


# === Mean attention distance ===

def test_distance_is_zero_when_each_patch_attends_to_itself():
    eye = np.broadcast_to(np.eye(9, dtype="float32"), (2, 3, 9, 9))
    np.testing.assert_allclose(vis.attention_distance([eye, eye], (3, 3), (16, 16)), np.zeros((2, 3)))


def test_distance_of_uniform_attention_is_the_mean_pairwise_distance():
    # 2x2 grid of 16 px patches: from any patch, 0, 16, 16 and 16 * sqrt(2) away.
    expected = (0 + 16 + 16 + 16 * np.sqrt(2)) / 4
    d = vis.attention_distance([uniform_attention(1, 2, 4)], (2, 2), (16, 16))
    np.testing.assert_allclose(d, [[expected, expected]], rtol=1e-6)
    # A class token's row and column are dropped and the rest renormalised.
    d = vis.attention_distance([uniform_attention(1, 2, 5)], (2, 2), (16, 16), num_prefix_tokens=1)
    np.testing.assert_allclose(d, [[expected, expected]], rtol=1e-6)
    # A non-square grid and non-square patches, against a plain loop over pairs.
    gh, gw, ph, pw = 3, 4, 8, 12
    pairs = [np.hypot((i // gw - j // gw) * ph, (i % gw - j % gw) * pw)
             for i in range(gh * gw) for j in range(gh * gw)]
    d = vis.attention_distance([uniform_attention(1, 1, 12)], (gh, gw), (ph, pw))
    np.testing.assert_allclose(d, [[np.mean(pairs)]], rtol=1e-6)


def test_distance_is_per_layer_and_head():
    eye = np.eye(4, dtype="float32")
    mixed = np.stack([eye, np.full((4, 4), 0.25, "float32")])[None]  # head 0 local, head 1 uniform
    d = vis.attention_distance([mixed, mixed[:, ::-1]], (2, 2), (16, 16))
    expected = (32 + 16 * np.sqrt(2)) / 4
    np.testing.assert_allclose(d, [[0, expected], [expected, 0]], rtol=1e-6)


def test_mean_attention_distance_of_a_model():
    model = tiny()
    x = images()
    d = vis.mean_attention_distance(model, x)
    assert d.shape == (3, 4)
    assert (d > 0).all() and (d < np.hypot(24, 24)).all()  # centres of a 4x4 grid of 8 px patches
    # Uneven batches (2 + 1 images) average to the same figure as one batch.
    np.testing.assert_allclose(vis.mean_attention_distance(model, x, batch_size=2), d, rtol=1e-5)
    expected = vis.attention_distance(vis.attention_weights(model, x), (4, 4), (8, 8), num_prefix_tokens=1)
    np.testing.assert_allclose(d, expected, rtol=1e-5)


# === Plots ===

def test_overlay_blends_the_map_onto_the_image():
    from keras_vit.visualize.plots import to_uint8

    image = images(1)[0]
    m = np.zeros((4, 4), "float32")
    m[1, 2] = 1.0
    out = vis.overlay(image, m, alpha=0.0)
    assert out.dtype == np.uint8 and out.shape == (32, 32, 3)
    np.testing.assert_array_equal(out, to_uint8(image))
    heat = vis.overlay(image, m, alpha=1.0).astype(int).sum(axis=-1)
    assert np.unravel_index(heat.argmax(), heat.shape)[0] // 8 == 1
    assert np.unravel_index(heat.argmax(), heat.shape)[1] // 8 == 2
    gray = vis.overlay(np.zeros((28, 28), np.uint8), m)
    assert gray.shape == (28, 28, 3)
    with pytest.raises(ValueError, match="attention_map"):
        vis.overlay(image, np.zeros((2, 2, 2)))


def test_plots_write_pngs(tmp_path):
    from PIL import Image

    model = tiny(hidden_size=64)
    x = images(2)
    paths = [
        vis.plot_rollout(x, vis.attention_rollout(model, x), str(tmp_path / "r.png"), titles=["a", "b"]),
        vis.plot_position_similarity(vis.position_embedding_similarity(model), str(tmp_path / "s.png")),
        vis.plot_filters(vis.embedding_filters(model, 7), str(tmp_path / "f.png")),
        vis.plot_attention_distance(vis.mean_attention_distance(model, x), str(tmp_path / "d.png"), 32),
    ]
    for p in paths:
        with Image.open(p) as im:
            assert im.format == "PNG" and min(im.size) > 100


# === CLI ===

def _cli(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-m", "keras_vit.visualize", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_draws_every_figure_of_a_trained_model(tmp_path):
    from PIL import Image

    from keras_vit.training import compile_model, get_recipe

    model = tiny(hidden_size=64)
    compile_model(model, get_recipe("pretrain"), total_steps=10)  # saved with our schedule and loss
    model.save(tmp_path / "model.keras")
    folder = tmp_path / "images" / "cats"
    folder.mkdir(parents=True)
    for i in range(2):
        pixels = np.random.RandomState(i).randint(0, 255, (40, 50, 3), np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    out = tmp_path / "out"
    result = _cli("rollout", "posemb", "filters", "distance", f"--model={tmp_path / 'model.keras'}",
                  f"--images={tmp_path / 'images'},skimage:camera", f"--output_dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    expected = {"rollout": (3, 4, 4), "posemb_similarity": (4, 4, 4, 4), "embedding_filters": (28, 8, 8, 3),
                "attention_distance": (3, 4)}
    for stem, shape in expected.items():
        assert f"Wrote {out / stem}.png" in result.stdout
        assert np.load(out / f"{stem}.npy").shape == shape
        assert (out / f"{stem}.png").stat().st_size > 1000
    assert "Read 3 image(s) at 32x32" in result.stdout


def test_cli_reads_a_checkpoint_at_another_resolution_and_rejects_bad_commands(tmp_path):
    result = _cli("posemb", f"--model={data_path('vit_tiny_token_rep.npz')}", "--image_size=48",
                  f"--output_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert np.load(tmp_path / "posemb_similarity.npy").shape == (6, 6, 6, 6)  # 4x4 interpolated to 6x6
    bad = _cli("rollout", "heatmap", "distance")
    assert bad.returncode != 0
    for problem in ("unknown: heatmap", "--model is required", "rollout and distance need --images"):
        assert problem in bad.stderr, bad.stderr[-2000:]
