"""Write the decode canary's test images (assets/images/canary/), once.

The images are committed: the canary hashes how *this machine* decodes these
exact bytes, so they must never be re-encoded by a newer encoder. This script
records how they were made (fixed seeds, fixed encoder settings) and is run
again only to add an image, which changes the canary (bump CANARY_VERSION in
zephon/images/pixels/canary.py). Each image is a few KB and exercises one decoder path:

  baseline_420.jpg     baseline JPEG, 4:2:0 chroma subsampling
  progressive_420.jpg  progressive JPEG, 4:2:0
  palette_alpha.png    8-bit palette PNG with per-entry alpha (tRNS)
  lossy_alpha.webp     lossy WebP with an alpha channel
  exif_rotated.jpg     baseline JPEG with EXIF orientation 6 (rotate 90° clockwise)

Usage: python scripts/tools/make_canary_images.py [--out assets/images/canary] [--force]
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

OUT = Path(__file__).resolve().parents[1] / "assets" / "images" / "canary"


def scene(width: int, height: int, seed: int) -> Image.Image:
    """Gradients, a few shapes and mild noise: edges and texture for the codecs."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [
            x * 255 // max(1, width - 1),
            y * 255 // max(1, height - 1),
            (x + y) * 127 // (width + height),
        ],
        axis=-1,
    )
    noise = rng.integers(-12, 13, size=(height, width, 3))
    im = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(im)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, width - 8)), int(rng.integers(0, height - 8))
        x1, y1 = x0 + int(rng.integers(6, width // 2)), y0 + int(rng.integers(6, height // 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
    return im


def palette_alpha(width: int, height: int, seed: int) -> tuple[Image.Image, bytes]:
    rng = np.random.default_rng(seed)
    index = (np.add.outer(np.arange(height) // 9, np.arange(width) // 9) % 16).astype(np.uint8)
    index[rng.random(index.shape) < 0.05] = 15
    im = Image.fromarray(index, "P")
    im.putpalette([int(c) for c in rng.integers(0, 256, size=16 * 3)])
    alpha = bytes([0, 64, 128, 192] + [255] * 11 + [32])  # transparent to opaque entries
    return im, alpha


def build() -> dict[str, bytes]:
    files: dict[str, bytes] = {}

    def save(name: str, im: Image.Image, fmt: str, **options: object) -> None:
        buf = io.BytesIO()
        im.save(buf, fmt, **options)
        files[name] = buf.getvalue()

    save("baseline_420.jpg", scene(96, 64, 1), "JPEG", quality=88, subsampling=2)
    save(
        "progressive_420.jpg",
        scene(80, 120, 2),
        "JPEG",
        quality=88,
        subsampling=2,
        progressive=True,
    )
    im, alpha = palette_alpha(72, 72, 3)
    save("palette_alpha.png", im, "PNG", transparency=alpha)
    rgba = scene(100, 60, 4).convert("RGBA")
    ramp = np.tile(np.linspace(0, 255, 100).astype(np.uint8), (60, 1))
    rgba.putalpha(Image.fromarray(ramp, "L"))
    save("lossy_alpha.webp", rgba, "WEBP", quality=80, method=4)
    exif = Image.Exif()
    exif[0x0112] = 6
    save("exif_rotated.jpg", scene(64, 96, 5), "JPEG", quality=88, subsampling=2, exif=exif)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--force", action="store_true", help="overwrite existing images")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in build().items():
        path = args.out / name
        if path.exists() and not args.force:
            print(f"{path}: exists, kept (committed bytes are the canary)")
            continue
        path.write_bytes(data)
        print(f"{path}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
