"""Multiply-accumulate counts of a forward pass, from the config alone.

The convention is fvcore's, which produced the figures quoted for ViTs (ViT-B/16:
17.58 GMACs at 224): each conv and dense layer counts output elements x fan-in,
the attention matmuls (QK^T and AV) count T x T x D each, and LayerNorm/GroupNorm
count 5 per element (4 without an affine part). Activations, softmax, residual
adds, pooling and the position-embedding add count nothing.

That convention counts the architecture: every token through every block. Our
model computes less for its logits (`executed=True`): with a class-token head, the
last block carries the class token alone past its keys and values.
"""

from __future__ import annotations

from typing import Dict, Union

from keras_vit.configs import ResNetConfig, ViTConfig

_NORM = 5  # fvcore: mean, variance, normalise, scale, shift


def resnet_macs(resnet: ResNetConfig, image_size, num_channels: int = 3) -> Dict[str, int]:
    """MACs of the BiT ResNet stem alone at `image_size` (int or (h, w)): conv and norm parts."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    width = resnet.width
    macs = {"resnet_conv": 0, "resnet_norm": 0}
    h, w = -(-h // 2), -(-w // 2)
    macs["resnet_conv"] += h * w * 7 * 7 * num_channels * width
    macs["resnet_norm"] += _NORM * h * w * width
    h, w = -(-h // 2), -(-w // 2)  # max-pool
    cin = width
    for i, units in enumerate(resnet.num_layers):
        f = width * 2 ** i
        for u in range(units):
            stride = 2 if (i > 0 and u == 0) else 1
            oh, ow = -(-h // stride), -(-w // stride)
            macs["resnet_conv"] += h * w * cin * f + oh * ow * 9 * f * f + oh * ow * f * 4 * f
            macs["resnet_norm"] += _NORM * (h * w * f + oh * ow * f + oh * ow * 4 * f)
            if cin != 4 * f or stride != 1:
                macs["resnet_conv"] += oh * ow * cin * 4 * f
                macs["resnet_norm"] += _NORM * oh * ow * 4 * f
            h, w, cin = oh, ow, 4 * f
    return macs


def forward_macs(model_or_config: Union[ViTConfig, "object"], breakdown: bool = False,
                 executed: bool = False):
    """MACs of one image's forward pass at the config's image size.

    Args:
      model_or_config: a `VisionTransformer`, a `ViTConfig`, or a registered name.
      breakdown: return a dict of parts (`patch_embedding`, `attention_projections`,
        `attention_matmuls`, `mlp`, `norms`, `head`, ...) instead of the total.
      executed: count what `VisionTransformer` computes for its logits, not the
        architecture's published figure (fvcore's). They differ for a class-token
        head, whose last block runs the query, attention, out projection, second
        LayerNorm and MLP (and the final LayerNorm) for the class token alone.

    Returns:
      An int, or a dict of ints when `breakdown` is set.
    """
    if isinstance(model_or_config, str):
        from keras_vit.configs import model_config
        cfg = model_config(model_or_config)
    else:
        cfg = getattr(model_or_config, "config", model_or_config)
    if not isinstance(cfg, ViTConfig):
        raise TypeError(f"expected a VisionTransformer, ViTConfig or model name, got {type(model_or_config)}")
    d, m, L = cfg.hidden_size, cfg.mlp_dim, cfg.num_layers
    gh, gw = cfg.grid_size
    n, t = gh * gw, cfg.seq_len
    ph, pw = cfg.patch_size
    parts: Dict[str, int] = {}
    if cfg.resnet is not None:
        parts.update(resnet_macs(cfg.resnet, cfg.image_size, cfg.num_channels))
        cin = cfg.resnet.out_channels
    else:
        cin = cfg.num_channels
    parts["patch_embedding"] = n * ph * pw * cin * d
    # Tokens through each block's query, out projection, second norm and MLP, and
    # through the final norm; every block's keys, values and first norm see all t.
    queries = [t] * L
    if executed and cfg.classifier == "token" and L:
        queries[-1] = 1
    final = queries[-1] if L else t
    parts["attention_projections"] = sum(2 * t * d * d + 2 * q * d * d for q in queries)
    parts["attention_matmuls"] = sum(2 * q * t * d for q in queries)
    parts["mlp"] = sum(2 * q * d * m for q in queries)
    parts["norms"] = _NORM * d * (sum(t + q for q in queries) + final)
    rep = cfg.representation_size
    parts["pre_logits"] = d * rep if rep else 0
    parts["head"] = (rep or d) * cfg.num_classes
    return parts if breakdown else sum(parts.values())
