"""The generated image-caption part of the sample corpus (called by
scripts/tools/build_sample_data.py; the VLM caption probe and bench_images draw
their scenes with it too).

Every image is a scene of coloured shapes on a plain background; its caption
says what is there: counts, colours, shapes, and where the first two groups
sit relative to each other ("two red circles above a blue square, on a grey
background"). Sizes and aspect ratios vary (64 to 256 pixels a side), and
images are JPEG or PNG. Everything is drawn from one seeded generator, so a
given Pillow build always writes the same bytes.

Written under the corpus folder:

    images/part-0000{0..3}.tar         WebDataset shards: KEY.jpg or KEY.png,
                                       KEY.txt (the caption), KEY.json
                                       ({"id", "caption", "objects"})
    images_interleaved/part-00000.parquet
                                       interleaved documents (OBELICS style):
                                       `texts` and `images` list columns, a null
                                       in one wherever the other has the segment;
                                       images as {bytes, path} structs
    val/images.tar                     held-out captioned images (never in training)
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

SEED = 20240611
TRAIN_SHARDS = 4
PER_SHARD = 80
VAL_SAMPLES = 48
INTERLEAVED_DOCS = 40
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 40),
    "purple": (140, 60, 180),
    "orange": (245, 140, 30),
}
BACKGROUNDS = {"white": (250, 250, 250), "grey": (150, 150, 150), "black": (15, 15, 15)}
SHAPES = ("circle", "square", "triangle")
NUMBERS = ("no", "a", "two", "three", "four")
SIZES = ((64, 64), (96, 64), (64, 112), (128, 128), (192, 128), (128, 224), (256, 160), (160, 256))


def _draw(
    draw: Any, shape: str, box: tuple[int, int, int, int], fill: tuple[int, int, int]
) -> None:
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=fill)


def _phrase(count: int, colour: str, shape: str) -> str:
    number = "an" if count == 1 and colour[0] in "aeiou" else NUMBERS[count]
    return f"{number} {colour} {shape}{'s' if count > 1 else ''}"


def scene(
    rng: np.random.Generator, sizes: tuple[tuple[int, int], ...] = SIZES
) -> tuple[bytes, str, str, dict[str, Any]]:
    """(encoded image, extension, caption, metadata) of one random scene, of one of
    `sizes` (width, height)."""
    from PIL import Image, ImageDraw

    width, height = sizes[int(rng.integers(len(sizes)))]
    background = str(rng.choice(list(BACKGROUNDS)))
    im = Image.new("RGB", (width, height), BACKGROUNDS[background])
    draw = ImageDraw.Draw(im)
    kinds = int(rng.integers(1, 3))  # one or two (colour, shape) groups
    picks: list[tuple[str, str]] = []
    while len(picks) < kinds:
        pick = (str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES)))
        if pick not in picks:
            picks.append(pick)
    side = max(10, min(width, height) // 5)
    objects, centres, taken = [], [], []
    for colour, shape in picks:
        count = int(rng.integers(1, 4))
        ys = []
        for _ in range(count):
            for _attempt in range(100):  # shapes never overlap, so the counts stay true
                x = int(rng.integers(0, width - side))
                y = int(rng.integers(0, height - side))
                if all(abs(x - a) > side or abs(y - b) > side for a, b in taken):
                    break
            else:
                continue  # no room left: the caption counts what was drawn
            taken.append((x, y))
            _draw(draw, shape, (x, y, x + side, y + side), COLOURS[colour])
            objects.append({"colour": colour, "shape": shape, "x": x, "y": y, "size": side})
            ys.append((x + side / 2, y + side / 2))
        centres.append((np.mean([c[0] for c in ys]), np.mean([c[1] for c in ys]), len(ys)))
    phrases = [_phrase(c[2], *p) for c, p in zip(centres, picks, strict=True)]
    if len(picks) == 2:
        (x0, y0, _), (x1, y1, _) = centres
        if abs(y1 - y0) >= abs(x1 - x0):
            relation = "above" if y0 < y1 else "below"
        else:
            relation = "to the left of" if x0 < x1 else "to the right of"
        caption = f"{phrases[0]} {relation} {phrases[1]}"
    else:
        caption = phrases[0]
    caption = f"{caption[0].upper()}{caption[1:]}, on a {background} background."
    buf = io.BytesIO()
    if rng.random() < 0.6:
        im.save(buf, "JPEG", quality=int(rng.integers(80, 96)))
        ext = "jpg"
    else:
        im.save(buf, "PNG")
        ext = "png"
    return buf.getvalue(), ext, caption, {"objects": objects, "size": [width, height]}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644  # fixed: same bytes every build
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def write_shard(
    path: Path,
    rng: np.random.Generator,
    first: int,
    count: int,
    prefix: str,
    sizes: tuple[tuple[int, int], ...] = SIZES,
) -> int:
    """A WebDataset shard of `count` captioned scenes; returns the sample count."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(first, first + count):
            key = f"{prefix}{i:06d}"
            data, ext, caption, meta = scene(rng, sizes)
            _add(tar, f"{key}.{ext}", data)
            _add(tar, f"{key}.txt", caption.encode("utf-8"))
            record = {"id": key, "caption": caption, **meta}
            _add(tar, f"{key}.json", json.dumps(record, sort_keys=True).encode("utf-8"))
    return count


def write_interleaved(path: Path, rng: np.random.Generator, docs: int) -> int:
    """Parquet of interleaved documents: texts and images in parallel lists."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    all_texts, all_images = [], []
    for d in range(docs):
        texts: list[str | None] = [f"Picture book page {d}."]
        images: list[dict[str, Any] | None] = [None]
        for k in range(int(rng.integers(2, 4))):
            data, ext, caption, _ = scene(rng)
            texts += [None, f"Picture {k + 1}: {caption}"]
            images += [{"bytes": data, "path": None}, None]
        all_texts.append(texts)
        all_images.append(images)
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "id": pa.array([f"book-{d:04d}" for d in range(docs)]),
            "texts": pa.array(all_texts, type=pa.list_(pa.string())),
            "images": pa.array(all_images, type=pa.list_(image)),
        }
    )
    pq.write_table(table, path, row_group_size=16)
    return docs


def build_images(stage: Path) -> dict[str, int]:
    """Write the image part of the corpus under `stage`; {relative path: documents}."""
    rng = np.random.default_rng(SEED)
    counts: dict[str, int] = {}
    for sub in ("images", "images_interleaved", "val"):
        (stage / sub).mkdir(parents=True, exist_ok=True)
    for s in range(TRAIN_SHARDS):
        rel = f"images/part-{s:05d}.tar"
        counts[rel] = write_shard(stage / rel, rng, s * PER_SHARD, PER_SHARD, "train-")
    counts["val/images.tar"] = write_shard(stage / "val/images.tar", rng, 0, VAL_SAMPLES, "val-")
    rel = "images_interleaved/part-00000.parquet"
    counts[rel] = write_interleaved(stage / rel, rng, INTERLEAVED_DOCS)
    return counts
