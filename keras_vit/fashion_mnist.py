"""A TFDS builder for Fashion-MNIST read from local IDX files, so the default runs offline.

Debian's `dataset-fashion-mnist` puts the real data (60k train, 10k test) in
/usr/share/datasets/fashion-mnist; `make test` and `make run` install it.
`tfds.builder("fashion_mnist_local")` then prepares it without a download.
The `mini` config keeps the first 2,000 train and 1,000 test images for fast runs.
"""

from __future__ import annotations

import gzip
import os

import numpy as np
import tensorflow_datasets as tfds

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
CLASS_NAMES = ["t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
               "ankle boot"]
_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
          "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def read_idx(path: str) -> np.ndarray:
    """An IDX file (optionally gzipped) as a numpy array of its declared shape."""
    from keras_vit import storage

    data = storage.read_bytes(path)
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header declares {dims} but holds {body.size} bytes")
    return body.reshape(dims)


def source_dir() -> str:
    return os.environ.get("KERAS_VIT_FASHION_MNIST_DIR", DEFAULT_DIR)


def load_arrays(split: str, directory: str = None):
    """(images uint8 [N, 28, 28], labels uint8 [N]) of 'train' or 'test'."""
    directory = directory or source_dir()
    from keras_vit import storage

    images_file, labels_file = (storage.join(directory, f) for f in _FILES[split])
    for f in (images_file, labels_file):
        if not storage.exists(f):
            raise FileNotFoundError(
                f"{f} is missing: install Debian's dataset-fashion-mnist (make test does), "
                "or set KERAS_VIT_FASHION_MNIST_DIR to a folder with the four IDX files")
    images, labels = read_idx(images_file), read_idx(labels_file)
    if len(images) != len(labels):
        raise ValueError(f"{directory}: {len(images)} images but {len(labels)} labels in {split}")
    return images, labels


class FashionMnistConfig(tfds.core.BuilderConfig):
    def __init__(self, *, limits=None, **kwargs):
        super().__init__(**kwargs)
        self.limits = limits or {}


class FashionMnistLocal(tfds.core.GeneratorBasedBuilder):
    """Fashion-MNIST from the local IDX files; images 28x28x1 PNG, 10 classes."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [
        FashionMnistConfig(name="full", description="All 60,000 train and 10,000 test images."),
        FashionMnistConfig(name="mini", description="The first 2,000 train and 1,000 test images.",
                           limits={"train": 2000, "test": 1000}),
    ]

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(28, 28, 1)),
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
            }),
            supervised_keys=("image", "label"),
            homepage="https://github.com/zalandoresearch/fashion-mnist",
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {split: self._generate_examples(split) for split in _FILES}

    def _generate_examples(self, split):
        images, labels = load_arrays(split)
        limit = self.builder_config.limits.get(split, len(images))
        for i in range(min(limit, len(images))):
            yield i, {"image": images[i][..., None], "label": int(labels[i])}
