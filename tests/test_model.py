"""VisionTransformer: sizes, saving, intermediates, precision and initialisation."""

import json
import os

import keras
import numpy as np
import pytest
import bf16_bounds
from conftest import TINY, randomise, tiny

import keras_vit
from keras_vit import ViTConfig
from keras_vit.precision import with_policy


OFFICIAL_PARAMS = {
    "ViT-Ti/16": 5_717_416,
    "ViT-S/16": 22_050_664,
    "ViT-B/16": 86_567_656,
    "ViT-B/32": 88_224_232,
    "ViT-L/16": 304_326_632,
    "ViT-H/14": 632_045_800,
    "R50+ViT-B/16": 98_659_112,
    "R26+ViT-S/32": 36_431_912,
    "R+ViT-Ti/16": 6_337_704,
}


@pytest.mark.parametrize("name", list(OFFICIAL_PARAMS))
def test_parameter_counts_equal_the_official_ones(name):
    model = keras_vit.create_model(name, num_classes=1000, image_size=224)
    assert model.count_params() == OFFICIAL_PARAMS[name]


def images(n=2, h=32, w=32, seed=0):
    return np.random.RandomState(seed).uniform(-1, 1, (n, h, w, 3)).astype("float32")


@pytest.mark.parametrize("changes", [
    dict(),
    dict(classifier="gap", position_embedding="sincos2d"),
    dict(position_embedding="relative", stochastic_depth_rate=0.1, dropout_rate=0.1),
    dict(position_embedding="relative_bias"),
    dict(position_embedding="none", representation_size=16),
    dict(patch_size=1, resnet={"num_layers": (1,), "width_factor": 0.5}),
])
def test_keras_file_round_trip_gives_identical_outputs(tmp_path, changes):
    model = randomise(tiny(**changes))
    x = images()
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, keras_vit.VisionTransformer)
    assert loaded.config == model.config
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("changes", [
    dict(representation_size=16),
    dict(classifier="gap", position_embedding="relative"),
    dict(patch_size=1, resnet={"num_layers": (1,), "width_factor": 0.5}),
])
def test_compute_dtype_twin_holds_cast_weights_and_gives_the_same_outputs(policy, changes):
    mixed = with_policy(randomise(tiny(**changes)), policy)
    twin = keras_vit.compute_dtype_twin(mixed)
    compute = policy.split("_")[1]
    assert {w.dtype for w in mixed.weights} == {"float32"}
    # What mixed precision never casts stays float32: the head and the LayerNorms.
    kept = {w.path for w in mixed.weights if not w._autocast} | {"head/kernel", "head/bias"}
    assert any("LayerNorm_0/gamma" in p for p in kept)
    assert {w.path for w in twin.weights if w.dtype == "float32"} == kept
    assert {w.dtype for w in twin.weights} == {compute, "float32"}
    x = images(4)
    out = mixed.predict(x, verbose=0)
    assert not np.allclose(out, 0)
    np.testing.assert_array_equal(twin.predict(x, verbose=0), out)
    assert keras_vit.compute_dtype_twin(twin) is twin
    float32 = with_policy(mixed, "float32")
    assert keras_vit.compute_dtype_twin(float32) is float32


def test_to_precision_returns_the_model_or_its_twin_under_the_policy():
    from keras_vit.precision import model_policy, to_precision

    mixed = with_policy(randomise(tiny()), "mixed_bfloat16")
    assert to_precision(mixed, "mixed_bfloat16") is mixed
    float32 = to_precision(mixed, "float32")
    assert model_policy(float32) == "float32" and float32.config == mixed.config
    for a, b in zip(float32.get_weights(), mixed.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="precision must be one of"):
        to_precision(mixed, "bf16")


def test_non_square_images_and_any_multiple_of_the_patch():
    model = tiny(image_size=(32, 48))
    assert model.config.grid_size == (4, 6)
    assert model.predict(images(h=32, w=48), verbose=0).shape == (2, 5)
    assert model.position_embedding.embedding.shape == (1, 25, 32)


