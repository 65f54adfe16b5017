"""Images for the visualisation CLI: files, folders, scikit-image's photos or a TFDS split."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np

_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")


def _skimage_photo(name: str) -> bytes:
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


def load_images(specs: List[str], image_size, channels: int, limit: int = 16):
    """Reads and preprocesses images as the model's evaluation input.

    Each spec is a file, a folder (searched recursively), a glob, `skimage:<name>`
    (a photo bundled with scikit-image) or `dataset:<tfds name>:<split>` (its first
    images). Returns (`[N, h, w, channels]` float32 in [-1, 1], N names), N <= limit.
    """
    from keras_vit import preprocessing, storage

    named: List[Tuple[str, bytes]] = []
    for spec in specs:
        if spec.startswith("skimage:"):
            named.append((spec, _skimage_photo(spec[len("skimage:"):])))
        elif spec.startswith("dataset:"):
            named.extend(_dataset_images(spec[len("dataset:"):], limit - len(named)))
        else:
            named += [(storage.basename(path), storage.read_bytes(path)) for path in _files(spec)]
        if len(named) >= limit:
            break
    named = named[:limit]
    if not named:
        raise ValueError("no images given")
    images = np.stack([preprocessing.decode_for_eval(data, image_size, channels, label=name).numpy()
                       for name, data in named])
    return images, [name for name, _ in named]
