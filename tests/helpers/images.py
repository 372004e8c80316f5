"""Small image and shard builders for the image tests: exact PNGs written by
hand (16-bit colour, headers that claim huge sizes), encoded test images, and
WebDataset tar shards."""

from __future__ import annotations

import io
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, bit_depth: int, colour_type: int, rows: bytes | None) -> bytes:
    """A PNG from raw filtered-free rows (None: an IDAT of nothing, for header-only tests)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    data = zlib.compress(rows) if rows is not None else zlib.compress(b"")
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")
    )


def png16(values: np.ndarray) -> bytes:
    """A 16-bit PNG of a uint16 array [H, W] (grey) or [H, W, 3] (RGB), big-endian rows."""
    height, width = values.shape[:2]
    colour_type = 0 if values.ndim == 2 else 2
    rows = b"".join(b"\x00" + values[y].astype(">u2").tobytes() for y in range(height))
    return png(width, height, 16, colour_type, rows)


def encode(im: Image.Image, fmt: str, **options: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    return buf.getvalue()


def noise(height: int, width: int, seed: int, channels: int = 3) -> np.ndarray:
    shape = (height, width, channels) if channels > 1 else (height, width)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def jpeg(height: int, width: int, seed: int = 0, **options: object) -> bytes:
    return encode(Image.fromarray(noise(height, width, seed)), "JPEG", **options)


def write_tar(path: Path, members: list[tuple[str, bytes]], **kw: object) -> Path:
    """A tar of (name, bytes) members in the order given."""
    with tarfile.open(path, "w", **kw) as tar:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
