"""Model configurations: a dataclass that round-trips to JSON and the paper's named models.

Field names follow the official `vit_jax/configs/models.py` so that a config written
for the JAX code reads the same here (`hidden_size`, `mlp_dim`, `classifier`, ...).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import re
from typing import Any, Optional, Sequence, Tuple, Union

CLASSIFIERS = ("token", "gap")
# "relative": the paper's 1D relative attention (query-dependent); "relative_bias": a
# learned per-head bias over 2D offsets (Swin's). See layers.MultiHeadSelfAttention.
POSITION_EMBEDDINGS = ("learned", "sincos2d", "none", "relative", "relative_bias")
RELATIVE_KINDS = {"relative": "attention", "relative_bias": "bias"}


def _pair(value: Union[int, Sequence[int]], what: str) -> Tuple[int, int]:
    # numpy ints are ints here; a float or a bool is a mistake that int() would hide.
    def whole(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    try:
        pair = (value, value) if whole(value) else tuple(value)
    except TypeError:
        pair = ()
    if isinstance(value, str) or len(pair) != 2 or not all(whole(v) and v > 0 for v in pair):
        raise ValueError(f"{what} must be a positive int or a pair of them, got {value!r}")
    return tuple(int(v) for v in pair)


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """The BiT ResNet stem of a hybrid model.

    `num_layers` holds the number of bottleneck units of each stage; an empty tuple
    means the root block alone (as in R+ViT-Ti/16).
    """

    num_layers: Tuple[int, ...] = (3, 4, 9)
    width_factor: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "num_layers", tuple(int(n) for n in self.num_layers))
        if any(n <= 0 for n in self.num_layers):
            raise ValueError(f"resnet.num_layers must be positive, got {self.num_layers}")
        if self.width_factor <= 0:
            raise ValueError(f"resnet.width_factor must be positive, got {self.width_factor}")

    @property
    def width(self) -> int:
        return int(64 * self.width_factor)

    @property
    def out_channels(self) -> int:
        """Channels of the stem's output: the root's width, or 4x the last stage's."""
        if not self.num_layers:
            return self.width
        return 4 * self.width * 2 ** (len(self.num_layers) - 1)

    @property
    def stride(self) -> int:
        """Total downsampling: 4 in the root, 2 in every stage after the first."""
        return 4 * 2 ** max(len(self.num_layers) - 1, 0)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Everything needed to build a ViT or hybrid model.

    Images are `image_size` (height, width) with `num_channels` channels, scaled to
    [-1, 1]. The token grid is `image_size / (resnet stride * patch_size)`.
    """

    name: str = "custom"
    patch_size: Tuple[int, int] = (16, 16)
    hidden_size: int = 768
    mlp_dim: int = 3072
    num_heads: int = 12
    num_layers: int = 12
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    stochastic_depth_rate: float = 0.0
    classifier: str = "token"
    representation_size: Optional[int] = None
    resnet: Optional[ResNetConfig] = None
    position_embedding: str = "learned"
    gelu_approximate: bool = True
    layer_norm_epsilon: float = 1e-6
    image_size: Tuple[int, int] = (224, 224)
    num_classes: int = 1000
    num_channels: int = 3
    head_bias_init: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "patch_size", _pair(self.patch_size, "patch_size"))
        object.__setattr__(self, "image_size", _pair(self.image_size, "image_size"))
        if isinstance(self.resnet, dict):
            object.__setattr__(self, "resnet", ResNetConfig(**self.resnet))
        if self.classifier not in CLASSIFIERS:
            raise ValueError(f"classifier must be one of {CLASSIFIERS}, got {self.classifier!r}")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"position_embedding must be one of {POSITION_EMBEDDINGS}, "
                f"got {self.position_embedding!r}"
            )
        for field in ("hidden_size", "mlp_dim", "num_heads", "num_layers", "num_channels"):
            if int(getattr(self, field)) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0 means no head), got {self.num_classes}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        if self.position_embedding == "sincos2d" and self.hidden_size % 4:
            raise ValueError("sincos2d position embeddings need hidden_size divisible by 4")
        for rate in ("dropout_rate", "attention_dropout_rate", "stochastic_depth_rate"):
            if not 0.0 <= getattr(self, rate) < 1.0:
                raise ValueError(f"{rate} must be in [0, 1), got {getattr(self, rate)}")
        if self.representation_size is not None and self.representation_size <= 0:
            raise ValueError("representation_size must be positive or None")
        stride = self.total_stride
        if self.image_size[0] % stride[0] or self.image_size[1] % stride[1]:
            raise ValueError(
                f"image_size {self.image_size} must be a multiple of the total patch stride "
                f"{stride} (patch {self.patch_size}"
                + (f" x ResNet stride {self.resnet.stride})" if self.resnet else ")")
            )

    @property
    def total_stride(self) -> Tuple[int, int]:
        s = self.resnet.stride if self.resnet else 1
        return (self.patch_size[0] * s, self.patch_size[1] * s)

    @property
    def grid_size(self) -> Tuple[int, int]:
        """The (rows, cols) of the patch-token grid."""
        s = self.total_stride
        return (self.image_size[0] // s[0], self.image_size[1] // s[1])

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.classifier == "token" else 0

    @property
    def seq_len(self) -> int:
        gh, gw = self.grid_size
        return gh * gw + self.num_prefix_tokens

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def replace(self, **changes: Any) -> "ViTConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(
                f"unknown config field(s) {sorted(unknown)}; valid fields: "
                f"{[f.name for f in dataclasses.fields(self)]}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["patch_size"] = list(self.patch_size)
        d["image_size"] = list(self.image_size)
        if self.resnet is not None:
            d["resnet"] = {"num_layers": list(self.resnet.num_layers),
                           "width_factor": self.resnet.width_factor}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ViTConfig":
        d = dict(d)
        if d.get("resnet") is not None:
            d["resnet"] = ResNetConfig(**d["resnet"])
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ViTConfig":
        return cls.from_dict(json.loads(text))


# The paper's Table 1, plus Ti and S from DeiT/AugReg. Dropout as the official configs.
_FAMILIES = {
    "ti": dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12, dropout_rate=0.0),
    "s": dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12, dropout_rate=0.0),
    "b": dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12, dropout_rate=0.0),
    "l": dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24, dropout_rate=0.1),
    "h": dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32, dropout_rate=0.1),
}
_FAMILY_NAMES = {"ti": "Ti", "s": "S", "b": "B", "l": "L", "h": "H"}
_PATCHES = (8, 14, 16, 32)

# Hybrids: (resnet layers, patch size on top of the ResNet features, family, nominal patch).
_HYBRIDS = {
    "R50+ViT-B/16": ((3, 4, 9), 1, "b"),
    "R26+ViT-S/32": ((2, 2, 2, 2), 1, "s"),
    "R26+ViT-B/32": ((2, 2, 2, 2), 1, "b"),
    "R50+ViT-L/32": ((3, 4, 6, 3), 1, "l"),
    # The official R+Ti/16 puts 8x8 patches on the root's stride-4 features.
    "R+ViT-Ti/16": ((), 8, "ti"),
}


def _build_registry() -> dict:
    registry = {}
    for fam, arch in _FAMILIES.items():
        for patch in _PATCHES:
            name = f"ViT-{_FAMILY_NAMES[fam]}/{patch}"
            registry[name] = ViTConfig(name=name, patch_size=patch, **arch)
    for name, (layers, patch, fam) in _HYBRIDS.items():
        registry[name] = ViTConfig(
            name=name, patch_size=patch, resnet=ResNetConfig(num_layers=layers), **_FAMILIES[fam]
        )
    # The small ViT trained on Fashion-MNIST by the pipeline, the experiments and the docs:
    # 7x7 tokens of 4x4 patches at 28 px, 4 layers of width 64.
    registry["FMNIST-ViT"] = ViTConfig(name="FMNIST-ViT", patch_size=4, hidden_size=64, mlp_dim=128,
                                       num_heads=4, num_layers=4, image_size=28, num_classes=10)
    return registry


MODEL_CONFIGS = _build_registry()


def _normalise(name: str) -> str:
    # Accept the official file spelling (ViT-B_16) and stray spaces.
    return re.sub(r"[\s]", "", name).replace("_", "/").lower()


_BY_KEY = {_normalise(n): n for n in MODEL_CONFIGS}


def list_models() -> list:
    """The registered model names, in the paper's spelling."""
    return list(MODEL_CONFIGS)


def _registered(name: str) -> ViTConfig:
    key = _normalise(name)
    if key not in _BY_KEY:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODEL_CONFIGS)}")
    return MODEL_CONFIGS[_BY_KEY[key]]


def model_config(name_or_config: Union[str, "ViTConfig", dict]) -> ViTConfig:
    """The config a registered name (the paper's, case-insensitive: "ViT-B/16", "vit-b_16";
    see `list_models`), a `ViTConfig`, its dict, or a path to its JSON stands for. The one
    lookup of a model config; ValueError names an unknown model and lists the known."""
    if isinstance(name_or_config, ViTConfig):
        return name_or_config
    if isinstance(name_or_config, dict):
        return ViTConfig.from_dict(name_or_config)
    if isinstance(name_or_config, str) and name_or_config.endswith(".json"):
        from keras_vit import storage

        return ViTConfig.from_json(storage.read_text(name_or_config))
    if isinstance(name_or_config, str):
        return _registered(name_or_config)
    raise TypeError(
        f"expected a model name, a ViTConfig, its dict or a .json path, got {type(name_or_config)}")
