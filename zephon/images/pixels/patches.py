"""Patches: a resized image as the rows a vision encoder takes, and back.

An image of H x W pixels (both multiples of `patch_size * merge`) is a grid
of (H / p) x (W / p) patches of p x p pixels. The patch array is
`[num_patches, 3 * p * p]` uint8 in this order:

- merge windows (m x m patches each) in row-major order over the
  (H / (p m)) x (W / (p m)) window grid;
- inside a window, its m x m patches in row-major order;
- inside a patch, channel-major: the p x p red values row by row, then
  green, then blue (the layout of a convolution weight [out, 3, p, p]).

So each window's m*m patches are contiguous rows, and the encoder's merge
step (m*m patches -> one placeholder token) is a reshape. Patch k sits at
grid row `(k // m²) // (w_patches / m) * m + (k % m²) // m` and column
`(k // m²) % (w_patches / m) * m + k % m` (see `patch_positions`).
"""

from __future__ import annotations

import numpy as np


def _check(grid: tuple[int, int], merge: int) -> tuple[int, int]:
    gh, gw = grid
    if gh < 1 or gw < 1 or gh % merge or gw % merge:
        raise ValueError(f"grid {grid} must be positive multiples of merge = {merge}")
    return gh // merge, gw // merge


def to_patches(
    pixels: np.ndarray, patch_size: int, merge: int, out: np.ndarray | None = None
) -> tuple[np.ndarray, tuple[int, int]]:
    """(patches [num_patches, 3 * p * p] uint8, grid (h_patches, w_patches)) of an
    RGB uint8 array [H, W, 3]. `out`: a contiguous uint8 buffer of exactly the
    patches' bytes to write them into (the memory a batch hands the model)
    instead of a new array; the patches returned are then a view of it."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(
            f"expected an RGB uint8 array [H, W, 3], got {pixels.dtype} {pixels.shape}"
        )
    p, m = patch_size, merge
    height, width, _ = pixels.shape
    if height % (p * m) or width % (p * m):
        raise ValueError(f"image {width} x {height} is not a whole number of {p * m}-pixel windows")
    grid = (height // p, width // p)
    wh, ww = _check(grid, m)
    # axes: window row, patch row in window, pixel row, window col, patch col, pixel col, channel
    x = pixels.reshape(wh, m, p, ww, m, p, 3)
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)  # window row, window col, patch row, patch col, c, y, x
    shape = (grid[0] * grid[1], 3 * p * p)
    if out is None:
        return np.ascontiguousarray(x).reshape(shape), grid
    if out.dtype != np.uint8 or out.size != shape[0] * shape[1] or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a contiguous uint8 buffer of {shape[0] * shape[1]} bytes "
            f"(patches {shape}), got {out.dtype} {out.shape}"
        )
    patches = out.reshape(shape)
    np.copyto(patches.reshape(x.shape), x)  # one pass, straight into place
    return patches, grid


def from_patches(
    patches: np.ndarray, grid: tuple[int, int], patch_size: int, merge: int
) -> np.ndarray:
    """The RGB uint8 array [H, W, 3] that `to_patches` turned into `patches`."""
    p, m = patch_size, merge
    wh, ww = _check(grid, m)
    if patches.shape != (grid[0] * grid[1], 3 * p * p):
        raise ValueError(f"patches {patches.shape} do not fit grid {grid} with patch_size {p}")
    x = patches.reshape(wh, ww, m, m, 3, p, p).transpose(0, 2, 5, 1, 3, 6, 4)
    return np.ascontiguousarray(x).reshape(grid[0] * p, grid[1] * p, 3)


def patch_positions(grid: tuple[int, int], merge: int) -> np.ndarray:
    """[num_patches, 2] int64: the (row, column) in the patch grid of every patch row."""
    wh, ww = _check(grid, merge)
    rows = np.arange(grid[0]).reshape(wh, merge, 1, 1).repeat(ww, 2).repeat(merge, 3)
    cols = np.arange(grid[1]).reshape(1, 1, ww, merge).repeat(wh, 0).repeat(merge, 1)
    # (window row, patch row, window col, patch col) -> (window row, window col, patch row, col)
    order = (0, 2, 1, 3)
    return np.stack(
        [rows.transpose(order).reshape(-1), cols.transpose(order).reshape(-1)], axis=1
    ).astype(np.int64)


def placeholder_count(grid: tuple[int, int], merge: int) -> int:
    """Placeholder tokens of an image: one per merge window, num_patches / merge²."""
    wh, ww = _check(grid, merge)
    return wh * ww
