"""Position-embedding resizing for fine-tuning at another resolution."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np


def zoom_linear(grid: np.ndarray, new_shape: Tuple[int, int]) -> np.ndarray:
    """Corner-aligned linear resize of `[gh, gw, D]` to `[new_h, new_w, D]`.

    The same as `scipy.ndimage.zoom(grid, (new_h / gh, new_w / gw, 1), order=1)`:
    output index i samples input position i * (n_in - 1) / (n_out - 1).
    """
    out = grid.astype(np.float64)
    for axis, n_new in enumerate(new_shape):
        n_old = out.shape[axis]
        if n_new == n_old:
            continue
        if n_new == 1 or n_old == 1:
            pos = np.zeros(n_new)
        else:
            pos = np.arange(n_new) * ((n_old - 1) / (n_new - 1))
        lo = np.clip(np.floor(pos).astype(int), 0, n_old - 1)
        hi = np.minimum(lo + 1, n_old - 1)
        w = (pos - lo).reshape([-1 if a == axis else 1 for a in range(out.ndim)])
        out = np.take(out, lo, axis=axis) * (1 - w) + np.take(out, hi, axis=axis) * w
    return out


def interpolate_posembed(
    posemb: np.ndarray,
    new_grid: Tuple[int, int],
    num_prefix_tokens: int,
    old_grid: Optional[Tuple[int, int]] = None,
) -> np.ndarray:
    """Resizes learned position embeddings `[1, P + gh * gw, D]` to a new patch grid.

    The `num_prefix_tokens` leading rows (the class token) are kept as they are;
    the grid part is zoomed as the official `interpolate_posembed` does. `old_grid`
    defaults to the square grid the row count implies.

    Returns `[1, P + new_h * new_w, D]` in the input's dtype.
    """
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(f"position embeddings must be [1, T, D], got {posemb.shape}")
    prefix, grid = posemb[0, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    n = grid.shape[0]
    if old_grid is None:
        side = math.isqrt(n)
        if side * side != n:
            raise ValueError(
                f"cannot infer the grid of {n} position embeddings (not a square); "
                "pass the checkpoint's grid explicitly")
        old_grid = (side, side)
    if old_grid[0] * old_grid[1] != n:
        raise ValueError(f"grid {old_grid} does not hold {n} position embeddings")
    zoomed = zoom_linear(grid.reshape(*old_grid, -1), new_grid).reshape(-1, grid.shape[-1])
    return np.concatenate([prefix, zoomed.astype(posemb.dtype)])[None]
