"""An image's header read straight from its bytes, where that is unambiguous.

The planner needs every image's size and pixel mode when the image is read
(header.py). Pillow's open gives them, but it is Python under the loader's
GIL, about 30 µs an image (a JPEG's quantisation tables are unpacked entry by
entry; this scan takes 5, benchmarks/bench_image_work.py), paid again by the
decode process that opens the same bytes to decode them. `scan_header` reads
only what the sizing needs, and only from headers it understands completely:

- JPEG: 8-bit baseline, extended or progressive frames (SOF0 to SOF2) of one
  or three components, segments up to the start of scan whole, quantisation
  tables of the lengths Pillow checks, and no segment that Pillow would read
  more from (EXIF, which holds the orientation; ICC; MPF; Adobe; Photoshop);
- PNG: 8-bit samples, every chunk before the image data one of IHDR (first),
  PLTE, tRNS, gAMA, cHRM, sRGB and pHYs, each as long as Pillow requires and
  each checksum right.

Anything else, including every header Pillow would refuse, gives None and is
opened by Pillow, so the header is always the one Pillow gives and an error
always Pillow's (tests/unit/zephon/test_header_scan.py compares the two on
real files and on thousands of damaged ones). Images over the pixel limits
give None too: their refusal is worded by header.py.
"""

from __future__ import annotations

import zlib

from PIL import Image

from zephon.images.header import ImageHeader

_JPEG_FRAMES = frozenset({0xC0, 0xC1, 0xC2})  # baseline, extended, progressive
_JPEG_SKIPPED = frozenset({0xC4, 0xCC, 0xDD, 0xFE})  # DHT, DAC, DRI, COM: lengths only
_JPEG_MODES = {1: "L", 3: "RGB"}
# Application segments whose content Pillow reads further (orientation, colour,
# multi-picture files): left to Pillow.
_APP_LEFT_TO_PILLOW = (
    (0xE1, b"Exif\0\0"),
    (0xE2, b"ICC_PROFILE\0"),
    (0xE2, b"MPF\0"),
    (0xED, b"Photoshop 3.0\0"),
    (0xEE, b"Adobe"),
)

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_MODES = {0: "L", 2: "RGB", 3: "P", 4: "LA", 6: "RGBA"}  # colour type, 8-bit samples
# Chunks before the image data that change no part of the header, and the
# shortest length Pillow accepts for each (tRNS: by mode, below).
_PNG_PLAIN = {b"PLTE": 0, b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9, b"tRNS": 0}
_PNG_TRNS_MIN = {"L": 2, "RGB": 6}


def scan_header(data: bytes, name: str, max_decoded_pixels: int) -> ImageHeader | None:
    """The header `header.open_image` would give for `data`, or None where only
    Pillow can tell (see the module notes)."""
    if data[:3] == b"\xff\xd8\xff":
        found = _scan_jpeg(data)
        kind = "JPEG"
    elif data[:8] == _PNG_MAGIC:
        found = _scan_png(data)
        kind = "PNG"
    else:
        return None
    if found is None:
        return None
    width, height, mode = found
    pixels = width * height
    bomb = Image.MAX_IMAGE_PIXELS  # Pillow's own limit (None: switched off)
    if pixels > max_decoded_pixels or (bomb is not None and pixels > bomb):
        return None
    return ImageHeader(name, kind, mode, (width, height), 1, len(data))


def _scan_jpeg(data: bytes) -> tuple[int, int, str] | None:
    end = len(data)
    at = 2  # after SOI
    frame: tuple[int, int, str] | None = None
    while at + 4 <= end:
        if data[at] != 0xFF:
            return None  # junk between segments: Pillow skips it its own way
        marker = data[at + 1]
        length = (data[at + 2] << 8) | data[at + 3]
        body = at + 4
        at += 2 + length
        if length < 2 or at > end:
            return None
        if marker == 0xDA:  # start of scan: the header is complete
            return frame
        if marker in _JPEG_FRAMES:
            if frame is not None or length < 8:
                return None
            bits, layers = data[body], data[body + 5]
            if length != 8 + 3 * layers:  # Pillow reads three bytes per component
                return None
            height = (data[body + 1] << 8) | data[body + 2]
            width = (data[body + 3] << 8) | data[body + 4]
            mode = _JPEG_MODES.get(layers)
            if bits != 8 or mode is None or width == 0 or height == 0:
                return None
            frame = (width, height, mode)
        elif marker == 0xDB:  # quantisation tables: 65 or 129 bytes each
            t = body
            while t < at:
                t += 65 if data[t] < 16 else 129
            if t != at:
                return None
        elif 0xE0 <= marker <= 0xEF:
            segment = data[body:at]
            if any(marker == m and segment.startswith(tag) for m, tag in _APP_LEFT_TO_PILLOW):
                return None
            if marker == 0xE0 and segment.startswith(b"JFIF") and length < 9:
                return None  # Pillow reads the version at offset 5
        elif marker not in _JPEG_SKIPPED:
            return None
    return None


def _scan_png(data: bytes) -> tuple[int, int, str] | None:
    end = len(data)
    if end < 33 or data[12:16] != b"IHDR" or data[8:12] != b"\0\0\0\x0d":
        return None
    ihdr = data[16:29]
    if zlib.crc32(data[12:29]) != int.from_bytes(data[29:33], "big"):
        return None
    width, height = int.from_bytes(ihdr[0:4], "big"), int.from_bytes(ihdr[4:8], "big")
    mode = _PNG_MODES.get(ihdr[9])
    if ihdr[8] != 8 or mode is None or ihdr[11] != 0 or width == 0 or height == 0:
        return None
    at = 33
    while at + 8 <= end:
        length = int.from_bytes(data[at : at + 4], "big")
        kind = data[at + 4 : at + 8]
        if kind == b"IDAT":
            return width, height, mode
        least = _PNG_PLAIN.get(kind)
        if least is None:
            return None
        if kind == b"tRNS":
            least = _PNG_TRNS_MIN.get(mode, 0)
        stop = at + 8 + length
        if length < least or stop + 4 > end:
            return None
        if zlib.crc32(data[at + 4 : stop]) != int.from_bytes(data[stop : stop + 4], "big"):
            return None
        at = stop + 4
    return None