def test_images_with_the_wrong_channel_count_are_refused_by_name():
    rgb = tiny()
    with pytest.raises(ValueError, match=r"expected shape=\(None, 32, 32, 3\), found shape=\(2, 32, 32, 1\)"):
        rgb(np.zeros((2, 32, 32, 1), "float32"))  # Keras's own spec lets a last axis of 1 through
    with pytest.raises(ValueError, match=r"expected axis -1 of input shape to have value 3"):
        rgb.forward(np.zeros((2, 32, 32, 1), "float32"))
    gray = tiny(num_channels=1)
    assert gray(np.zeros((2, 32, 32), "float32")).shape == (2, 5)  # [B, H, W] still reads as 1 channel
    # TF would read 3 channels as a grouped convolution of a 1-channel kernel and return numbers.
    wrong = r'layer ["\']embedding["\'] is incompatible.*axis -1 of input shape to have value 1'
    with pytest.raises(ValueError, match=wrong):
        gray(np.zeros((2, 32, 32, 3), "float32"))
    hybrid = keras_vit.create_model(
        ViTConfig(name="r", resnet=keras_vit.ResNetConfig(num_layers=()), **{**TINY, "patch_size": 2}))
    with pytest.raises(ValueError, match=r"found shape=\(2, 32, 32, 1\)"):
        hybrid(np.zeros((2, 32, 32, 1), "float32"))


def test_forward_returns_attention_and_tokens_per_layer():
    model = randomise(tiny(num_layers=3))
    out = model.forward(images(), return_attention=True, return_tokens=True)
    assert len(out["attention"]) == 3 and len(out["tokens"]) == 3
    assert out["attention"][0].shape == (2, 4, 17, 17)
    np.testing.assert_allclose(np.sum(out["attention"][2], -1), 1.0, atol=1e-5)
    assert out["tokens"][-1].shape == (2, 17, 32)
    np.testing.assert_allclose(out["encoded"], model.encoder_norm(out["tokens"][-1]), atol=1e-6)
    np.testing.assert_allclose(out["logits"], model.predict(images(), verbose=0), atol=1e-5)


def test_gap_model_has_no_class_token_and_averages():
    model = randomise(tiny(classifier="gap"))
    out = model.forward(images())
    assert model.class_token is None
    assert out["encoded"].shape == (2, 16, 32)
    np.testing.assert_allclose(out["pre_logits"], np.mean(out["encoded"], axis=1), atol=1e-6)


def test_feature_extractor_outputs_pre_logits():
    model = randomise(tiny(representation_size=16))
    feats = model.feature_extractor().predict(images(), verbose=0)
    assert feats.shape == (2, 16)
    np.testing.assert_allclose(feats, model.forward(images())["pre_logits"], atol=1e-5)
    assert np.abs(feats).max() <= 1.0  # tanh


def test_headless_model_outputs_features():
    model = tiny(num_classes=0)
    assert model.head is None
    assert model.predict(images(), verbose=0).shape == (2, 32)


def test_initialisation_follows_the_official_code():
    model = keras_vit.create_model("ViT-S/16", num_classes=10, head_bias_init=-2.0)
    block = model.blocks[0]
    assert np.all(model.class_token.cls.numpy() == 0)
    assert np.all(model.head.kernel.numpy() == 0)
    assert np.all(model.head.bias.numpy() == -2.0)
    assert np.std(model.position_embedding.embedding.numpy()) == pytest.approx(0.02, rel=0.05)
    assert 0 < np.std(block.mlp.fc1.bias.numpy()) < 1e-5
    # xavier-uniform per q/k/v block: limit sqrt(6 / (D + D)).
    limit = np.sqrt(6 / (2 * 384))
    qkv = block.attention.qkv_kernel.numpy()
    assert np.abs(qkv).max() <= limit and np.abs(qkv).max() > 0.98 * limit
    assert np.std(qkv) == pytest.approx(limit / np.sqrt(3), rel=0.02)


def test_fresh_model_predicts_the_head_bias():
    logits = tiny(head_bias_init=-3.0).predict(images(), verbose=0)
    np.testing.assert_array_equal(logits, -3.0)


