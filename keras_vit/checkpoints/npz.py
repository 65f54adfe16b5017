"""Official ViT `.npz` checkpoints: the released naming, current Flax and big_vision.

All three are turned into the released naming (`MultiHeadDotProductAttention_1`,
`LayerNorm_2`, `MlpBlock_3`), the canonical form `load_into` reads.
"""

from __future__ import annotations

import re
import zipfile
from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from keras_vit import storage
from keras_vit.checkpoints.errors import CheckpointError

# Current Flax (and big_vision) number the modules of a block per type.
_FLAX_BLOCK_NAMES = {
    "LayerNorm_0": "LayerNorm_0",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


def read_npz(path: str) -> Dict[str, np.ndarray]:
    """Every array of an `.npz`, refusing pickled objects."""
    if not storage.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    with tf.io.gfile.GFile(path, "rb") as f:  # local or in a bucket
        if not _is_zip(f):
            raise CheckpointError(f"{path}: not a readable .npz checkpoint (not a zip archive)")
        f.seek(0)
        return _arrays(path, f)


def _is_zip(f) -> bool:
    try:
        return zipfile.is_zipfile(f)
    except tf.errors.OpError:  # GFile refuses to seek before the start of a file shorter than a zip's end
        return False


def _arrays(path, f) -> Dict[str, np.ndarray]:
    try:
        with np.load(f, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (zipfile.BadZipFile, OSError, EOFError, tf.errors.OpError) as e:
        raise CheckpointError(f"{path}: not a readable .npz checkpoint ({e})") from e
    except ValueError as e:
        raise CheckpointError(
            f"{path}: holds pickled objects, which are not loaded (allow_pickle=False): {e}") from e


def _strip_prefixes(params):
    out = {}
    for key, value in params.items():
        key = re.sub(r"^(opt/target/|params/|target/)", "", key)
        key = re.sub(r"^img/", "", key)  # big_vision two-tower (image side)
        out[key] = value
    return out


def _unstack_scanned(params):
    """big_vision `scan=True` stores all blocks in one `encoderblock/...` tensor per name."""
    out = {}
    for key, value in params.items():
        m = re.match(r"^Transformer/encoderblock/(.+)$", key)
        if m:
            for i in range(value.shape[0]):
                out[f"Transformer/encoderblock_{i}/{m.group(1)}"] = value[i]
        else:
            out[key] = value
    return out


def _rename_blocks(params):
    if not any(re.search(r"/(MlpBlock_0|MultiHeadDotProductAttention_0)/", k) for k in params):
        return params
    out = {}
    for key, value in params.items():
        m = re.match(r"^(Transformer/encoderblock_\d+)/([^/]+)/(.+)$", key)
        if m and m.group(2) in _FLAX_BLOCK_NAMES:
            key = f"{m.group(1)}/{_FLAX_BLOCK_NAMES[m.group(2)]}/{m.group(3)}"
        out[key] = value
    return out


def canonicalise(params: Dict[str, np.ndarray]) -> Tuple[Dict[str, np.ndarray], str]:
    """Returns (params in the released naming, naming found: released/flax/big_vision)."""
    params = _strip_prefixes(params)
    naming = "released"
    if "pos_embedding" in params or any(k.startswith("Transformer/encoderblock/") for k in params):
        naming = "big_vision"
    elif any(re.search(r"/MlpBlock_0/", k) for k in params):
        naming = "flax"
    params = _rename_blocks(_unstack_scanned(params))
    if "MAPHead_0/probe" in params or any(k.startswith("MAPHead_0/") for k in params):
        raise CheckpointError("checkpoint uses a MAP (attention-pooling) head, which keras_vit "
                              "does not implement; supported classifiers are 'token' and 'gap'")
    if "pos_embedding" in params:
        # big_vision adds position embeddings to the patches only; the class token
        # gets none, which is a zero row in the released layout.
        posemb = params.pop("pos_embedding")
        if "cls" in params:
            posemb = np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)
        params["Transformer/posembed_input/pos_embedding"] = posemb
    return params, naming


def infer_config_fields(params: Dict[str, np.ndarray], naming: str,
                        grid: Optional[Tuple[int, int]] = None) -> dict:
    """Architecture fields implied by the tensor shapes of canonical params."""
    try:
        kernel = params["embedding/kernel"]
        q = params["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"]
        mlp = params["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"]
    except KeyError as e:
        what = "an incomplete ViT checkpoint" if "embedding/kernel" in params else "not a ViT checkpoint"
        some = ", ".join(repr(k) for k in sorted(params)[:4])
        raise CheckpointError(f"{what}: it has no tensor {e} (it has {len(params)} tensors"
                              + (f", e.g. {some})" if params else ")")) from e
    num_layers = len({m.group(1) for k in params
                      if (m := re.match(r"^Transformer/encoderblock_(\d+)/", k))})
    fields = dict(
        patch_size=tuple(kernel.shape[:2]), hidden_size=int(kernel.shape[-1]),
        num_heads=int(q.shape[1]), mlp_dim=int(mlp.shape[1]), num_layers=num_layers,
        classifier="token" if "cls" in params else "gap",
        representation_size=(int(params["pre_logits/kernel"].shape[1])
                             if "pre_logits/kernel" in params else None),
        num_classes=int(params["head/kernel"].shape[1]) if "head/kernel" in params else 0,
        num_channels=None,
    )
    resnet = None
    if "conv_root/kernel" in params:
        stages = []
        while any(k.startswith(f"block{len(stages) + 1}/") for k in params):
            s = len(stages) + 1
            stages.append(len({k.split("/")[1] for k in params if k.startswith(f"block{s}/")}))
        resnet = {"num_layers": tuple(stages),
                  "width_factor": params["conv_root/kernel"].shape[-1] / 64}
        fields["num_channels"] = int(params["conv_root/kernel"].shape[2])
    else:
        fields["num_channels"] = int(kernel.shape[2])
    fields["resnet"] = resnet
    posemb = params.get("Transformer/posembed_input/pos_embedding")
    if posemb is not None:
        fields["position_embedding"] = "learned"
        n = posemb.shape[1] - (1 if "cls" in params else 0)
        if grid is None:
            side = int(round(n ** 0.5))
            if side * side != n:
                raise CheckpointError(f"cannot infer the image size from {n} position embeddings")
            grid = (side, side)
    else:
        fields["position_embedding"] = "sincos2d" if naming == "big_vision" else "none"
    if grid is not None:
        stride = (4 * 2 ** max(len(resnet["num_layers"]) - 1, 0)) if resnet else 1
        fields["image_size"] = (grid[0] * kernel.shape[0] * stride, grid[1] * kernel.shape[1] * stride)
    return fields
