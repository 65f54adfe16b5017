"""Finding training images that copy evaluation images, as the paper de-duplicates its data.

Two stages, so the work grows with the data rather than with all pairs:

Each image becomes a band-pass grayscale thumbnail: 24x24, a difference of Gaussians
(sigma 0.7 and 2 thumbnail pixels), zero mean and unit norm. The band keeps the detail
a copy shares with its original (seams, prints, folds) and drops the silhouette that
distinct images of a class share: on real Fashion-MNIST, plain-thumbnail correlation
at 0.985 called 7.7% of the training set copies of some test image (different
trousers of the same cut), the band-pass one at 0.99 about 0.1%.

1. Candidates: random-hyperplane LSH over the thumbnails (centred on the reference
   set's mean) gives several hash tables; a training image is a candidate for every
   reference image sharing a bucket in any table. The reference side is hashed at a
   few centre crops too, so a cropped copy meets the crop of its original.
2. Verification: a candidate pair scores the best correlation between the training
   thumbnail and the reference thumbnails over those crops; pairs at or above the
   threshold are duplicates. Exact copies (same decoded pixels) are found by hash.

`find_near_duplicates` runs both stages in memory; the pipeline's Dedup component runs
the same functions as a Beam job.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

THUMB = 24
CROPS = (1.0, 0.96, 0.93, 0.9)
BAND = (0.7, 2.0)  # Gaussian sigmas of the band-pass, in thumbnail pixels
DEFAULT_THRESHOLD = 0.99


class BadImageError(ValueError):
    """An image that cannot be decoded; the message names the record."""


@dataclasses.dataclass(frozen=True)
class DedupConfig:
    threshold: float = DEFAULT_THRESHOLD
    thumb: int = THUMB
    crops: Tuple[float, ...] = CROPS
    band: Tuple[float, float] = BAND
    # 10 tables of 20 bits: recall 1.0 on 100 copies of every planted kind, and about
    # 35 candidates per image against the 10k Fashion-MNIST test set (8 x 20: 31;
    # 20 x 22: 45; 12 x 18: 78). Fewer tables shuffle less in the Beam job.
    num_tables: int = 10
    bits_per_table: int = 20
    seed: int = 0


# Decoded pixels held at once by `decode_rgb`: 64 MP is 192 MB of RGB.
BATCH_PIXELS = 64_000_000


@functools.lru_cache(maxsize=1)
def _tf_functions():
    import tensorflow as tf

    from keras_vit import preprocessing

    strings = tf.TensorSpec([None], tf.string)

    @tf.function(input_signature=[strings])
    def sizes(data):
        return tf.map_fn(lambda d: tf.stack(preprocessing.encoded_size(d)), data,
                         fn_output_signature=tf.TensorSpec([2], tf.int64))

    @tf.function(input_signature=[strings, strings])
    def decode(data, names):
        images, problems = preprocessing.try_decode_images(data, 3, names)
        return images.flat_values, images.row_lengths(), images.values.row_lengths(), problems

    return sizes, decode


def _chunks(images: Sequence[bytes]) -> List[slice]:
    # Consecutive runs whose declared pixels fit BATCH_PIXELS (a larger image alone).
    sizes, _ = _tf_functions()
    pixels = np.prod(np.maximum(sizes(list(images)).numpy(), 0), axis=1).tolist()
    out, start, total = [], 0, 0
    for i, p in enumerate(pixels):
        if i > start and total + p > BATCH_PIXELS:
            out.append(slice(start, i))
            start, total = i, 0
        total += p
    return out + [slice(start, len(pixels))]


def decode_rgb(images: Sequence[bytes], names: Sequence[str]) -> List[Tuple[Optional[np.ndarray], str]]:
    """Encoded images -> `(rgb, problem)` each: uint8 `[H, W, 3]` and "", or None and why
    not (naming the image by `names`). The serving graph's decoder
    (`keras_vit.preprocessing.try_decode_images`, with its pixel bound read from the
    header), run over runs of images that decode to at most BATCH_PIXELS together."""
    if not len(images):
        return []
    _, decode = _tf_functions()
    out = []
    for part in _chunks(images):
        flat, heights, rows, problems = (t.numpy() for t in decode(list(images[part]), list(names[part])))
        start, row = 0, 0
        for h, problem in zip(heights.tolist(), problems.tolist()):
            w = int(rows[row]) if h else 0
            out.append((None, problem.decode()) if problem
                       else (flat[start:start + h * w].reshape(h, w, 3), ""))
            start, row = start + h * w, row + h
    return out


def _one(image_bytes: bytes, name: str) -> np.ndarray:
    [(rgb, problem)] = decode_rgb([image_bytes], [name])
    if problem:
        raise BadImageError(problem)
    return rgb


def luma(rgb: np.ndarray) -> np.ndarray:
    """uint8 `[H, W, 3]` -> float32 grayscale `[H, W]` in [0, 255] (ITU-R 601 luma)."""
    return rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)


def hash_pixels(rgb: np.ndarray) -> str:
    """A hash of decoded RGB pixels and their shape: equal for exact copies however encoded."""
    return hashlib.sha256(str(rgb.shape).encode() + np.ascontiguousarray(rgb).tobytes()).hexdigest()


def decode_gray(image_bytes: bytes, name: str = "image") -> np.ndarray:
    """Encoded bytes -> float32 grayscale `[H, W]` in [0, 255]; BadImageError names `name`."""
    return luma(_one(image_bytes, name))


def pixel_hash(image_bytes: bytes, name: str = "image") -> str:
    """`hash_pixels` of the decoded image; BadImageError names `name`."""
    return hash_pixels(_one(image_bytes, name))


def _resize(gray: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(gray).resize((size, size), Image.BILINEAR, reducing_gap=None),
                      dtype=np.float32)


def _normalise(v: np.ndarray) -> np.ndarray:
    v = v - v.mean()
    norm = np.linalg.norm(v)
    return v / norm if norm > 1e-6 else np.zeros_like(v)


@functools.lru_cache(maxsize=4)
def band_operator(size: int = THUMB, band: Tuple[float, float] = BAND) -> np.ndarray:
    """The band-pass as a `[size*size, size*size]` matrix (it is linear): row i is the
    response to a unit impulse at pixel i. One matmul then filters many thumbnails."""
    from scipy.ndimage import gaussian_filter

    rows = []
    for i in range(size * size):
        impulse = np.zeros(size * size, np.float64)
        impulse[i] = 1.0
        impulse = impulse.reshape(size, size)
        rows.append((gaussian_filter(impulse, band[0], mode="nearest")
                     - gaussian_filter(impulse, band[1], mode="nearest")).reshape(-1))
    return np.stack(rows).astype(np.float32)


def thumbnails(gray: np.ndarray, crops: Sequence[float], size: int = THUMB,
               band: Tuple[float, float] = BAND) -> np.ndarray:
    """Zero-mean unit-norm band-pass thumbnails `[len(crops), size * size]` of centre
    crops of an image (a flat image gives zeros, which match nothing)."""
    h, w = gray.shape
    small = []
    for c in crops:
        ch, cw = max(int(round(h * c)), 1), max(int(round(w * c)), 1)
        top, left = (h - ch) // 2, (w - cw) // 2
        small.append(_resize(gray[top:top + ch, left:left + cw], size).reshape(-1))
    return np.stack([_normalise(t) for t in np.stack(small) @ band_operator(size, tuple(band))])


class LSH:
    """Random-hyperplane hashes of centred thumbnails, `num_tables` keys per vector."""

    def __init__(self, config: DedupConfig, centre: np.ndarray):
        rng = np.random.RandomState(config.seed)
        dim = config.thumb * config.thumb
        self.planes = rng.normal(size=(config.num_tables, config.bits_per_table, dim)).astype(np.float32)
        self.centre = centre.astype(np.float32)
        self.weights = (1 << np.arange(config.bits_per_table)).astype(np.int64)

    def keys(self, vectors: np.ndarray) -> np.ndarray:
        """`[N, D]` -> int64 `[N, tables]` bucket keys."""
        bits = np.einsum("tbd,nd->ntb", self.planes, vectors - self.centre) > 0
        return bits.astype(np.int64) @ self.weights


def reference_buckets(ref_keys: np.ndarray) -> List[Dict[int, List[int]]]:
    """Per table, bucket key -> reference indices; `ref_keys` `[M, crops, T]`."""
    tables: List[Dict[int, List[int]]] = []
    for t in range(ref_keys.shape[2]):
        buckets: Dict[int, List[int]] = defaultdict(list)
        for j, keys in enumerate(ref_keys[:, :, t].tolist()):
            for k in set(keys):
                buckets[k].append(j)
        tables.append(buckets)
    return tables


def candidates(train_keys: np.ndarray, buckets: List[Dict[int, List[int]]]) -> List[np.ndarray]:
    """For each training image (`train_keys` `[N, T]`), the sorted reference indices
    sharing a bucket with it in any table."""
    out = []
    for keys in train_keys.tolist():
        found = set()
        for t, k in enumerate(keys):
            found.update(buckets[t].get(k, ()))
        out.append(np.fromiter(sorted(found), np.int64, len(found)))
    return out


def scores(train_thumb: np.ndarray, ref_thumbs: np.ndarray) -> np.ndarray:
    """Best correlation over crops of one training thumbnail `[D]` with each of K
    references' crop thumbnails `[K, crops, D]` -> `[K]`."""
    if not len(ref_thumbs):
        return np.zeros((0,), np.float32)
    return np.max(ref_thumbs @ train_thumb, axis=1)


