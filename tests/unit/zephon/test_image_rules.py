"""Image sizes and patches, exactly (zephon/images/pixels/resize.py, patches.py): the
patch layout against the documented order computed pixel by pixel, and the
size arithmetic's edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.images.pixels.patches import (
    from_patches,
    patch_positions,
    placeholder_count,
    to_patches,
)
from zephon.images.pixels.resize import _ceil_sqrt, _shrink, resize_array, target_size
from zephon.schema.recipe import ImageSpec


def documented_patches(pixels: np.ndarray, p: int, m: int) -> list[list[int]]:
    """The layout patches.py states: windows row-major, patches row-major in a
    window, channel-major pixels in a patch."""
    height, width, _ = pixels.shape
    out = []
    for wy in range(height // (p * m)):
        for wx in range(width // (p * m)):
            for py in range(m):
                for px in range(m):
                    y0, x0 = (wy * m + py) * p, (wx * m + px) * p
                    out.append(
                        [int(pixels[y0 + y, x0 + x, c]) for c in range(3) for y in range(p)
                         for x in range(p)]
                    )  # fmt: skip
    return out


PIXELS = (np.arange(8 * 12 * 3, dtype=np.int64) % 251).astype(np.uint8).reshape(8, 12, 3)


def test_patches_follow_the_documented_order_and_come_back():
    patches, grid = to_patches(PIXELS, 2, 2)
    assert grid == (4, 6) and patches.shape == (24, 12) and patches.dtype == np.uint8
    assert patches.tolist() == documented_patches(PIXELS, 2, 2)
    assert np.array_equal(from_patches(patches, grid, 2, 2), PIXELS)
    one, grid1 = to_patches(PIXELS[:4, :4], 4, 1)
    assert grid1 == (1, 1) and one.tolist() == documented_patches(PIXELS[:4, :4], 4, 1)


def test_patch_positions_are_each_rows_grid_row_and_column():
    positions = patch_positions((4, 6), 2)
    k = np.arange(24)
    # The module's formula: row (k // m²) // (w / m) * m + (k % m²) // m, column likewise.
    rows = (k // 4) // 3 * 2 + (k % 4) // 2
    cols = (k // 4) % 3 * 2 + k % 2
    assert positions.tolist() == np.stack([rows, cols], axis=1).tolist()
    assert positions.dtype == np.int64 and positions.shape == (24, 2)
    assert patch_positions((1, 1), 1).tolist() == [[0, 0]]
    assert placeholder_count((4, 6), 2) == 6 and placeholder_count((6, 4), 2) == 6
    assert placeholder_count((3, 5), 1) == 15


@pytest.mark.parametrize("grid", [(0, 2), (2, 0), (3, 2), (2, 3), (-2, 2)])
def test_a_grid_must_be_whole_merge_windows(grid):
    for call in (lambda: patch_positions(grid, 2), lambda: placeholder_count(grid, 2)):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == f"grid {grid} must be positive multiples of merge = 2"


def test_patches_refuse_what_is_not_rgb_whole_windows():
    for bad in (PIXELS.astype(np.int16), PIXELS[..., 0], PIXELS[..., :2]):
        with pytest.raises(ValueError) as info:
            to_patches(bad, 2, 2)
        assert str(info.value) == (
            f"expected an RGB uint8 array [H, W, 3], got {bad.dtype} {bad.shape}"
        )
    for cut in (PIXELS[:6], PIXELS[:, :10]):
        with pytest.raises(ValueError) as info:
            to_patches(cut, 2, 2)
        h, w, _ = cut.shape
        assert str(info.value) == f"image {w} x {h} is not a whole number of 4-pixel windows"
    patches, grid = to_patches(PIXELS, 2, 2)
    for shape in ((24, 11), (23, 12)):
        with pytest.raises(ValueError) as info:
            from_patches(np.zeros(shape, np.uint8), grid, 2, 2)
        assert str(info.value) == f"patches {shape} do not fit grid (4, 6) with patch_size 2"


def test_ceil_sqrt_is_exact():
    assert [_ceil_sqrt(n, 1) for n in (1, 2, 4, 5, 9, 10)] == [1, 2, 2, 3, 3, 4]
    assert [_ceil_sqrt(n, 4) for n in (1, 4, 5, 16, 17)] == [1, 1, 2, 2, 3]
    big = 10**30 + 1
    assert _ceil_sqrt(big, 1) == 10**15 + 1 and _ceil_sqrt(10**30, 1) == 10**15


SMALL = ImageSpec(patch_size=2, merge=2, min_pixels=4 * 16, max_pixels=12 * 16)  # 4-pixel windows


def test_sizes_round_to_windows_and_stay_within_the_pixel_budget():
    assert target_size(16, 12, SMALL) == (16, 12)  # 4 x 3 windows: within [4, 12]
    assert target_size(13, 14, SMALL) == (12, 16)  # 3.25 -> 3, 3.5 -> 4 (halves up)
    assert target_size(10, 6, SMALL) == (12, 8)  # 2.5 -> 3, 1.5 -> 2: 6 windows
    assert target_size(4, 4, SMALL) == (8, 8)  # 1 window, raised to 4
    assert target_size(6, 4, SMALL) == (12, 8)  # 2 windows up: sides ceil(side * s / 4)
    assert target_size(40, 40, SMALL) == (12, 12)  # 100 windows down to 9 (3 x 3)
    assert target_size(400, 4, SMALL) == (48, 4)  # a side at one window: the other cut to 12
    assert target_size(4, 400, SMALL) == (4, 48)
    with pytest.raises(ValueError) as info:
        target_size(0, 5, SMALL)
    assert str(info.value) == "image size must be positive, got 0 x 5"
    assert target_size(1, 1, ImageSpec()) == (56, 56)
    sizes = target_size(400, 4, SMALL) + target_size(4, 400, SMALL) + target_size(4, 4, SMALL)
    assert all(type(v) is int for v in sizes)


def test_scaling_up_past_max_pixels_takes_the_scaled_down_size():
    tight = ImageSpec(patch_size=2, merge=2, min_pixels=5 * 16, max_pixels=5 * 16)
    # 6 x 4 rounds to 2 windows; scaled up to min_pixels it is 3 x 2 = 6 windows, over
    # the 5 allowed, so step 2's size is taken: 2 x 1 windows.
    assert target_size(6, 4, tight) == (8, 4)
    # Scaled up to exactly the cap (3 windows) is kept, not scaled down again.
    exact = ImageSpec(patch_size=2, merge=2, min_pixels=2 * 16, max_pixels=3 * 16)
    assert target_size(2, 5, exact) == (4, 12)


def test_shrink_counts_windows_and_cuts_only_a_raised_side():
    assert _shrink(40, 40, 4, 12 * 16, 12) == (3, 3)
    assert _shrink(400, 4, 4, 12 * 16, 12) == (12, 1)
    assert _shrink(4, 400, 4, 12 * 16, 12) == (1, 12)
    assert _shrink(30, 10, 4, 12 * 16, 12) == (6, 2)


def test_resize_array_is_the_bicubic_resize_and_leaves_a_right_size_alone():
    out = resize_array(PIXELS, (6, 4))
    assert out.shape == (4, 6, 3) and out.dtype == np.uint8
    assert np.array_equal(resize_array(PIXELS, (12, 8)), PIXELS)


def test_patches_written_into_a_buffer_are_the_same_bytes_and_a_view_of_it():
    """`to_patches(..., out=)`: what a decode process writes into shared memory."""
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (2 * 3 * 4, 2 * 3 * 2, 3), dtype=np.uint8)  # p 3, merge 2
    want, grid = to_patches(pixels, 3, 2)
    buf = np.zeros(want.size + 16, dtype=np.uint8)
    got, got_grid = to_patches(pixels, 3, 2, out=buf[8 : 8 + want.size])
    assert got_grid == grid and got.shape == want.shape and np.array_equal(got, want)
    assert np.shares_memory(got, buf) and not buf[:8].any() and not buf[-8:].any()


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(216, dtype=np.int16),  # another dtype
        np.zeros(215, dtype=np.uint8),  # a byte short
        np.zeros(432, dtype=np.uint8)[::2],  # the right size, not contiguous
    ],
    ids=["dtype", "size", "strided"],
)
def test_a_buffer_that_is_not_exactly_the_patches_bytes_is_refused(bad):
    pixels = np.zeros((12, 6, 3), dtype=np.uint8)  # 4 x 2 patches of 3 pixels: 8 x 27 bytes
    with pytest.raises(ValueError) as err:
        to_patches(pixels, 3, 2, out=bad)
    assert "contiguous uint8 buffer of 216 bytes (patches (8, 27))" in str(err.value)
