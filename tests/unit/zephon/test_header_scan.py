"""Headers read from the bytes (zephon/images/header_scan.py) are Pillow's headers:
where the scan answers, Pillow opens the same bytes and gives the same header;
where anything is unusual or damaged, the scan leaves the file to Pillow."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from harness import sample_images
from zephon.errors import ImageError
from zephon.images.header import open_image
from zephon.images.header_scan import scan_header
from zephon.images.pixels.canary import CANARY_DIR, CANARY_FILES

LIMIT = 50_000_000


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


def _picture(mode: str, size: tuple[int, int] = (37, 21)) -> Image.Image:
    rng = np.random.default_rng(len(mode) + size[0])
    rgba = rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8)
    return Image.fromarray(rgba, "RGBA").convert(mode)


def _text_info() -> PngInfo:
    info = PngInfo()
    info.add_text("caption", "a red circle")
    return info


def _rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return _encode(_picture("RGB"), "JPEG", exif=exif)


# Files the scan reads itself: the common kinds of web images.
READ = {
    "jpeg rgb": _encode(_picture("RGB"), "JPEG", quality=90),
    "jpeg grey": _encode(_picture("L"), "JPEG"),
    "jpeg progressive": _encode(_picture("RGB", (300, 200)), "JPEG", progressive=True),
    "jpeg optimized, restart markers": _encode(
        _picture("RGB", (64, 80)), "JPEG", optimize=True, restart_marker_blocks=2
    ),
    "jpeg with a comment": _encode(_picture("RGB"), "JPEG", comment=b"a caption"),
    "jpeg 4:4:4": _encode(_picture("RGB"), "JPEG", subsampling=0, quality=95),
    "png rgb": _encode(_picture("RGB"), "PNG"),
    "png rgba": _encode(_picture("RGBA"), "PNG"),
    "png grey": _encode(_picture("L"), "PNG"),
    "png grey+alpha": _encode(_picture("LA"), "PNG"),
    "png palette": _encode(_picture("P"), "PNG"),
    "png palette, transparent index": _encode(_picture("P"), "PNG", transparency=3),
    "png with dpi": _encode(_picture("RGB"), "PNG", dpi=(300, 300)),
}
# Files left to Pillow: what the scan does not read (orientation, ICC, other depths...).
LEFT = {
    "jpeg rotated by exif": _rotated_jpeg(),
    "jpeg cmyk": _encode(_picture("CMYK"), "JPEG"),
    "jpeg with an icc profile": _encode(_picture("RGB"), "JPEG", icc_profile=b"\0" * 200),
    "png 1-bit": _encode(_picture("1"), "PNG"),
    "png 16-bit grey": _encode(
        Image.fromarray(np.arange(600, dtype=np.uint16).reshape(20, 30)), "PNG"
    ),
    "png with text": _encode(_picture("RGB"), "PNG", pnginfo=_text_info()),
    "webp": _encode(_picture("RGB"), "WEBP"),
    "not an image": b"GIF89a........",
}


def _samples() -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    out = {f"canary {f}": (CANARY_DIR / f).read_bytes() for f in CANARY_FILES}
    for k in range(12):
        data, ext, _, _ = sample_images.scene(rng)
        out[f"scene {k}.{ext}"] = data
    for k in range(3):
        data, _, _, _ = sample_images.photo(rng, ((400, 300), (360, 480)))
        out[f"photo {k}"] = data
    return out


def _same_as_pillow(data: bytes) -> bool:
    """The scan gives None, or exactly the header Pillow's open gives (which succeeds)."""
    scanned = scan_header(data, "x", LIMIT)
    if scanned is None:
        return False
    _, header = open_image(data, "x", LIMIT)  # raises if Pillow refuses what the scan read
    assert scanned == header
    return True


@pytest.mark.parametrize("kind", sorted(READ))
def test_common_kinds_are_read_from_the_bytes_as_pillow_reads_them(kind):
    assert _same_as_pillow(READ[kind])


@pytest.mark.parametrize("kind", sorted(LEFT))
def test_unusual_kinds_are_left_to_pillow(kind):
    assert scan_header(LEFT[kind], "x", LIMIT) is None


def test_the_canary_and_the_sample_generators_images():
    read = [name for name, data in _samples().items() if _same_as_pillow(data)]
    # the rotated canary JPEG is Pillow's; the sample scenes and photos are all read
    assert len(read) >= 15 and not any("rot" in name for name in read)


def test_damaged_headers_are_read_as_pillow_reads_them_or_left_to_it():
    """Every cut of the first 700 bytes and 3,000 single-byte changes in them, of a
    JPEG and a PNG: whatever the scan reads, Pillow opens to the same header."""
    rng = np.random.default_rng(11)
    bases = [READ["jpeg progressive"], READ["png palette, transparent index"], READ["png rgb"]]
    read = 0
    for base in bases:
        variants = [base[:n] for n in range(min(700, len(base)))]
        for _ in range(1000):
            b = bytearray(base)
            at = int(rng.integers(0, min(700, len(b))))
            b[at] = int(rng.integers(0, 256))
            variants.append(bytes(b))
        read += sum(_same_as_pillow(data) for data in variants)
    assert read > 1000  # most one-byte changes in pixel data leave the header readable


def test_the_pixel_limit_is_left_to_pillows_wording():
    data = READ["png rgb"]
    assert scan_header(data, "x", 37 * 21 - 1) is None
    with pytest.raises(ImageError, match="exceeds max_decoded_pixels"):
        open_image(data, "x", 37 * 21 - 1)


def _png_with_filter_method(method: int) -> bytes:
    """`png rgb` with IHDR's filter method byte set (checksum made right again)."""
    data = bytearray(READ["png rgb"])
    data[16 + 11] = method
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def _jpeg_with_precision(bits: int) -> bytes:
    """`jpeg rgb` with its frame's sample precision set to `bits`."""
    data = bytearray(READ["jpeg rgb"])
    data[data.index(b"\xff\xc0") + 4] = bits
    return bytes(data)


@pytest.mark.parametrize(
    "data",
    [_png_with_filter_method(1), _jpeg_with_precision(12)],
    ids=["png filter 1", "jpeg 12-bit"],
)
def test_header_fields_pillow_refuses_are_left_to_it(data):
    """A PNG filter method other than 0 and a JPEG sample precision other than 8
    bits are refused by Pillow: the scan must not read a header from them."""
    assert scan_header(data, "x", LIMIT) is None
    with pytest.raises(ImageError, match="cannot read the"):
        open_image(data, "x", LIMIT)
    # the same files with the usual values are read
    fixed = _png_with_filter_method(0) if data[:4] == b"\x89PNG" else _jpeg_with_precision(8)
    assert _same_as_pillow(fixed)
