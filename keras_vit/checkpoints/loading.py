"""Opening checkpoints and filling a VisionTransformer from their canonical tensors."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
from absl import logging

from keras_vit import storage
from keras_vit.checkpoints import huggingface, npz
from keras_vit.checkpoints.errors import CheckpointError
from keras_vit.checkpoints.posemb import interpolate_posembed
from keras_vit.configs import ViTConfig


@dataclasses.dataclass
class CheckpointSource:
    """A checkpoint read into the official released naming.

    `params` maps names such as `Transformer/encoderblock_0/LayerNorm_0/scale` to
    arrays in Flax layouts. `grid` is the position-embedding grid when the file
    says it (HF configs do; .npz files imply a square one).
    """

    path: str
    kind: str
    params: Dict[str, np.ndarray]
    config_fields: dict
    overrides: dict = dataclasses.field(default_factory=dict)
    grid: Optional[Tuple[int, int]] = None
    labels: Optional[List[str]] = None

    def infer_config(self) -> ViTConfig:
        fields = {k: v for k, v in self.config_fields.items() if v is not None or k in
                  ("representation_size", "resnet")}
        name = storage.basename(self.path)
        return ViTConfig(name=os.path.splitext(name)[0], **fields, **self.overrides)

    def implied_overrides(self) -> dict:
        return dict(self.overrides)

    def num_classes(self) -> int:
        return self.config_fields["num_classes"]

    def class_names(self) -> Optional[List[str]]:
        return self.labels


def checkpoint_class_names(path: str) -> Optional[List[str]]:
    """The names a checkpoint gives its classes: a Hugging Face config's `id2label`; None for .npz."""
    return huggingface.class_names(huggingface.read_config(path)) if storage.isdir(path) else None


@contextlib.contextmanager
def _naming_the_file(path: str):
    # The readers' errors name tensors; which file they are missing from is said here.
    try:
        yield
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from e


def open_checkpoint(path: str) -> CheckpointSource:
    """Reads an official `.npz` or a Hugging Face ViT directory."""
    path = os.fspath(path)
    if not storage.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if storage.isdir(path):
        config = huggingface.read_config(path)
        tensors = huggingface.read_tensors(path)
        with _naming_the_file(path):
            fields = huggingface.infer_config_fields(config, tensors)
            params = huggingface.canonicalise(config, tensors)
        return CheckpointSource(path, "huggingface", params, fields, huggingface.implied_overrides(config),
                                huggingface.grid_size(config), huggingface.class_names(config))
    if path.endswith(".npz"):
        arrays = npz.read_npz(path)
        with _naming_the_file(path):
            params, naming = npz.canonicalise(arrays)
            fields = npz.infer_config_fields(params, naming)
        return CheckpointSource(path, f"npz ({naming} naming)", params, fields)
    raise CheckpointError(
        f"{path}: unknown checkpoint format; expected an official .npz or a Hugging Face directory "
        "(for a Keras .keras file use keras.saving.load_model)")


