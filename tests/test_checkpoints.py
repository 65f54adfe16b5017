"""Checkpoint loading against vectors from the official code and from transformers."""

import json
import os
import re
import shutil

import numpy as np
import pytest
from conftest import data_path, load_io
from scipy import ndimage

import keras_vit
from keras_vit.checkpoints import CheckpointError, interpolate_posembed, load_into, open_checkpoint
from keras_vit.checkpoints.posemb import zoom_linear

TOKEN_REP = data_path("vit_tiny_token_rep.npz")
HYBRID = data_path("r_tiny_hybrid.npz")
HF_CLF = data_path("hf_vit_tiny")
HF_POOLER = data_path("hf_vit_tiny_pooler")


def read(path):
    with np.load(path) as d:
        return {k: d[k] for k in d.files}


def logits(model, x):
    return model.predict(x, verbose=0)


@pytest.mark.parametrize("ckpt, io", [(TOKEN_REP, "vit_tiny_token_rep_io.npz"),
                                      (HYBRID, "r_tiny_hybrid_io.npz")])
def test_official_logits_match(ckpt, io):
    ref = load_io(io)
    model = keras_vit.create_model(None, weights=ckpt)
    np.testing.assert_allclose(logits(model, ref["images"]), ref["logits"], atol=1e-4)


def test_architecture_is_inferred_from_the_checkpoint():
    cfg = keras_vit.create_model(None, weights=HYBRID).config
    assert cfg.resnet.num_layers == (1,) and cfg.resnet.width_factor == 0.5
    assert (cfg.hidden_size, cfg.num_heads, cfg.mlp_dim, cfg.num_layers) == (64, 4, 128, 2)
    assert cfg.image_size == (32, 32) and cfg.num_classes == 10 and cfg.representation_size is None
    cfg = keras_vit.create_model(None, weights=TOKEN_REP).config
    assert cfg.patch_size == (8, 8) and cfg.representation_size == 32 and cfg.classifier == "token"


def test_named_config_with_explicit_overrides_loads_the_same():
    ref = load_io("vit_tiny_token_rep_io.npz")
    model = keras_vit.create_model("ViT-Ti/16", weights=TOKEN_REP, image_size=32, patch_size=8,
                                   hidden_size=64, mlp_dim=128, num_heads=4, num_layers=2,
                                   representation_size=32)
    np.testing.assert_allclose(logits(model, ref["images"]), ref["logits"], atol=1e-4)


def test_posemb_224_to_384_matches_the_official_interpolation():
    ref = read(data_path("vit_ti16_posemb_224_to_384.npz"))
    out = interpolate_posembed(ref["posemb"], (24, 24), num_prefix_tokens=1)
    assert out.shape == (1, 577, 192)
    np.testing.assert_allclose(out, ref["posemb_384"], atol=1e-5)


def test_zoom_matches_scipy_on_non_square_grids():
    grid = np.random.RandomState(0).normal(size=(3, 5, 4)).astype("float32")
    for new in [(7, 4), (6, 10), (3, 2)]:
        expected = ndimage.zoom(grid, (new[0] / 3, new[1] / 5, 1), order=1)
        np.testing.assert_allclose(zoom_linear(grid, new), expected, atol=1e-5)


def test_fine_tuning_at_a_higher_resolution_interpolates_and_resets_the_head(caplog):
    params = read(TOKEN_REP)
    model = keras_vit.create_model(None, weights=TOKEN_REP, image_size=64, num_classes=3,
                                   representation_size=None)
    assert model.config.grid_size == (8, 8)
    expected = interpolate_posembed(params["Transformer/posembed_input/pos_embedding"], (8, 8), 1)
    np.testing.assert_allclose(model.position_embedding.embedding.numpy(), expected, atol=1e-6)
    assert np.all(model.head.kernel.numpy() == 0) and model.head.kernel.shape == (64, 3)
    x = np.random.RandomState(0).uniform(-1, 1, (2, 64, 64, 3)).astype("float32")
    np.testing.assert_array_equal(logits(model, x), 0.0)
    # The transformer weights did load.
    np.testing.assert_array_equal(model.blocks[1].mlp.fc2.kernel.numpy(),
                                  params["Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel"])
    notes = load_into(model, open_checkpoint(TOKEN_REP))
    assert any("resized from a 4x4 grid to 8x8" in n for n in notes)
    assert any("head re-initialised to zeros for 3 classes (checkpoint has a 10-class head)" in n
               for n in notes)
    assert any("pre_logits" in n and "dropped" in n for n in notes)


def to_flax_naming(params):
    names = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
             "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}
    return {re.sub(r"/(MultiHeadDotProductAttention_1|LayerNorm_2|MlpBlock_3)/",
                   lambda m: f"/{names[m.group(1)]}/", k): v for k, v in params.items()}


