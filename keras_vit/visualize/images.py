"""Images for the CLIs (visualize, predict): files, folders, globs, http(s) URLs,
scikit-image's photos or a TFDS split."""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from keras_vit import extras

_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")


def _skimage_photo(name: str) -> bytes:
    extras.require("skimage.data", "viz")
    import skimage.data
    import tensorflow as tf

    fn = getattr(skimage.data, name, None)
    if fn is None or not callable(fn):
        raise ValueError(f"skimage.data has no image {name!r} (try astronaut, chelsea, coffee, rocket)")
    image = np.asarray(fn())
    if image.ndim == 2:
        image = image[..., None]
    return tf.io.encode_png(image.astype(np.uint8)[..., :3]).numpy()


def _dataset_images(spec: str, limit: int) -> List[Tuple[str, bytes]]:
    from keras_vit import data

    name, _, split = spec.partition(":")
    source = data.open_source(name)
    out = []
    for i, ex in enumerate(source.raw(split or "test").take(limit)):
        label = source.class_names[int(ex[source.label_key])]
        out.append((f"{name}:{split or 'test'}[{i}] {label}", ex[source.image_key].numpy()))
    return out


def _files(spec: str) -> List[str]:
    from keras_vit import storage

    if storage.isdir(spec):
        found = [p for p, _ in storage.files_under(spec) if p.lower().endswith(_EXTENSIONS)]
    else:
        found = storage.glob(spec)
    if not found:
        raise FileNotFoundError(f"no images match {spec!r}")
    return found


def _url_bytes(url: str) -> bytes:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.read()
    except OSError as e:  # urllib's URLError and HTTPError are OSErrors
        raise FileNotFoundError(f"cannot read {url}: {getattr(e, 'reason', e)}") from e


def load_images(specs: List[str], image_size, channels: int, limit: Optional[int] = 16):
    """Reads and preprocesses images as the model's evaluation input.

    Each spec is a file, a folder (searched recursively), a glob, an http(s) URL,
    `skimage:<name>` (a photo bundled with scikit-image) or `dataset:<tfds
    name>:<split>` (its first images); paths may be on storage tf.io.gfile reads.
    Returns (`[N, h, w, channels]` float32 in [-1, 1], N names), N <= limit (None: all).
    """
    limit = float("inf") if limit is None else limit
    from keras_vit import preprocessing, storage

    named: List[Tuple[str, bytes]] = []
    for spec in specs:
        if spec.startswith("skimage:"):
            named.append((spec, _skimage_photo(spec[len("skimage:"):])))
        elif spec.startswith("dataset:"):
            named.extend(_dataset_images(spec[len("dataset:"):], int(min(limit - len(named), 1e9))))
        elif spec.startswith(("http://", "https://")):
            named.append((spec, _url_bytes(spec)))
        else:
            named += [(storage.basename(path), storage.read_bytes(path)) for path in _files(spec)]
        if len(named) >= limit:
            break
    named = named[:int(min(limit, len(named)))]
    if not named:
        raise ValueError("no images given")
    images = np.stack([preprocessing.decode_for_eval(data, image_size, channels, label=name).numpy()
                       for name, data in named])
    return images, [name for name, _ in named]
