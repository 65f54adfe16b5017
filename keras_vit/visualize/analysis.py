"""The paper's analyses as numbers: attention rollout, position-embedding similarity,
patch-embedding filters and mean attention distance.

Each model-level function has an array-level twin (`rollout`, `attention_distance`)
that takes attention weights directly, so the maths can be checked on hand-made
attention and reused on weights from elsewhere.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import tensorflow as tf


def _config(model):
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "grid_size"):
        raise TypeError(f"expected a keras_vit VisionTransformer, got {type(model).__name__}")
    return cfg


def _check_images(cfg, images) -> np.ndarray:
    images = np.asarray(images, dtype="float32")
    expected = (*cfg.image_size, cfg.num_channels)
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
        raise ValueError(f"images must be [N, {expected[0]}, {expected[1]}, {expected[2]}] for "
                         f"{cfg.name}, got {list(images.shape)}")
    return images


def _batches(model, images, batch_size):
    """Yields each batch's per-block attention, so only one batch of maps is held at a time."""
    cfg = _config(model)
    images = _check_images(cfg, images)
    # Traced once (again for a shorter last batch): op by op would take about twice as long.
    attention = tf.function(lambda x: model.forward(x, training=False, return_attention=True)["attention"])
    for start in range(0, len(images), batch_size):
        yield [np.asarray(w, dtype="float32") for w in attention(images[start:start + batch_size])]


def attention_weights(model, images, batch_size: int = 16) -> List[np.ndarray]:
    """Every block's attention for `images` `[N, H, W, C]` in [-1, 1].

    Returns one float32 `[N, heads, T, T]` array per block, in block order; rows are
    queries and sum to 1. T counts the class token first when there is one.
    """
    chunks = list(_batches(model, images, batch_size))
    return [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]


def rollout(attention: Sequence[np.ndarray]) -> np.ndarray:
    """Attention rollout (Abnar and Zuidema, 2020) of per-block `[N, heads, T, T]` weights.

    Each block's heads are averaged, the identity is added for the residual path
    and each row is renormalised to sum to 1; the blocks are then multiplied from
    the first to the last. Rows are normalised, not the whole matrix (some
    published code does the latter), so the result stays row-stochastic.

    Returns `[N, T, T]`: row q says how much each input token contributes to output token q.
    """
    if not len(attention):
        raise ValueError("rollout needs the attention of at least one block")
    result = None
    for weights in attention:
        weights = np.asarray(weights, dtype="float64")
        if weights.ndim != 4 or weights.shape[-1] != weights.shape[-2]:
            raise ValueError(f"attention must be [N, heads, T, T], got {list(weights.shape)}")
        a = weights.mean(axis=1) + np.eye(weights.shape[-1])
        a /= a.sum(axis=-1, keepdims=True)
        result = a if result is None else a @ result
    return result.astype("float32")


def rollout_maps(attention: Sequence[np.ndarray], grid_size: Tuple[int, int],
                 num_prefix_tokens: int) -> np.ndarray:
    """The rollout read as a map over the patch grid, `[N, gh, gw]`.

    With a class token the map is the class token's row; without one (`gap`
    models) it is the mean of all rows, the contribution of each patch to the
    pooled feature. Prefix columns are dropped.
    """
    r = rollout(attention)
    gh, gw = grid_size
    if r.shape[-1] != gh * gw + num_prefix_tokens:
        raise ValueError(f"{r.shape[-1]} tokens do not fit a {gh}x{gw} grid "
                         f"with {num_prefix_tokens} prefix tokens")
    rows = r[:, 0] if num_prefix_tokens else r.mean(axis=1)
    return rows[:, num_prefix_tokens:].reshape(-1, gh, gw)


def attention_rollout(model, images, batch_size: int = 16) -> np.ndarray:
    """Attention rollout maps of `images` `[N, H, W, C]` in [-1, 1]: `[N, gh, gw]`.

    Read from the class token, or from the mean over tokens for `gap` models.
    `overlay(image, map)` draws one on its image.
    """
    cfg = _config(model)
    return np.concatenate([rollout_maps(a, cfg.grid_size, cfg.num_prefix_tokens)
                           for a in _batches(model, images, batch_size)])


def position_embeddings(model) -> np.ndarray:
    """The patch tokens' absolute position embeddings, `[gh, gw, D]` (prefix tokens dropped)."""
    cfg = _config(model)
    table = model.position_embedding.table()
    if table is None:
        raise ValueError(f"{cfg.name} has position_embedding={cfg.position_embedding!r}, which adds no "
                         "embedding to compare; use a 'learned' or 'sincos2d' model")
    gh, gw = cfg.grid_size
    return table[cfg.num_prefix_tokens:].reshape(gh, gw, -1)