def to_big_vision_naming(params):
    flax = to_flax_naming(params)
    out, stacked = {}, {}
    for k, v in flax.items():
        m = re.match(r"^Transformer/encoderblock_(\d+)/(.+)$", k)
        if m:
            stacked.setdefault(m.group(2), {})[int(m.group(1))] = v
        elif k == "Transformer/posembed_input/pos_embedding":
            out["params/pos_embedding"] = v[:, 1:]  # big_vision: patches only
        else:
            out[f"params/{k}"] = v
    for name, per_layer in stacked.items():
        out[f"params/Transformer/encoderblock/{name}"] = np.stack([per_layer[i] for i in sorted(per_layer)])
    return out


@pytest.mark.parametrize("convert", [to_flax_naming, to_big_vision_naming])
def test_flax_and_big_vision_naming_load_the_same(tmp_path, convert):
    params = read(TOKEN_REP)
    if convert is to_big_vision_naming:
        # big_vision gives the class token no position embedding: make that true of the reference.
        params["Transformer/posembed_input/pos_embedding"][:, 0] = 0
    ref_model = keras_vit.create_model(None, weights=TOKEN_REP)
    load_into(ref_model, open_checkpoint(_save(tmp_path / "released.npz", params)))
    path = _save(tmp_path / "converted.npz", convert(params))
    model = keras_vit.create_model(None, weights=path)
    assert model.config == ref_model.config.replace(name=model.config.name)
    x = load_io("vit_tiny_token_rep_io.npz")["images"]
    np.testing.assert_allclose(logits(model, x), logits(ref_model, x), atol=1e-6)


def _save(path, params):
    np.savez(path, **params)
    return str(path)


def test_hugging_face_classifier_matches_transformers():
    ref = load_io("hf_vit_tiny_io.npz")
    model = keras_vit.create_model(None, weights=HF_CLF)
    # Taken from config.json: exact GELU and eps 1e-12, unlike the official models.
    assert model.config.gelu_approximate is False
    assert model.config.layer_norm_epsilon == 1e-12
    np.testing.assert_allclose(logits(model, ref["images"]), ref["logits"], atol=1e-4)
    assert open_checkpoint(HF_CLF).class_names() == [f"class_{i}" for i in range(10)]


def test_hugging_face_pooler_is_the_representation_layer():
    ref = load_io("hf_vit_tiny_io.npz")
    model = keras_vit.create_model(None, weights=HF_POOLER)
    assert model.config.representation_size == 64 and model.head is None
    np.testing.assert_allclose(logits(model, ref["images"]), ref["pooler_output"], atol=1e-4)


def test_hugging_face_sharded_safetensors(tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(os.path.join(HF_CLF, "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(os.path.join(HF_CLF, "config.json"), tmp_path / "config.json")
    ref = load_io("hf_vit_tiny_io.npz")
    np.testing.assert_allclose(logits(keras_vit.create_model(None, weights=str(tmp_path)), ref["images"]),
                               ref["logits"], atol=1e-4)


def test_hugging_face_pickle_only_directory_is_refused(tmp_path):
    shutil.copy(os.path.join(HF_CLF, "config.json"), tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="no model.safetensors.*pytorch_model.bin.*safe_serialization"):
        open_checkpoint(str(tmp_path))


def test_hugging_face_other_model_types_are_refused(tmp_path):
    config = json.loads(open(os.path.join(HF_CLF, "config.json")).read())
    config["model_type"] = "deit"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model_type 'deit' is not supported"):
        open_checkpoint(str(tmp_path))


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.pop("Transformer/encoderblock_1/LayerNorm_2/scale"),
     r"missing tensor 'Transformer/encoderblock_1/LayerNorm_2/scale'"),
    (lambda p: p.update({"Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel":
                         np.zeros((64, 100), "float32")}),
     r"'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel' has shape \(64, 100\), "
     r"model expects \(64, 128\)"),
    (lambda p: p.update({"Transformer/encoderblock_0/extra/kernel": np.zeros(3, "float32")}),
     r"fit no part of model .*'Transformer/encoderblock_0/extra/kernel'"),
    (lambda p: p.update({"Transformer/encoderblock_0/MultiHeadDotProductAttention_1/key/kernel":
                         np.zeros((64, 2, 32), "float32")}),
     r"MultiHeadDotProductAttention_1/key/kernel' has shape \(64, 2, 32\), model expects \(64, 4, 16\)"),
])
def test_bad_checkpoints_name_the_tensor_and_write_nothing(tmp_path, edit, message):
    model = keras_vit.create_model(None, weights=TOKEN_REP)
    before = [w.numpy().copy() for w in model.weights]
    params = read(TOKEN_REP)
    for k in params:
        params[k] = params[k] + 1.0  # any write would show
    edit(params)
    path = _save(tmp_path / "bad.npz", params)
    with pytest.raises(CheckpointError, match=message):
        load_into(model, open_checkpoint(path))
    for b, w in zip(before, model.weights):
        np.testing.assert_array_equal(b, w.numpy())