def _model_tensors(model) -> List[Tuple[str, object, object]]:
    """(canonical name, variable, converter from the canonical layout) for every model weight.

    A converter takes the params dict and returns the value for the variable.
    """
    c = model.config
    out = []

    def direct(name, var):
        out.append((name, var, lambda p, n=name: p[n]))

    def norm(prefix, layer):
        direct(f"{prefix}/scale", layer.gamma)
        direct(f"{prefix}/bias", layer.beta)

    if model.resnet is not None:
        stem = model.resnet
        direct("conv_root/kernel", stem.conv_root.kernel)
        norm("gn_root", stem.gn_root)
        for s, stage in enumerate(stem.stages, 1):
            for u, unit in enumerate(stage, 1):
                pre = f"block{s}/unit{u}"
                for conv in ("conv1", "conv2", "conv3", "conv_proj"):
                    if getattr(unit, conv) is not None:
                        direct(f"{pre}/{conv}/kernel", getattr(unit, conv).kernel)
                for gn in ("gn1", "gn2", "gn3", "gn_proj"):
                    if getattr(unit, gn) is not None:
                        norm(f"{pre}/{gn}", getattr(unit, gn))
    direct("embedding/kernel", model.patch_embed.kernel)
    direct("embedding/bias", model.patch_embed.bias)
    if model.class_token is not None:
        direct("cls", model.class_token.cls)
    for i, block in enumerate(model.blocks):
        pre = f"Transformer/encoderblock_{i}"
        norm(f"{pre}/LayerNorm_0", block.norm1)
        norm(f"{pre}/LayerNorm_2", block.norm2)
        attn, a = block.attention, f"{pre}/MultiHeadDotProductAttention_1"
        names = [f"{a}/{t}/kernel" for t in ("query", "key", "value")]
        bnames = [f"{a}/{t}/bias" for t in ("query", "key", "value")]
        d, h, dh = c.hidden_size, c.num_heads, c.head_dim
        out.append((names, attn.qkv_kernel,
                    lambda p, n=names: np.concatenate(
                        [_shaped(p, k, (d, h, dh)).reshape(d, -1) for k in n], 1)))
        out.append((bnames, attn.qkv_bias,
                    lambda p, n=bnames: np.concatenate([_shaped(p, k, (h, dh)).reshape(-1) for k in n])))
        out.append((f"{a}/out/kernel", attn.out_kernel,
                    lambda p, n=f"{a}/out/kernel": _shaped(p, n, (h, dh, d)).reshape(-1, d)))
        direct(f"{a}/out/bias", attn.out_bias)
        # Not in any official checkpoint: our own names, so that save_npz keeps them.
        if attn.relative_grid is not None:
            table = "relative_bias" if attn.relative_kind == "bias" else "relative_key"
            direct(f"{a}/{table}", getattr(attn, table))
        for dense, layer in (("Dense_0", block.mlp.fc1), ("Dense_1", block.mlp.fc2)):
            direct(f"{pre}/MlpBlock_3/{dense}/kernel", layer.kernel)
            direct(f"{pre}/MlpBlock_3/{dense}/bias", layer.bias)
    norm("Transformer/encoder_norm", model.encoder_norm)
    if model.pre_logits is not None:
        direct("pre_logits/kernel", model.pre_logits.kernel)
        direct("pre_logits/bias", model.pre_logits.bias)
    return out


def _shaped(params, name, shape):
    """params[name], which the fused layout reshapes, so its own shape must be checked first."""
    value = params[name]
    if tuple(value.shape) != tuple(shape):
        raise CheckpointError(f"tensor {name!r} has shape {tuple(value.shape)}, model expects {tuple(shape)}")
    return value


