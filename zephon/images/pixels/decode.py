"""The pixel definition: encoded bytes -> RGB uint8 array [H, W, 3].

Changing any rule here changes batch digests, so the rules are fixed now:

1. Formats: JPEG, PNG and WebP only (header.py), through Pillow. The first
   frame of an animated image. Full decode at the stored resolution (the
   default, `[image] decode = "exact"`); resizing comes after (resize.py).
   With `decode = "reduced"`, a JPEG at least twice its target size a side is
   decoded at the smallest DCT scale of 1/2, 1/4 or 1/8 that still gives at
   least the target size (Pillow's `draft`, libjpeg's scaled IDCT), then
   resized to the target: other pixels than the exact decode, the same on
   every run and machine with the same decoder build (the canary).
2. Size limit: images of more than `max_decoded_pixels` are refused from
   their header, before decoding (header.py).
3. Modes to RGB, without colour management (ICC profiles are not applied;
   the pixels are the stored values):
   - 16-bit samples keep their high byte (v >> 8). Pillow does this itself for
     16-bit colour PNGs; 16-bit grey, which Pillow would clip, is reduced the
     same way here.
   - Grey ("1", "L") and palette ("P") images: Pillow's conversion to RGB
     (grey g -> (g, g, g); palette index -> its colour).
   - CMYK (JPEG, Adobe-inverted ones as Pillow reads them): Pillow's
     conversion, R = round((255 - C) * (255 - K) / 255), and so on.
4. Transparency (an alpha channel: RGBA, LA, PA; or a tRNS colour or palette
   alpha) is composited over the opaque `background` colour, per channel:
   out = (c * a + bg * (255 - a) + 127) // 255, which is what Pillow's
   masked paste computes.
5. The EXIF orientation tag (1 to 8; from the header, see header.py) is
   applied: the array is the image as it is meant to be displayed.

Pillow decodes and converts on one thread with integer arithmetic, so the
output does not depend on the number of threads or on which thread runs it;
it depends on the decoder builds, which is what the decode canary detects.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFile

from zephon.errors import ImageError
from zephon.images.header import SWAPS_SIDES, ImageHeader, open_image
from zephon.schema.recipe import ImageSpec

# EXIF orientation -> the transposition that displays the stored image.
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_SIXTEEN_BIT = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})
_CONVERTIBLE = frozenset({"1", "L", "P", "RGB", "CMYK", "YCbCr"}) | _ALPHA_MODES


def _to_8bit(im: Image.Image) -> Image.Image:
    """A 16-bit grey image as 8-bit grey (high byte), keeping a tRNS grey level as alpha."""
    wide = np.asarray(im)
    grey = (np.clip(wide, 0, 65535) >> 8).astype(np.uint8)
    transparent = im.info.get("transparency")
    if isinstance(transparent, int):
        alpha = np.where(wide == transparent, 0, 255).astype(np.uint8)
        return Image.fromarray(np.stack([grey, alpha], axis=-1), "LA")
    return Image.fromarray(grey, "L")


def _to_rgb(im: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    """Rules 3 and 4: any supported mode to RGB, transparency over `background`."""
    if im.mode in _SIXTEEN_BIT:
        im = _to_8bit(im)
    if im.mode not in _CONVERTIBLE:
        raise ValueError(f"unsupported pixel mode {im.mode!r}")
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        # (convert applies a tRNS colour or the palette's alpha; RGBA is used as it is)
        rgba = im if im.mode == "RGBA" else im.convert("RGBA")
        out = Image.new("RGB", rgba.size, background)
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    return im if im.mode == "RGB" else im.convert("RGB")


def decode_image(
    data: bytes,
    name: str,
    spec: ImageSpec,
    opened: tuple[Image.Image, ImageHeader] | None = None,
    target: tuple[int, int] | None = None,
) -> Image.Image:
    """The image as a Pillow RGB image, by the rules above (what prepare.py resizes).
    `opened`: `open_image(data, name, ...)` already made (not decoded yet).
    `target`: the (width, height) as displayed it will be resized to; with
    `spec.decode == "reduced"`, a JPEG is decoded at a scale that keeps at least it.

    Raises ImageError naming `name` for anything that is not a decodable image
    within the limit: empty, not an image, truncated or corrupt data, too many pixels.
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # Would decode a cut-off image as if it were whole, padded with grey.
        raise ImageError(
            f"{name}: PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set in this process; "
            "Zephon decodes only complete images (set it back to False)"
        )
    im, header = opened if opened is not None else open_image(data, name, spec.max_decoded_pixels)
    if spec.decode == "reduced" and target is not None and header.format == "JPEG":
        w, h = target
        im.draft(None, (h, w) if header.orientation in SWAPS_SIDES else (w, h))  # as stored
    try:
        im.load()
        im = _to_rgb(im, spec.background)
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageError(f"{name}: cannot decode the {header.format} image: {exc}") from None
    method = _TRANSPOSE.get(header.orientation)
    return im.transpose(method) if method is not None else im


def decode(data: bytes, name: str, spec: ImageSpec) -> np.ndarray:
    """Encoded bytes -> RGB uint8 array [H, W, 3] at full resolution, as displayed
    (`spec`: max_decoded_pixels and background)."""
    return np.asarray(decode_image(data, name, spec))
