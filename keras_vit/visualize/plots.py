"""PNG figures of the analyses in `analysis`, drawn with matplotlib's Agg backend."""

from __future__ import annotations

import io
from typing import Optional, Sequence

import numpy as np

from keras_vit import extras


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    matplotlib = extras.require("matplotlib", "viz")
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def to_uint8(image) -> np.ndarray:
    """An image as `[H, W, 3]` uint8: uint8 as is, floats in [-1, 1] (the model's range) rescaled."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(f"image must be [H, W], [H, W, 1] or [H, W, 3], got {list(image.shape)}")
    if image.dtype != np.uint8:
        image = np.clip((image.astype("float32") + 1.0) * 127.5, 0, 255).round().astype(np.uint8)
    return np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image


def overlay(image, attention_map, alpha: float = 0.5, cmap: str = "inferno") -> np.ndarray:
    """Draws a `[gh, gw]` map over an image, `[H, W, 3]` uint8.

    The map is scaled to [0, 1] by its own min and max, resized bilinearly to the
    image, coloured with `cmap` and blended with weight `alpha`. The image is
    uint8, or float in [-1, 1] as the model sees it.
    """
    extras.require("PIL", "viz")
    from PIL import Image

    plt = pyplot()
    rgb = to_uint8(image)
    m = np.asarray(attention_map, dtype="float32")
    if m.ndim != 2:
        raise ValueError(f"attention_map must be [gh, gw], got {list(m.shape)}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    span = float(m.max() - m.min())
    m = (m - m.min()) / span if span > 0 else np.zeros_like(m)
    h, w = rgb.shape[:2]
    m = np.asarray(Image.fromarray(m).resize((w, h), Image.BILINEAR))
    heat = plt.get_cmap(cmap)(np.clip(m, 0, 1))[..., :3] * 255.0
    return np.clip((1 - alpha) * rgb + alpha * heat, 0, 255).round().astype(np.uint8)


def save_figure(fig, path: str) -> str:
    """Saves `fig` as a PNG at `path` (local or in a bucket), closes it, returns `path`."""
    from keras_vit import storage

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    pyplot().close(fig)
    return storage.write_bytes(path, buffer.getvalue())


def plot_rollout(images, maps, path: str, titles: Optional[Sequence[str]] = None) -> str:
    """Each image beside its rollout overlay, one row per image. Returns `path`."""
    plt = pyplot()
    n = len(images)
    if len(maps) != n:
        raise ValueError(f"{n} images but {len(maps)} maps")
    fig, axes = plt.subplots(n, 2, figsize=(5, 2.5 * n), squeeze=False)
    for i in range(n):
        axes[i, 0].imshow(to_uint8(images[i]))
        axes[i, 1].imshow(overlay(images[i], maps[i]))
        axes[i, 0].set_title(titles[i] if titles else "input", fontsize=8)
        axes[i, 1].set_title("attention rollout", fontsize=8)
        for ax in axes[i]:
            ax.axis("off")
    return save_figure(fig, path)


def plot_position_similarity(similarity, path: str,
                             title: str = "Position embedding similarity (cosine)") -> str:
    """The `[gh, gw, gh, gw]` similarities as a gh x gw grid of maps (Figure 7, centre)."""
    plt = pyplot()
    sim = np.asarray(similarity)
    gh, gw = sim.shape[:2]
    fig, axes = plt.subplots(gh, gw, figsize=(min(gw, 14) * 0.8, min(gh, 14) * 0.8), squeeze=False)
    for i in range(gh):
        for j in range(gw):
            axes[i, j].imshow(sim[i, j], vmin=-1, vmax=1, cmap="viridis")
            axes[i, j].set_xticks([])
            axes[i, j].set_yticks([])
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_filters(filters, path: str) -> str:
    """Principal components `[n, P, P, C]`, each scaled to its own range (Figure 7, left)."""
    plt = pyplot()
    f = np.asarray(filters, dtype="float32")
    n = len(f)
    cols = min(n, 7)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols, rows), squeeze=False)
    for k, ax in enumerate(axes.ravel()):
        ax.axis("off")
        if k < n:
            img = f[k]
            img = (img - img.min()) / max(float(img.max() - img.min()), 1e-12)
            ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray" if img.shape[-1] == 1 else None)
    fig.suptitle("Principal components of the patch-embedding filters")
    return save_figure(fig, path)


def plot_attention_distance(distance, path: str, image_extent: Optional[float] = None) -> str:
    """Mean attention distance `[layers, heads]`: one dot per head over depth (Figure 7, right)."""
    plt = pyplot()
    d = np.asarray(distance)
    layers, heads = d.shape
    fig, ax = plt.subplots(figsize=(5, 4))
    for h in range(heads):
        ax.scatter(np.arange(layers), d[:, h], s=12, label=f"head {h}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    if image_extent:
        ax.set_ylim(0, image_extent)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2)
    return save_figure(fig, path)