def find_near_duplicates(train_images: Sequence[bytes], reference_images: Sequence[bytes],
                         threshold: Optional[float] = None,
                         config: DedupConfig = DedupConfig()) -> List[Tuple[int, int, float]]:
    """Training images that copy a reference image.

    Args:
      train_images, reference_images: encoded images (PNG, JPEG, ...).
      threshold: correlation at or above which a pair is a duplicate; None means the
        tuned default (0.99).

    Returns:
      `(train_index, reference_index, score)` for every duplicate pair, sorted; exact
      pixel copies score 1.0.

    Raises:
      BadImageError naming the first image that cannot be decoded.
    """
    threshold = config.threshold if threshold is None else float(threshold)
    train = _prepare(train_images, "train", (1.0,), config)
    refs = _prepare(reference_images, "reference", config.crops, config)
    found: Dict[Tuple[int, int], float] = {}
    ref_by_hash = defaultdict(list)
    for j, h in enumerate(refs["hash"]):
        ref_by_hash[h].append(j)
    for i, h in enumerate(train["hash"]):
        for j in ref_by_hash.get(h, ()):
            found[(i, j)] = 1.0
    if len(train["thumbs"]) and len(refs["thumbs"]):
        lsh = LSH(config, refs["thumbs"][:, 0].mean(axis=0))
        m, c, d = refs["thumbs"].shape
        buckets = reference_buckets(lsh.keys(refs["thumbs"].reshape(m * c, d)).reshape(m, c, -1))
        for i, cand in enumerate(candidates(lsh.keys(train["thumbs"][:, 0]), buckets)):
            for j, s in zip(cand.tolist(), scores(train["thumbs"][i, 0], refs["thumbs"][cand]).tolist()):
                if s >= threshold and (i, j) not in found:
                    found[(i, j)] = s
    return sorted((i, j, round(s, 6)) for (i, j), s in found.items())


def _prepare(images: Sequence[bytes], kind: str, crops, config: DedupConfig) -> dict:
    thumbs, hashes = [], []
    for rgb, problem in decode_rgb(images, [f"{kind} image {i}" for i in range(len(images))]):
        if problem:
            raise BadImageError(problem)
        thumbs.append(thumbnails(luma(rgb), crops, config.thumb, config.band))
        hashes.append(hash_pixels(rgb))
    dim = config.thumb * config.thumb
    return {"thumbs": np.stack(thumbs) if thumbs else np.zeros((0, len(crops), dim), np.float32),
            "hash": hashes}
