"""Resizing: the size an image gets, and the filter that gets it there.

Size: both sides become whole multiples of the merge window
(`patch_size * merge` pixels, at least one window a side), the aspect ratio
kept as closely as that allows, and the area within [min_pixels, max_pixels]:

1. Round each side to the nearest multiple of the window (halves up).
2. If that is more than max_pixels: scale both sides by the same factor so
   the area is at most max_pixels, each side rounded down to a window
   multiple; if a side is then at its floor of one window, the other is cut
   to what fits. max_pixels is never exceeded.
3. If it is less than min_pixels: scale up likewise, sides rounded up; if
   that would pass max_pixels (the two bounds within a rounding step of each
   other), step 2's size is taken instead.

All in integer arithmetic (integer square roots), so the size is exact on
every machine. It depends only on the displayed size, known from the header.

Filter: Pillow's bicubic convolution (a = -0.5), used for every resize,
shrinking and enlarging, in one step (no `reducing_gap` shortcut). Pillow
widens the kernel by the reduction factor when shrinking, so a large image is
antialiased rather than sampled, and applies 8-bit images' kernels as integer
weights on one thread, so the result does not depend on thread count (it may
on the Pillow build: the decode canary covers it). Bicubic is also the filter
CLIP and Qwen2-VL image encoders were trained with, so pixels stay close to
what such encoders expect.
"""

from __future__ import annotations

from math import isqrt

import numpy as np
from PIL import Image

from zephon.schema.recipe import ImageSpec

RESAMPLE = Image.Resampling.BICUBIC


def _ceil_sqrt(num: int, den: int) -> int:
    """ceil(sqrt(num / den)) for num, den > 0, exactly."""
    n = -(-num // den)  # ceil(num / den): k*k >= num/den iff k*k >= ceil(num/den)
    return isqrt(n - 1) + 1


def target_size(width: int, height: int, spec: ImageSpec) -> tuple[int, int]:
    """(width, height) in pixels that an image of `width` x `height` is resized to."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width} x {height}")
    f = spec.window
    cap = spec.max_pixels // (f * f)  # windows allowed in all (>= 1, checked by ImageSpec)
    w = max(1, (2 * width + f) // (2 * f))
    h = max(1, (2 * height + f) // (2 * f))
    if w * h * f * f > spec.max_pixels:
        w, h = _shrink(width, height, f, spec.max_pixels, cap)
    elif w * h * f * f < spec.min_pixels:
        # sides ceil(side * s / f) with s = sqrt(min_pixels / (width * height))
        w = _ceil_sqrt(spec.min_pixels * width, height * f * f)
        h = _ceil_sqrt(spec.min_pixels * height, width * f * f)
        if w * h > cap:
            w, h = _shrink(width, height, f, spec.max_pixels, cap)
    return w * f, h * f


def _shrink(width: int, height: int, f: int, max_pixels: int, cap: int) -> tuple[int, int]:
    """Window counts (w, h): sides floor(side * s / f), s = sqrt(max_pixels / area)."""
    w = max(1, isqrt(max_pixels * width // (height * f * f)))
    h = max(1, isqrt(max_pixels * height // (width * f * f)))
    # Only a side raised to one window can make the product pass the cap.
    if w * h > cap:
        if h == 1:
            w = cap
        else:
            h = cap // w
    return w, h


def resize(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` at `size` (width, height) with the one filter; unchanged if already so."""
    if image.size == tuple(size):
        return image
    return image.resize(size, RESAMPLE, reducing_gap=None)


def resize_array(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """resize() for an RGB uint8 array [H, W, 3] (the same bytes as on the image)."""
    return np.asarray(resize(Image.fromarray(pixels, "RGB"), size))
