"""One image, bytes to patches: what a worker does with it, and what the
scheduler can know before any pixel is decoded.

`size_image` reads the header only: displayed size, resized size, patch grid,
placeholder count (tokens for mixing, budget and packing) and the decode peak
in bytes (for the lookahead budget). `prepare_image` then decodes (decode.py),
resizes (resize.py) and cuts patches (patches.py); its grid and token count
are the sizing's, since both follow from the header alone. A worker that sizes
an image and later decodes it keeps the sizing's opened image (`keep_open`), so
a header is parsed once, not twice: parsing is Python under the GIL, about
40 µs an image whatever its size (as long as cutting a thumbnail's patches).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from zephon.images.header import ImageHeader, open_image
from zephon.images.header_scan import scan_header
from zephon.images.pixels.decode import decode_image
from zephon.images.pixels.patches import placeholder_count, to_patches
from zephon.images.pixels.resize import resize, target_size
from zephon.schema.recipe import ImageSpec


@dataclass(frozen=True)
class ImageSizing:
    header: ImageHeader
    size: tuple[int, int]  # (width, height) after resizing
    grid: tuple[int, int]  # (h_patches, w_patches)
    num_tokens: int  # placeholder tokens: num_patches / merge²
    patch_bytes: int  # bytes of the patch array prepare_image returns
    # The header's Pillow image, not decoded, for the one decode that follows
    # (size_image with keep_open); empty once taken.
    opened: list[Image.Image] = field(default_factory=list, repr=False, compare=False)

    @property
    def decode_peak_bytes(self) -> int:
        return self.header.decode_peak_bytes

    def take_opened(self) -> tuple[Image.Image, ImageHeader] | None:
        """The opened image and its header, once; None if not kept or already taken."""
        return (self.opened.pop(), self.header) if self.opened else None


@dataclass(frozen=True, eq=False)
class ImagePatches:
    name: str  # the record, for error messages
    patches: np.ndarray  # [num_patches, 3 * patch_size²] uint8, order of patches.py
    grid: tuple[int, int]  # (h_patches, w_patches)
    num_tokens: int


def _sizing(header: ImageHeader, spec: ImageSpec) -> ImageSizing:
    width, height = target_size(*header.size, spec)
    p = spec.patch_size
    grid = (height // p, width // p)
    return ImageSizing(
        header=header,
        size=(width, height),
        grid=grid,
        num_tokens=placeholder_count(grid, spec.merge),
        patch_bytes=grid[0] * grid[1] * 3 * p * p,
    )


def size_image(data: bytes, name: str, spec: ImageSpec, keep_open: bool = False) -> ImageSizing:
    """What `prepare_image(data, ...)` will give and cost, from the header alone.
    Raises the ImageError prepare_image would raise for a bad header or a bomb.
    keep_open: keep the opened image for `prepare_image(..., sizing)`; without it,
    a header that header_scan.py can read is not opened with Pillow."""
    if not keep_open:
        scanned = scan_header(data, name, spec.max_decoded_pixels)
        if scanned is not None:
            return _sizing(scanned, spec)
    image, header = open_image(data, name, spec.max_decoded_pixels)
    sizing = _sizing(header, spec)
    if keep_open:
        sizing.opened.append(image)
    return sizing


def prepare_image(
    data: bytes,
    name: str,
    spec: ImageSpec,
    sizing: ImageSizing | None = None,
    out: np.ndarray | None = None,
) -> ImagePatches:
    """Decode, resize and cut `data` into patches, by the pixel definition. `sizing`:
    its `size_image(data, name, spec, keep_open=True)`, whose opened image is used
    instead of opening `data` again (the pixels are the same). `out`: a uint8
    buffer of the sizing's `patch_bytes` that the patches are written into
    (shared memory a decode process fills, images/decode_processes.py)."""
    opened = sizing.take_opened() if sizing is not None else None
    if opened is None:
        opened = open_image(data, name, spec.max_decoded_pixels)
    target = target_size(*opened[1].size, spec)  # from the displayed size, as the sizing
    image = decode_image(data, name, spec, opened, target)  # (smaller if reduced)
    pixels = np.asarray(resize(image, target))
    patches, grid = to_patches(pixels, spec.patch_size, spec.merge, out)
    return ImagePatches(
        name=name, patches=patches, grid=grid, num_tokens=placeholder_count(grid, spec.merge)
    )
