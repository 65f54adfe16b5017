"""Hugging Face ViT directories: `config.json` + `model.safetensors`, read without torch.

Tensors are converted to the official released naming and layouts (Flax kernels
are [in, out]; PyTorch Linear weights are [out, in] and convs [out, in, kh, kw]).
"""

from __future__ import annotations

import json
import re
from typing import Dict

import numpy as np

from keras_vit import storage
from keras_vit.checkpoints.errors import CheckpointError

_GELU_APPROXIMATE = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True, "gelu_fast": True}


def read_config(path: str) -> dict:
    config_path = storage.join(path, "config.json")
    if not storage.exists(config_path):
        raise CheckpointError(f"{path}: no config.json, so not a Hugging Face model directory")
    config = json.loads(storage.read_text(config_path))
    if config.get("model_type") != "vit":
        raise CheckpointError(
            f"{path}: model_type {config.get('model_type')!r} is not supported; "
            "only Hugging Face 'vit' models (ViTModel, ViTForImageClassification) load")
    return config


def read_tensors(path: str) -> Dict[str, np.ndarray]:
    from safetensors.numpy import load, load_file

    single = storage.join(path, "model.safetensors")
    index = storage.join(path, "model.safetensors.index.json")
    if storage.exists(single):
        files = [single]
    elif storage.exists(index):
        weight_map = json.loads(storage.read_text(index))["weight_map"]
        files = sorted({storage.join(path, v) for v in weight_map.values()})
    else:
        pickled = [n for n in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")
                   if storage.exists(storage.join(path, n))]
        hint = (f" It has {', '.join(pickled)}; save it with safe_serialization=True "
                "(model.save_pretrained) to get model.safetensors." if pickled else "")
        raise CheckpointError(f"{path}: no model.safetensors.{hint}")
    tensors = {}
    for file in files:
        try:
            # A local file is mapped; one in a bucket is read whole first.
            tensors.update(load(storage.read_bytes(file)) if storage.is_url(file) else load_file(file))
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from e
    # ViTForImageClassification prefixes the backbone with "vit."; ViTModel does not.
    return {re.sub(r"^vit\.", "", k): v for k, v in tensors.items()}


def implied_overrides(config: dict) -> dict:
    act = config.get("hidden_act", "gelu")
    if act not in _GELU_APPROXIMATE:
        raise CheckpointError(f"hidden_act {act!r} is not supported "
                              f"(expected one of {list(_GELU_APPROXIMATE)})")
    return {"gelu_approximate": _GELU_APPROXIMATE[act],
            "layer_norm_epsilon": float(config.get("layer_norm_eps", 1e-12))}


def grid_size(config: dict):
    image = config.get("image_size", 224)
    patch = config.get("patch_size", 16)
    image = (image, image) if isinstance(image, int) else tuple(image)
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    return (image[0] // patch[0], image[1] // patch[1])


def num_classes(config: dict, tensors: Dict[str, np.ndarray]) -> int:
    return int(tensors["classifier.weight"].shape[0]) if "classifier.weight" in tensors else 0


def class_names(config: dict):
    id2label = config.get("id2label")
    if not id2label:
        return None
    return [id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label))]


def infer_config_fields(config: dict, tensors: Dict[str, np.ndarray]) -> dict:
    patch = config.get("patch_size", 16)
    image = config.get("image_size", 224)
    return dict(
        hidden_size=config["hidden_size"], num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"], mlp_dim=config["intermediate_size"],
        patch_size=patch, image_size=image, num_channels=config.get("num_channels", 3),
        classifier="token", position_embedding="learned", resnet=None,
        representation_size=config["hidden_size"] if "pooler.dense.weight" in tensors else None,
        num_classes=num_classes(config, tensors),
    )


def canonicalise(config: dict, tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """HF tensor names and layouts -> the official released ones."""
    heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    head_dim = hidden // heads
    t = dict(tensors)
    out = {}

    def pop(name):
        if name not in t:
            raise CheckpointError(f"Hugging Face checkpoint is missing tensor {name!r}")
        return t.pop(name)

    def dense(src, dst):
        out[f"{dst}/kernel"] = pop(f"{src}.weight").T
        out[f"{dst}/bias"] = pop(f"{src}.bias")

    def norm(src, dst):
        out[f"{dst}/scale"] = pop(f"{src}.weight")
        out[f"{dst}/bias"] = pop(f"{src}.bias")

    out["cls"] = pop("embeddings.cls_token")
    out["Transformer/posembed_input/pos_embedding"] = pop("embeddings.position_embeddings")
    out["embedding/kernel"] = pop("embeddings.patch_embeddings.projection.weight").transpose(2, 3, 1, 0)
    out["embedding/bias"] = pop("embeddings.patch_embeddings.projection.bias")
    for i in range(config["num_hidden_layers"]):
        src, dst = f"encoder.layer.{i}", f"Transformer/encoderblock_{i}"
        norm(f"{src}.layernorm_before", f"{dst}/LayerNorm_0")
        norm(f"{src}.layernorm_after", f"{dst}/LayerNorm_2")
        attn = f"{dst}/MultiHeadDotProductAttention_1"
        for name in ("query", "key", "value"):
            w = pop(f"{src}.attention.attention.{name}.weight")
            b = t.pop(f"{src}.attention.attention.{name}.bias", np.zeros(hidden, w.dtype))  # qkv_bias=False
            out[f"{attn}/{name}/kernel"] = w.T.reshape(hidden, heads, head_dim)
            out[f"{attn}/{name}/bias"] = b.reshape(heads, head_dim)
        out_kernel = pop(f"{src}.attention.output.dense.weight").T
        out[f"{attn}/out/kernel"] = out_kernel.reshape(heads, head_dim, hidden)
        out[f"{attn}/out/bias"] = pop(f"{src}.attention.output.dense.bias")
        dense(f"{src}.intermediate.dense", f"{dst}/MlpBlock_3/Dense_0")
        dense(f"{src}.output.dense", f"{dst}/MlpBlock_3/Dense_1")
    norm("layernorm", "Transformer/encoder_norm")
    if "pooler.dense.weight" in t:
        dense("pooler.dense", "pre_logits")
    if "classifier.weight" in t:
        dense("classifier", "head")
    if t:
        raise CheckpointError(
            f"Hugging Face checkpoint has tensors keras_vit does not know: {sorted(t)[:10]}")
    return out