def test_pickled_npz_is_refused(tmp_path):
    path = str(tmp_path / "pickled.npz")
    np.savez(path, obj=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="pickled objects.*allow_pickle=False"):
        open_checkpoint(path)


def test_not_a_checkpoint(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a readable .npz"):
        open_checkpoint(str(bad))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="unknown checkpoint format"):
        open_checkpoint(str(other))


def test_files_that_are_not_vit_checkpoints_are_named_with_what_they_hold(tmp_path):
    mixer = _save(tmp_path / "mixer.npz", {"stem/kernel": np.zeros((16, 16, 3, 8), "float32"),
                                           "MixerBlock_0/LayerNorm_0/scale": np.ones(8, "float32")})
    with pytest.raises(CheckpointError, match=re.escape(
            f"{mixer}: not a ViT checkpoint: it has no tensor 'embedding/kernel' (it has 2 tensors, "
            "e.g. 'MixerBlock_0/LayerNorm_0/scale', 'stem/kernel')")):
        keras_vit.create_model("ViT-B/16", weights=mixer)
    params = read(TOKEN_REP)
    del params["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"]
    truncated = _save(tmp_path / "truncated.npz", params)
    with pytest.raises(CheckpointError, match=re.escape(
            f"{truncated}: an incomplete ViT checkpoint: it has no tensor "
            "'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel'")):
        open_checkpoint(truncated)
    config = json.loads(open(os.path.join(HF_CLF, "config.json")).read())
    shutil.copy(os.path.join(HF_CLF, "model.safetensors"), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    missing = re.escape(f"{tmp_path}: Hugging Face checkpoint is missing tensor")
    with pytest.raises(CheckpointError, match=missing):
        open_checkpoint(str(tmp_path))


def test_learned_posemb_into_a_model_without_one_is_an_error():
    with pytest.raises(CheckpointError, match="learned position embeddings but the model uses 'sincos2d'"):
        keras_vit.create_model(None, weights=TOKEN_REP, position_embedding="sincos2d")


def test_inspect_checkpoint_prints_names_and_shapes():
    lines = []
    shapes = keras_vit.inspect_checkpoint(HYBRID, print_fn=lines.append)
    assert shapes["block1/unit1/conv_proj/kernel"] == (1, 1, 32, 128)
    assert "npz (released naming)" in lines[0]
    assert any("Transformer/posembed_input/pos_embedding" in line and "(1, 65, 64)" in line for line in lines)
    hf = keras_vit.inspect_checkpoint(HF_CLF, print_fn=lambda s: None)
    assert hf["embedding/kernel"] == (8, 8, 3, 64)


def test_the_command_lines_report_a_model_they_cannot_read_as_a_bad_flag(tmp_path):
    from keras_vit.cli import load_model_or_exit

    np.savez(tmp_path / "weights.npz", something=np.zeros(3))
    keras_vit.create_model(None, weights=data_path("vit_tiny_token_rep.npz")).save(tmp_path / "m.keras")
    for path, size, message in [(tmp_path / "none.keras", None, "no model at"),
                                (tmp_path / "weights.npz", None, "not a ViT checkpoint"),
                                (tmp_path / "m.keras", 64, "image_size applies to checkpoints")]:
        with pytest.raises(SystemExit) as exit_:
            load_model_or_exit(str(path), size)
        text = str(exit_.value.code)
        assert text.startswith(f"--model={path}: ") and message in text and "--helpshort" in text
    assert load_model_or_exit(str(tmp_path / "m.keras")).config.hidden_size == 64


@pytest.mark.parametrize("path", [TOKEN_REP, HYBRID])
def test_save_npz_writes_the_official_file_back(tmp_path, path):
    """A loaded official checkpoint, saved again, holds the same tensors under the same
    names and layouts (class token, fused attention split back, ResNet stem, head)."""
    model = keras_vit.create_model(None, weights=path)
    written = keras_vit.save_npz(model, str(tmp_path / "again.npz"))
    original, again = read(path), read(written)
    assert sorted(again) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(again[name], value.astype("float32"), err_msg=name)


@pytest.mark.parametrize("kind", ["relative", "relative_bias"])
def test_an_npz_of_a_relative_model_keeps_its_relative_tables(tmp_path, kind):
    from conftest import randomise, tiny

    model = randomise(tiny(position_embedding=kind))
    path = keras_vit.save_npz(model, str(tmp_path / "model.npz"))
    table = "relative_key" if kind == "relative" else "relative_bias"
    assert f"Transformer/encoderblock_1/MultiHeadDotProductAttention_1/{table}" in read(path)
    again = keras_vit.create_model(model.config, weights=path)
    x = np.random.RandomState(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(again.predict(x, verbose=0), model.predict(x, verbose=0))