def position_embedding_similarity(model) -> np.ndarray:
    """Cosine similarity of each patch's position embedding with every other's (Figure 7, centre).

    Returns `[gh, gw, gh, gw]`: `[i, j]` is the map of patch (i, j) against the whole grid.
    """
    emb = position_embeddings(model).astype("float64")
    gh, gw, d = emb.shape
    flat = emb.reshape(gh * gw, d)
    norms = np.linalg.norm(flat, axis=1, keepdims=True)
    flat = flat / np.maximum(norms, 1e-12)
    return (flat @ flat.T).reshape(gh, gw, gh, gw).astype("float32")


def embedding_filters(model, n: int = 28) -> np.ndarray:
    """The leading principal components of the patch-embedding filters (Figure 7, left).

    Each of the D output filters of the patch embedding is one `P x P x C` vector;
    after removing their mean, the right singular vectors of the `[D, P*P*C]` matrix
    are the components, in order of explained variance. They are orthonormal.

    Returns `[n, P, P, C]`.
    """
    cfg = _config(model)
    if cfg.resnet is not None:
        raise ValueError(f"{cfg.name} is a hybrid: its patch embedding sees ResNet features, not pixels, "
                         "so its filters are not images")
    kernel = np.asarray(model.patch_embed.kernel, dtype="float64")  # [ph, pw, C, D]
    ph, pw, c, d = kernel.shape
    filters = kernel.reshape(ph * pw * c, d).T
    limit = min(d - 1, ph * pw * c)  # centring costs one rank
    if not 1 <= n <= limit:
        raise ValueError(f"n must be in [1, {limit}] for {d} filters of {ph}x{pw}x{c}, got {n}")
    filters = filters - filters.mean(axis=0, keepdims=True)
    _, _, vt = np.linalg.svd(filters, full_matrices=False)
    return vt[:n].reshape(n, ph, pw, c).astype("float32")


def patch_distances(grid_size: Tuple[int, int], patch_pixels: Tuple[int, int]) -> np.ndarray:
    """Pixel distance between the centres of every pair of patches, `[gh*gw, gh*gw]`."""
    gh, gw = grid_size
    y, x = np.mgrid[:gh, :gw]
    centres = np.stack([y.ravel() * patch_pixels[0], x.ravel() * patch_pixels[1]], axis=1).astype("float64")
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def attention_distance(attention: Sequence[np.ndarray], grid_size: Tuple[int, int],
                       patch_pixels: Tuple[int, int], num_prefix_tokens: int = 0) -> np.ndarray:
    """Attention-weighted mean pixel distance between queries and keys, `[layers, heads]`.

    Only patch-to-patch attention counts: prefix-token rows and columns are dropped
    and each query's weights over the patches are renormalised, so the figure is
    the distance over which a head gathers information from the image. Averaged
    over queries and images.
    """
    dist = patch_distances(grid_size, patch_pixels)
    n = dist.shape[0]
    out = []
    for weights in attention:
        w = np.asarray(weights, dtype="float64")
        if w.ndim != 4 or w.shape[-1] != n + num_prefix_tokens:
            t = n + num_prefix_tokens
            raise ValueError(f"attention must be [N, heads, {t}, {t}], got {list(w.shape)}")
        w = w[..., num_prefix_tokens:, num_prefix_tokens:]
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-12)
        out.append((w * dist).sum(axis=-1).mean(axis=(0, 2)))  # [heads]
    return np.stack(out).astype("float32")


def mean_attention_distance(model, images, batch_size: int = 16) -> np.ndarray:
    """Mean attention distance in pixels of `images` `[N, H, W, C]` (Figure 7 right, Figure 11).

    Returns `[layers, heads]`. Pixels are those of the model's input, so a hybrid's
    patches are `resnet stride x patch size` pixels apart.
    """
    cfg = _config(model)
    per_batch, sizes = [], []
    for attention in _batches(model, images, batch_size):
        per_batch.append(attention_distance(attention, cfg.grid_size, cfg.total_stride,
                                            cfg.num_prefix_tokens))
        sizes.append(len(attention[0]))
    # Batches hold different numbers of images: weight each batch's mean by its size.
    return np.average(np.stack(per_batch), axis=0, weights=sizes).astype("float32")
