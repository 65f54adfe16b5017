"""Pretrained weights by name: the registry (`list_pretrained`, `resolve`) and where a
name's file is on this machine (`local_weights`), downloading it once if need be."""

from __future__ import annotations

import os
import re
from typing import List, Optional

from keras_vit.pretrained.download import DownloadError, cache_dir, fetch, fetch_official, offline
from keras_vit.pretrained.registry import Pretrained, UnknownWeightsError, describe, list_pretrained, resolve

__all__ = ["DownloadError", "Pretrained", "UnknownWeightsError", "cache_dir", "class_names", "describe",
           "fetch", "fetch_official", "fetch_url", "hub_entry", "list_pretrained", "local_weights", "locate",
           "names_weights", "offline", "resolve"]

_HF = re.compile(r"^hf://(?P<repo>[\w.\-]+/[\w.\-]+)(?:@(?P<revision>[\w.\-/]+))?$")


def locate(name_or_config, weights, image_size=None):
    """What `create_model(name_or_config, weights=...)` builds and fills, with names
    turned into files on this machine.

    A name in `name_or_config` (timm-style, `hf://...`, an AugReg file) with no
    `weights` stands for both; `weights` may be such a name, a tag of the named model
    (`"augreg_in21k_ft_in1k"`), an http(s) URL, or a path (local or tf.io.gfile).

    Returns:
      (name_or_config for the architecture, or None to read it from the file;
       the weights' path, or None; the registry entry, or None).
    """
    from keras_vit import storage
    from keras_vit.configs import model_config

    def paper_name(text):
        try:
            model_config(text)
            return True
        except ValueError:
            return False

    if weights is None and isinstance(name_or_config, str) and not name_or_config.endswith(".json") \
            and not paper_name(name_or_config):
        entry = hub_entry(name_or_config) if name_or_config.startswith("hf://") else resolve(name_or_config)
        return None if entry.on_hub else _architecture(entry), local_weights(entry), entry
    if not isinstance(weights, str):
        return name_or_config, weights, None
    if weights.startswith(("http://", "https://")):
        return name_or_config, fetch_url(weights), None
    if weights.startswith("hf://"):
        entry = hub_entry(weights)
        return name_or_config, local_weights(entry), entry
    if storage.is_url(weights) or storage.exists(weights):
        return name_or_config, weights, None
    model = name_or_config if isinstance(name_or_config, str) and paper_name(name_or_config) else None
    try:
        entry = resolve(weights, model=model, image_size=image_size)
    except UnknownWeightsError:
        if "/" in weights or "." in weights:
            return name_or_config, weights, None  # a missing file: the loader says so
        raise
    if name_or_config is None and not entry.on_hub:
        name_or_config = _architecture(entry)
    return name_or_config, local_weights(entry), entry


def names_weights(text: str, model: Optional[str] = None) -> bool:
    """Whether `text` names pretrained weights (a registered name, `hf://...`, an AugReg
    file name, or with `model` one of its tags), without fetching anything."""
    if text.startswith("hf://"):
        return bool(_HF.match(text))
    try:
        resolve(text, model=model)
        return True
    except UnknownWeightsError:
        return False


def class_names(model: str) -> Optional[List[str]]:
    """The class names of the weights `model` names or holds: the list shipped with the
    package for a registered ImageNet-1k or ImageNet-21k checkpoint, a Hugging Face
    config's `id2label`, or None (a .keras file, an .npz outside the registry)."""
    from keras_vit import storage
    from keras_vit.checkpoints import checkpoint_class_names

    if model.startswith("hf://"):
        entry = hub_entry(model)
        return _shipped(entry.labels) if entry.labels else checkpoint_class_names(local_weights(entry))
    if not storage.is_url(model) and not storage.exists(model):
        try:
            entry = resolve(model)
        except UnknownWeightsError:
            return None
        return _shipped(entry.labels) if entry.labels else None
    return checkpoint_class_names(model)


def _shipped(labels: str) -> List[str]:
    with open(os.path.join(os.path.dirname(__file__), f"{labels}_classes.txt")) as f:  # package data
        return f.read().splitlines()


def _architecture(entry: Pretrained):
    from keras_vit.configs import model_config

    return model_config(entry.model).replace(name=entry.name, image_size=entry.image_size,
                                             representation_size=entry.representation_size)


def fetch_url(url: str, progress: bool = True) -> str:
    """The local copy of the file at an http(s) `url`, downloaded into the cache first."""
    import hashlib
    import posixpath

    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    return fetch(url, os.path.join(cache_dir(), "urls", key, posixpath.basename(url.split("?")[0])),
                 progress=progress)


def local_weights(entry: Pretrained, progress: bool = True) -> str:
    """The local file (.npz) or directory (Hugging Face) holding `entry`'s weights,
    downloaded into the cache first when it is not there. An AugReg file outside the
    registry is looked up in the bucket's `augreg/index.csv` first."""
    if entry.on_hub:
        return _hub_snapshot(entry.file)
    if entry.file.startswith("augreg/") and entry.num_classes is None \
            and not os.path.exists(os.path.join(cache_dir(), *entry.file.split("/"))):
        _check_augreg_index(entry.file[len("augreg/"):-len(".npz")])
    return fetch_official(entry.file, progress=progress)


def _check_augreg_index(stem: str) -> None:
    # index.csv names every AugReg file: `filename` the pre-trainings, `adapt_filename`
    # their fine-tunings. A name outside it gets the closest ones, not a 404.
    import csv
    import difflib

    with open(fetch_official("augreg/index.csv", progress=False), newline="") as f:  # the cache
        rows = list(csv.DictReader(f))
    names = {row.get(column) for row in rows for column in ("filename", "adapt_filename")} - {None, ""}
    if stem in names:
        return
    close = difflib.get_close_matches(stem, sorted(names), n=3, cutoff=0.6)
    raise UnknownWeightsError(f"{stem!r} is not an AugReg file (the bucket's augreg/index.csv lists "
                              f"{len(names):,}); closest: {', '.join(close) or 'none'}")


def hub_entry(address: str) -> Pretrained:
    """A registered Hub checkpoint, or any other `hf://owner/repo[@revision]` (its
    architecture read from its config.json)."""
    if not _HF.match(address):
        raise UnknownWeightsError(
            f"{address!r} is not a Hugging Face address: expected hf://owner/repo[@revision]")
    try:
        return resolve(address)
    except UnknownWeightsError:
        return Pretrained(name=address, model="", image_size=0, num_classes=None, file=address,
                          size_mib=float("nan"), pretrain="")


def _hub_snapshot(address: str) -> str:
    # huggingface_hub shares its cache with transformers and reads HF_ENDPOINT,
    # HF_TOKEN and HF_HUB_OFFLINE itself.
    import huggingface_hub

    m = _HF.match(address)
    repo, revision = m.group("repo"), m.group("revision")
    try:
        config = huggingface_hub.hf_hub_download(repo, "config.json", revision=revision)
        huggingface_hub.hf_hub_download(repo, "model.safetensors", revision=revision)
    except Exception as e:  # the hub's own errors: offline, not found, gated, ...
        raise DownloadError(f"{address}: {type(e).__name__}: {e}") from e
    return os.path.dirname(config)
