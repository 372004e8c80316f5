"""What an image's header tells before a single pixel is decoded.

Opening an image reads only its header: format, pixel mode, stored size and
(JPEG, WebP, and PNG when its eXIf chunk precedes the image data) the EXIF
orientation. That is enough to refuse a decompression bomb before decoding
(more pixels than `ImageSpec.max_decoded_pixels`, with the record named), to
know the displayed size (and so the resized size and the placeholder count,
see prepare.py), and to know what decoding will cost in memory, so a
lookahead byte budget can reserve it first (`decode_peak_bytes`).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Any

from PIL import Image, UnidentifiedImageError
from PIL import JpegImagePlugin as _jpeg  # noqa: F401  (registered now: see FORMATS)
from PIL import PngImagePlugin as _png  # noqa: F401
from PIL import WebPImagePlugin as _webp  # noqa: F401

from zephon.errors import ImageError

# Only the decoders the decode canary exercises (canary.py): every byte of
# pixels comes from a library whose build the fingerprint can name. Their three
# plugins are imported above: `Image.open(formats=FORMATS)` would otherwise import
# every Pillow plugin (0.1-0.3 s, in each process) at its first WebP.
FORMATS = ("JPEG", "PNG", "WEBP")
ORIENTATION_TAG = 0x0112
# EXIF orientations 5 to 8 swap width and height.
SWAPS_SIDES = frozenset({5, 6, 7, 8})
# Bytes a pixel takes in Pillow's memory, per mode: three- and four-channel
# 8-bit images are stored as 4 bytes a pixel.
_STORED_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}
# Converting to RGB holds at most two full-resolution images at once (the
# previous one freed as the next is made: RGBA and the RGB result while
# compositing) plus a 1-byte alpha mask, and one byte of slack: 4 + 4 + 1 + 1.
# A progressive JPEG's coefficient buffer (up to 8 bytes a pixel) is freed
# when decoding ends, before any conversion, so it fits in the same bound.
_WORK_BYTES = 10
# Pillow's WebP decoder keeps libwebp's canvases (about 8 bytes a pixel)
# alive beside the decoded image.
_DECODER_BYTES = {"WEBP": 8}

# Our own limit (max_decoded_pixels) decides which images are refused; Pillow's
# warning for images above its MAX_IMAGE_PIXELS would only repeat it.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


@dataclass(frozen=True)
class ImageHeader:
    name: str  # the record the image came from, for error messages
    format: str  # JPEG, PNG or WEBP
    mode: str  # Pillow's pixel mode as stored (RGB, P, I;16, CMYK...)
    stored_size: tuple[int, int]  # (width, height) as stored
    orientation: int  # EXIF orientation, 1 (as stored) to 8
    encoded_bytes: int

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) as displayed: after the EXIF orientation."""
        w, h = self.stored_size
        return (h, w) if self.orientation in SWAPS_SIDES else (w, h)

    @property
    def pixels(self) -> int:
        return self.stored_size[0] * self.stored_size[1]

    @property
    def decode_peak_bytes(self) -> int:
        """An upper bound of the memory one decode holds at its peak: the encoded
        bytes, the decoded image as Pillow stores it, the decoder's own buffers
        and the working images of the conversion to RGB. A 24-megapixel RGB
        JPEG: 24e6 * (4 + 10) bytes, 336 MB (measured peaks, in bytes a pixel:
        5.3 for an RGB JPEG, 8 rotated, 10 for a palette PNG with transparency,
        17 for an RGBA WebP; bounds 14, 14, 11 and 22)."""
        stored = _STORED_BYTES.get(self.mode, 4) + _DECODER_BYTES.get(self.format, 0)
        return self.encoded_bytes + self.pixels * (stored + _WORK_BYTES)


def _orientation(info: dict[str, Any]) -> int:
    """The EXIF orientation tag of the header's EXIF block; 1 when there is none
    or it is unreadable or out of range. XMP orientation is not read."""
    raw = info.get("exif")
    if not raw:
        return 1
    exif = Image.Exif()
    try:
        exif.load(raw)
        value = exif.get(ORIENTATION_TAG, 1)
    except Exception:  # a damaged EXIF block is no orientation, not a bad image
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _sniff(data: bytes) -> str:
    """The format a file's signature claims ("" if none of ours)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return ""


def open_image(data: bytes, name: str, max_decoded_pixels: int) -> tuple[Image.Image, ImageHeader]:
    """(Pillow image, not decoded yet, header) of encoded bytes.

    Raises ImageError naming `name` for empty bytes, bytes that are not a JPEG,
    PNG or WebP image, and images of more than `max_decoded_pixels` pixels.
    """
    if not data:
        raise ImageError(f"{name}: zero-size image (no bytes)")
    try:
        im = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as exc:
        raise ImageError(f"{name}: refused before decoding: {exc}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        kind = _sniff(data)
        if kind:  # the signature is right: the header itself is cut short or damaged
            raise ImageError(
                f"{name}: cannot read the {kind} header (truncated or corrupt, "
                f"{len(data)} bytes): {exc}"
            ) from None
        raise ImageError(
            f"{name}: not an image ({', '.join(FORMATS)} expected; {len(data)} bytes "
            f"starting {data[:8].hex()})"
        ) from None
    header = ImageHeader(
        name=name,
        format=str(im.format),
        mode=im.mode,
        stored_size=im.size,
        orientation=_orientation(im.info),
        encoded_bytes=len(data),
    )
    w, h = im.size
    if w * h > max_decoded_pixels:
        raise ImageError(
            f"{name}: image of {w} x {h} = {w * h} pixels exceeds max_decoded_pixels "
            f"({max_decoded_pixels}); refused before decoding (a decompression bomb?)"
        )
    return im, header


def read_header(data: bytes, name: str, max_decoded_pixels: int) -> ImageHeader:
    """The header of encoded bytes, checked as open_image checks it; nothing decoded."""
    return open_image(data, name, max_decoded_pixels)[1]
