"""The model registry and the config dataclass."""

import json

import numpy as np
import pytest

import keras_vit
from keras_vit import ResNetConfig, ViTConfig, model_config


def test_registry_has_every_size_and_patch_and_the_hybrids():
    names = keras_vit.list_models()
    for family in ("Ti", "S", "B", "L", "H"):
        for patch in (8, 14, 16, 32):
            assert f"ViT-{family}/{patch}" in names
    for hybrid in ("R50+ViT-B/16", "R26+ViT-S/32", "R26+ViT-B/32", "R50+ViT-L/32", "R+ViT-Ti/16"):
        assert hybrid in names


@pytest.mark.parametrize("spelling", ["ViT-B/16", "vit-b/16", "VIT-B_16", " ViT-B/16 "])
def test_names_are_case_insensitive_and_accept_the_file_spelling(spelling):
    assert model_config(spelling).name == "ViT-B/16"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'ViT-X/16'.*ViT-B/16"):
        model_config("ViT-X/16")


def test_paper_architectures():
    l16 = model_config("ViT-L/16")
    assert (l16.hidden_size, l16.mlp_dim, l16.num_heads, l16.num_layers) == (1024, 4096, 16, 24)
    h14 = model_config("ViT-H/14")
    assert (h14.hidden_size, h14.patch_size, h14.num_layers) == (1280, (14, 14), 32)
    r50 = model_config("R50+ViT-B/16")
    assert r50.resnet.num_layers == (3, 4, 9) and r50.patch_size == (1, 1)
    assert r50.grid_size == (14, 14)


def test_json_round_trip_keeps_every_field():
    cfg = model_config("R26+ViT-S/32").replace(image_size=(384, 256), representation_size=128,
                                               position_embedding="relative", stochastic_depth_rate=0.1)
    again = ViTConfig.from_json(cfg.to_json())
    assert again == cfg
    assert isinstance(again.resnet, ResNetConfig)
    assert json.loads(cfg.to_json())["resnet"] == {"num_layers": [2, 2, 2, 2], "width_factor": 1.0}


@pytest.mark.parametrize("changes, message", [
    (dict(image_size=230), "multiple of the total patch stride"),
    (dict(classifier="map"), "classifier must be one of"),
    (dict(position_embedding="rope"), "position_embedding must be one of"),
    (dict(num_heads=5), "not divisible by num_heads"),
    (dict(dropout_rate=1.0), "dropout_rate must be in"),
    (dict(patch_size=0), "patch_size must be a positive"),
])
def test_bad_configs_are_rejected_with_a_reason(changes, message):
    with pytest.raises(ValueError, match=message):
        model_config("ViT-B/16").replace(**changes)


@pytest.mark.parametrize("size", [224.0, 224.5, True, "224", (224,), (224, 0), (224.0, 224.0), None])
def test_sizes_must_be_whole_numbers(size):
    # int() would quietly make 224.5 a 224 and a string a TypeError about iteration.
    with pytest.raises(ValueError, match=r"image_size must be a positive int or a pair of them, got"):
        model_config("ViT-B/16").replace(image_size=size)


def test_numpy_ints_and_arrays_are_sizes():
    assert model_config("ViT-B/16").replace(image_size=np.int64(384)).image_size == (384, 384)
    cfg = model_config("ViT-B/16").replace(image_size=np.array([224, 160]), patch_size=[16, 16])
    assert cfg.image_size == (224, 160) and cfg.patch_size == (16, 16)
    assert all(type(v) is int for v in cfg.image_size)  # JSON-serialisable


def test_unknown_override_names_the_valid_fields():
    with pytest.raises(TypeError, match="unknown config field.*hidden_dim.*hidden_size"):
        model_config("ViT-B/16").replace(hidden_dim=3)


def test_hybrid_stride_counts_the_resnet():
    cfg = model_config("R50+ViT-B/16")
    assert cfg.total_stride == (16, 16)
    with pytest.raises(ValueError, match="ResNet stride 16"):
        cfg.replace(image_size=200)


def test_one_lookup_of_a_model_config_that_keras_get_config_does_not_meet():
    import keras_vit

    assert not hasattr(keras_vit, "get_config") and not hasattr(keras_vit, "MODEL_CONFIGS")
    cfg = keras_vit.model_config("fmnist-vit")
    assert (cfg.name, cfg.image_size, cfg.num_classes, cfg.hidden_size) == ("FMNIST-ViT", (28, 28), 10, 64)
    assert keras_vit.model_config(cfg) is cfg
    assert keras_vit.model_config(cfg.to_dict()) == cfg
    assert "FMNIST-ViT" in keras_vit.list_models()