def load_into(model, source: CheckpointSource) -> List[str]:
    """Fills `model` from `source`, all or nothing; returns what it changed on the way.

    Position embeddings at another grid are interpolated, a head of another size
    is re-initialised to zeros, and a representation layer the model lacks is
    dropped; each is logged. Anything else that does not fit raises CheckpointError
    naming the tensor, before any weight is written.
    """
    c = model.config
    params = dict(source.params)
    notes: List[str] = []
    assignments = []
    used = set()

    def fail(msg):
        raise CheckpointError(f"{source.path}: {msg}")

    for names, var, convert in _model_tensors(model):
        for n in [names] if isinstance(names, str) else names:
            if n not in params:
                fail(f"missing tensor {n!r} (model {c.name} expects it)")
            used.add(n)
        try:
            value = np.asarray(convert(params))
        except CheckpointError as e:
            fail(str(e))
        if tuple(value.shape) != tuple(var.shape):
            label = names if isinstance(names, str) else names[0]
            fail(f"tensor {label!r} has shape {tuple(value.shape)}, model expects {tuple(var.shape)}")
        assignments.append((var, value))

    posemb_name = "Transformer/posembed_input/pos_embedding"
    if c.position_embedding == "learned":
        if posemb_name not in params:
            fail(f"missing tensor {posemb_name!r}: the model uses learned position embeddings")
        posemb = params[posemb_name]
        used.add(posemb_name)
        target = tuple(model.position_embedding.embedding.shape)
        if posemb.shape != target:
            if posemb.shape[-1] != target[-1]:
                fail(f"tensor {posemb_name!r} has width {posemb.shape[-1]}, model expects {target[-1]}")
            try:
                posemb = interpolate_posembed(posemb, c.grid_size, c.num_prefix_tokens, source.grid)
            except ValueError as e:
                fail(f"cannot resize {posemb_name!r}: {e}")
            old = posemb_grid_text(params[posemb_name].shape[1] - c.num_prefix_tokens, source.grid)
            notes.append(f"position embeddings resized from a {old} grid to "
                         f"{c.grid_size[0]}x{c.grid_size[1]} for {c.image_size[0]}x{c.image_size[1]} images")
        assignments.append((model.position_embedding.embedding, posemb))
    elif posemb_name in params:
        fail(f"checkpoint has learned position embeddings but the model uses {c.position_embedding!r}")

    if model.pre_logits is None and "pre_logits/kernel" in params:
        used.update({"pre_logits/kernel", "pre_logits/bias"})
        notes.append("representation layer (pre_logits) dropped: the model has representation_size=None")

    head_kernel = params.get("head/kernel")
    if head_kernel is not None:
        used.update({"head/kernel", "head/bias"})
    if model.head is not None:
        if head_kernel is not None and tuple(head_kernel.shape) == tuple(model.head.kernel.shape):
            assignments.append((model.head.kernel, head_kernel))
            assignments.append((model.head.bias, params["head/bias"]))
        else:
            got = "no head" if head_kernel is None else f"a {head_kernel.shape[-1]}-class head"
            notes.append(f"head re-initialised to zeros for {c.num_classes} classes (checkpoint has {got})")
            assignments.append((model.head.kernel, np.zeros(model.head.kernel.shape, "float32")))
            assignments.append((model.head.bias, np.full(model.head.bias.shape, c.head_bias_init, "float32")))
    elif head_kernel is not None:
        notes.append("checkpoint head dropped: the model has num_classes=0")

    unused = sorted(set(params) - used)
    if unused:
        fail(f"{len(unused)} tensor(s) fit no part of model {c.name}: {unused[:8]}"
             + (" ..." if len(unused) > 8 else ""))

    for var, value in assignments:
        var.assign(np.asarray(value, dtype="float32"))
    for note in notes:
        logging.warning("keras_vit: %s: %s", storage.basename(source.path), note)
    return notes


def save_npz(model, path: str) -> str:
    """Writes `model`'s weights as an official released `.npz` (the naming and layouts
    of `vit_jax`, which timm and big_vision read too); `path` is local or a URL
    tf.io.gfile writes. Returns `path`."""
    import io

    c = model.config
    d, h, dh = c.hidden_size, c.num_heads, c.head_dim
    params = {}
    for names, var, _ in _model_tensors(model):
        value = np.asarray(var.numpy(), "float32")
        if isinstance(names, list):  # the fused query/key/value kernel or bias
            for name, part in zip(names, np.split(value, 3, axis=-1)):
                params[name] = part.reshape((d, h, dh) if name.endswith("kernel") else (h, dh))
        elif names.endswith("/out/kernel"):
            params[names] = value.reshape(h, dh, d)
        else:
            params[names] = value
    if c.position_embedding == "learned":
        params["Transformer/posembed_input/pos_embedding"] = model.position_embedding.embedding.numpy()
    if model.head is not None:
        params["head/kernel"] = model.head.kernel.numpy()
        params["head/bias"] = model.head.bias.numpy()
    buffer = io.BytesIO()
    np.savez(buffer, **params)
    storage.write_bytes(path, buffer.getvalue())
    return path


def posemb_grid_text(n: int, grid) -> str:
    if grid is not None:
        return f"{grid[0]}x{grid[1]}"
    side = int(round(n ** 0.5))
    return f"{side}x{side}"


def inspect_checkpoint(path: str, print_fn=print) -> Dict[str, Tuple[int, ...]]:
    """Prints each tensor of a checkpoint with its shape (in the released naming); returns them."""
    source = open_checkpoint(path)
    shapes = {k: tuple(v.shape) for k, v in sorted(source.params.items())}
    width = max(len(k) for k in shapes) if shapes else 0
    print_fn(f"{source.path}: {source.kind}, {len(shapes)} tensors, "
             f"{sum(int(np.prod(s)) for s in shapes.values()):,} parameters")
    for k, s in shapes.items():
        print_fn(f"  {k:<{width}}  {s}")
    return shapes
