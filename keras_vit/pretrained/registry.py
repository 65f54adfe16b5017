"""The named pretrained checkpoints: `registry.json`, read once.

Names follow timm (`vit_base_patch16_224.augreg_in21k_ft_in1k`: architecture,
resolution, then a tag for the training data), so a timm user finds each model under
the name they know; Hugging Face repositories are named by address
(`hf://google/vit-base-patch16-224`). Each entry says which model it fills, at what
resolution and with how many classes, where the file is (a path under the official
bucket, or a Hub repository), its size, and ImageNet top-1 where the official
README's table gives one.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import functools
import json
import os
import re
from typing import List, Optional

# The official release's AugReg files: `<pre-training>--<fine-tuning>-res_<px>` or the
# pre-training alone. Any of them is a name (see `resolve`).
_AUGREG_FILE = re.compile(
    r"^(?:augreg/)?(?P<model>R50_L_32|R26_S_32|R_Ti_16|Ti_16|S_16|S_32|B_16|B_32|B_8|L_16)"
    r"-i(?:21|1)k-[\w.\-]+?(?:-res_(?P<res>\d+))?(?:\.npz)?$")
_AUGREG_MODELS = {"R50_L_32": "R50+ViT-L/32", "R26_S_32": "R26+ViT-S/32", "R_Ti_16": "R+ViT-Ti/16",
                  "Ti_16": "ViT-Ti/16", "S_16": "ViT-S/16", "S_32": "ViT-S/32", "B_16": "ViT-B/16",
                  "B_32": "ViT-B/32", "B_8": "ViT-B/8", "L_16": "ViT-L/16"}


class UnknownWeightsError(ValueError):
    """A weights name that is neither registered nor an official file name."""


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """One named checkpoint.

    Attributes:
      name: the timm-style name, or `hf://owner/repo`.
      model: the paper name of the architecture it fills (`"ViT-B/16"`).
      image_size: the resolution it was trained or fine-tuned at (square).
      num_classes: its head's size (0: no head; None: read from the file).
      file: the path under the official bucket (`augreg/....npz`) or `hf://owner/repo`.
      size_mib: the file's size.
      pretrain, finetune: the data sets (finetune None for a pre-trained checkpoint).
      top1: ImageNet top-1 in percent, where the official README gives it.
      inputs: the pixel range the checkpoint expects.
      labels: the class names' list shipped with the package, if any: `"imagenet1k"`
        (ImageNet-2012's 1000 classes in their usual order) or `"imagenet21k"` (the
        21843 classes of the official ImageNet-21k checkpoints, in Google's order), one
        WordNet lemma per class.
      representation_size: the width of its pre-logits layer, if it has one.
    """

    name: str
    model: str
    image_size: int
    num_classes: Optional[int]
    file: str
    size_mib: float
    pretrain: str
    finetune: Optional[str] = None
    top1: Optional[float] = None
    inputs: str = "[-1, 1]"
    labels: Optional[str] = None
    representation_size: Optional[int] = None

    def __post_init__(self):
        # Every model here takes [-1, 1] (`keras_vit.preprocessing.to_model_range`); an
        # entry with another convention would need its own preprocessing first.
        if self.inputs != "[-1, 1]":
            raise ValueError(f"{self.name}: inputs {self.inputs!r}; keras_vit models take [-1, 1]")

    @property
    def on_hub(self) -> bool:
        return self.file.startswith("hf://")

    @property
    def tag(self) -> str:
        return self.name.split(".", 1)[1] if "." in self.name and not self.on_hub else ""


@functools.lru_cache(maxsize=1)
def _registry() -> dict:
    path = os.path.join(os.path.dirname(__file__), "registry.json")
    with open(path) as f:  # package data, never a user path
        entries = [Pretrained(**e) for e in json.load(f)]
    return {e.name: e for e in entries}


def list_pretrained(pattern: Optional[str] = None) -> List[Pretrained]:
    """The registered checkpoints whose name matches `pattern` (fnmatch, case-insensitive;
    e.g. `"vit_base*"` or `"*in21k"`), all of them by default."""
    entries = list(_registry().values())
    if pattern is None:
        return entries
    return [e for e in entries if fnmatch.fnmatch(e.name.lower(), pattern.lower())]


def _paper_key(name: str) -> str:
    return re.sub(r"\s", "", name).replace("_", "/").lower()


def _closest(name: str) -> str:
    names = list(_registry())
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    if not close:
        stem = name.split(".")[0]
        close = [n for n in names if n.startswith(stem)][:5]
    return ", ".join(close) if close else "see keras_vit.list_pretrained()"


def resolve(name: str, model: Optional[str] = None, image_size=None) -> Pretrained:
    """The checkpoint `name` stands for.

    Args:
      name: a registered name (`vit_base_patch16_224.augreg_in21k_ft_in1k`,
        `hf://google/vit-base-patch16-224`), any official AugReg file name (with or
        without `augreg/` and `.npz`), or, with `model`, a tag (`augreg_in21k_ft_in1k`).
      model: a paper name (`"ViT-B/16"`) when `name` is a tag.
      image_size: with a tag, picks the checkpoint at this resolution when there is
        one (default: the smallest).

    Raises:
      UnknownWeightsError: nothing matches; the message lists the closest names.
    """
    registry = _registry()
    if name in registry:
        return registry[name]
    if model is not None:
        found = [e for e in registry.values() if e.tag == name and _paper_key(e.model) == _paper_key(model)]
        if found:
            size = image_size if isinstance(image_size, int) or image_size is None else image_size[0]
            at_size = [e for e in found if e.image_size == size]
            return (at_size or sorted(found, key=lambda e: e.image_size))[0]
        tags = sorted({e.tag for e in registry.values()
                       if _paper_key(e.model) == _paper_key(model) and e.tag})
        raise UnknownWeightsError(
            f"no {name!r} weights for {model}; its tags: {', '.join(tags) or 'none'}")
    m = _AUGREG_FILE.match(name)
    if m:
        stem = name[len("augreg/"):] if name.startswith("augreg/") else name
        stem = stem[:-len(".npz")] if stem.endswith(".npz") else stem
        known = [e for e in registry.values() if e.file == f"augreg/{stem}.npz"]
        if known:
            return known[0]
        finetuned = "--" in stem
        return Pretrained(
            name=stem, model=_AUGREG_MODELS[m.group("model")], image_size=int(m.group("res") or 224),
            num_classes=None, file=f"augreg/{stem}.npz", size_mib=float("nan"),
            pretrain="ImageNet-21k" if "-i21k-" in stem else "ImageNet-1k",
            finetune=stem.split("--")[1].split("-")[0] if finetuned else None)
    raise UnknownWeightsError(f"unknown pretrained weights {name!r}; closest: {_closest(name)}")


def describe(entries: List[Pretrained]) -> str:
    """A table of `entries`: name, model and resolution, data, classes, size, top-1."""
    rows = [("name", "model", "px", "pre-trained on", "fine-tuned on", "classes", "MiB", "top-1")]
    for e in entries:
        rows.append((e.name, e.model, str(e.image_size), e.pretrain, e.finetune or "-",
                     "-" if e.num_classes is None else str(e.num_classes),
                     f"{e.size_mib:,.0f}", "-" if e.top1 is None else f"{e.top1:.2f}%"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {2, 5, 6, 7}
    return "\n".join("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in
                               enumerate(zip(r, widths))).rstrip() for r in rows)