def test_predict_traces_at_most_twice_over_batch_sizes():
    """A ragged last batch relaxes the batch dimension once; no batch size after it
    traces (and, with XLA, compiles) the forward pass again."""
    model = randomise(tiny(), seed=2)
    x = np.random.RandomState(0).uniform(-1, 1, (70, *images().shape[1:])).astype("float32")
    whole = model.predict(x, batch_size=32, verbose=0)  # 32, 32, then 6
    for batch_size in (16, 9, 70):
        np.testing.assert_allclose(model.predict(x, batch_size=batch_size, verbose=0), whole,
                                   rtol=1e-5, atol=1e-5)
    assert model.predict_function.experimental_get_tracing_count() == 2


def test_mixed_bfloat16_keeps_logits_float32_and_is_as_accurate_as_the_plain_forms(monkeypatch):
    """The whole model in mixed_bfloat16, with the graph forms these cores pick, against
    the float32 model: no less accurate than the same model in its plain forms (those
    it takes where TF's oneDNN does not run bf16), by `bf16_bounds.assert_as_accurate`."""
    import tensorflow as tf

    from keras_vit import hardware

    x = images(n=16)
    ref = randomise(tiny(), seed=1)
    weights = ref.get_weights()
    exact = ref.predict(x, verbose=0)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = tiny()
    model.set_weights(weights)
    out = model.forward(x, return_attention=True)
    assert out["logits"].dtype == "float32"
    assert out["attention"][0].dtype == "float32"
    assert model.blocks[0].attention.compute_dtype == "bfloat16"
    chosen = tf.function(lambda t: model(t, training=False))(x).numpy()
    monkeypatch.setattr(hardware, "onednn_runs", lambda dtype="float32": False)
    plain = tf.function(lambda t: model(t, training=False))(x).numpy()
    bf16_bounds.assert_as_accurate(chosen, plain, exact, "mixed_bfloat16 logits")


def test_dropout_and_stochastic_depth_only_act_in_training():
    model = randomise(tiny(dropout_rate=0.3, attention_dropout_rate=0.3, stochastic_depth_rate=0.3))
    x = images()
    a = model(x, training=False)
    np.testing.assert_array_equal(a, model(x, training=False))
    assert not np.allclose(a, model(x, training=True))
    rates = [b.stochastic_depth_rate for b in model.blocks]
    assert rates == [0.0, 0.3]


@pytest.mark.parametrize("changes", [{}, {"classifier": "gap"}, {"position_embedding": "relative"},
                                     {"position_embedding": "relative_bias"}])
def test_training_and_inference_compute_the_same_function(changes):
    """Training takes another GELU (XLA-fused) and the stochastic-depth branches;
    with no dropout it must give inference's logits."""
    model = randomise(tiny(**changes))
    x = images()
    np.testing.assert_allclose(model(x, training=True), model(x, training=False), atol=1e-5)


def test_fit_reduces_the_loss_on_a_learnable_task():
    model = tiny(num_classes=2)
    x = images(64, seed=3)
    y = (x[:, :16].mean(axis=(1, 2, 3)) > x[:, 16:].mean(axis=(1, 2, 3))).astype("int32")
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, epochs=15, batch_size=16, verbose=0)
    assert history.history["loss"][-1] < 0.8 * history.history["loss"][0]


def test_create_model_from_json_file_and_dict(tmp_path):
    cfg = ViTConfig(name="tiny", **TINY)
    path = tmp_path / "cfg.json"
    path.write_text(cfg.to_json())
    assert keras_vit.create_model(str(path)).config == cfg
    assert keras_vit.create_model(json.loads(cfg.to_json())).config == cfg
    overridden = keras_vit.create_model("ViT-Ti/16", num_classes=3, image_size=64, num_layers=1)
    assert overridden.config.num_layers == 1


def test_create_model_needs_something_to_build():
    with pytest.raises(ValueError, match="needs a model name"):
        keras_vit.create_model(None)
    with pytest.raises(FileNotFoundError):
        keras_vit.create_model(None, weights=os.path.join("no", "such.npz"))
