"""One image, bytes to patches: what a worker does with it, and what the
scheduler can know before any pixel is decoded.

`plan_image` reads the header only: displayed size, resized size, patch grid,
placeholder count (tokens for mixing, budget and packing) and the decode peak
in bytes (for the lookahead budget). `prepare_image` then decodes (decode.py),
resizes (resize.py) and cuts patches (patches.py); its grid and token count
are the plan's, since both follow from the header alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon.images.decode import decode_image
from zephon.images.header import ImageHeader, read_header
from zephon.images.patches import placeholder_count, to_patches
from zephon.images.resize import resize, target_size
from zephon.recipe import ImageSpec


@dataclass(frozen=True)
class ImagePlan:
    header: ImageHeader
    size: tuple[int, int]  # (width, height) after resizing
    grid: tuple[int, int]  # (h_patches, w_patches)
    num_tokens: int  # placeholder tokens: num_patches / merge²
    patch_bytes: int  # bytes of the patch array prepare_image returns

    @property
    def decode_peak_bytes(self) -> int:
        return self.header.decode_peak_bytes


@dataclass(frozen=True, eq=False)
class ImagePatches:
    name: str  # the record, for error messages
    patches: np.ndarray  # [num_patches, 3 * patch_size²] uint8, order of patches.py
    grid: tuple[int, int]  # (h_patches, w_patches)
    num_tokens: int


def _plan(header: ImageHeader, spec: ImageSpec) -> ImagePlan:
    width, height = target_size(*header.size, spec)
    p = spec.patch_size
    grid = (height // p, width // p)
    return ImagePlan(
        header=header,
        size=(width, height),
        grid=grid,
        num_tokens=placeholder_count(grid, spec.merge),
        patch_bytes=grid[0] * grid[1] * 3 * p * p,
    )


def plan_image(data: bytes, name: str, spec: ImageSpec) -> ImagePlan:
    """What `prepare_image(data, ...)` will give and cost, from the header alone.
    Raises the ImageError prepare_image would raise for a bad header or a bomb."""
    return _plan(read_header(data, name, spec.max_decoded_pixels), spec)


def prepare_image(data: bytes, name: str, spec: ImageSpec) -> ImagePatches:
    """Decode, resize and cut `data` into patches, by the pixel definition."""
    image = decode_image(data, name, spec)  # its size is the header's displayed size
    pixels = np.asarray(resize(image, target_size(*image.size, spec)))
    patches, grid = to_patches(pixels, spec.patch_size, spec.merge)
    return ImagePatches(
        name=name, patches=patches, grid=grid, num_tokens=placeholder_count(grid, spec.merge)
    )
