"""The generated image-caption part of the sample corpus (called by
scripts/tools/build_sample_data.py; the VLM caption probe and bench_images draw
their scenes with it too).

Every image is a scene of coloured shapes on a plain background; its caption
says what is there: counts, colours, shapes, and where the first two groups
sit relative to each other ("two red circles above a blue square, on a grey
background"). Sizes and aspect ratios vary (64 to 256 pixels a side), and
images are JPEG or PNG. Everything is drawn from one seeded generator, so a
given Pillow build always writes the same bytes.

`photo` draws photograph-like JPEGs instead (bench_images' photos corpus, not
the sample data): multi-scale texture, a horizon, shaded blobs and sensor
noise, 360 to 1,000 pixels a side, 20 to 300 KB each (80 on average), so decoding
costs what it costs on photographs rather than on flat colours.

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
from collections.abc import Callable
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


# Photograph-like images (`photo`): (width, height), landscape and portrait, as
# cameras and phones crop them; most are above bench_images' pixel budget, so
# they are resized as well as decoded, as photographs are.
PHOTO_SIZES = (
    (1000, 750), (750, 1000), (1000, 667), (667, 1000), (1000, 563), (1000, 400),
    (800, 600), (600, 800), (640, 480), (480, 640), (512, 512), (480, 360), (360, 480),
)  # fmt: skip
# The two tones either side of the horizon.
TONES = {
    "sky blue": (110, 160, 215),
    "sand": (215, 190, 140),
    "forest green": (50, 110, 60),
    "slate grey": (100, 110, 120),
    "ochre": (200, 150, 60),
    "teal": (40, 130, 130),
    "dusk purple": (110, 80, 140),
    "brick": (150, 70, 50),
}


def _upsample(a: np.ndarray, width: int, height: int) -> np.ndarray:
    """[C, h, w] float32 -> [C, height, width], bicubic, channel by channel."""
    from PIL import Image

    return np.stack(
        [np.asarray(Image.fromarray(c, "F").resize((width, height), Image.BICUBIC)) for c in a]
    )


def photo(
    rng: np.random.Generator, sizes: tuple[tuple[int, int], ...] = PHOTO_SIZES
) -> tuple[bytes, str, str, dict[str, Any]]:
    """(JPEG bytes, "jpg", caption, metadata) of one photograph-like image of one
    of `sizes`: two tones split by a wavy horizon, one to four shaded blobs of
    named colours, multi-scale texture and sensor noise, JPEG quality 70 to 95.
    Same seed, numpy and Pillow: same bytes."""
    from PIL import Image

    width, height = sizes[int(rng.integers(len(sizes)))]
    quality = int(rng.integers(70, 96))
    grain = float(rng.uniform(1.5, 5.0))  # sensor noise sigma at mid-grey, in levels
    decay = float(rng.uniform(0.66, 0.82))  # texture per octave: smooth sky .. foliage
    # Everything but the per-pixel noise is drawn at half size and upsampled once:
    # a quarter of the work, and a real lens does not resolve single pixels either.
    w, h = (width + 1) // 2, (height + 1) // 2
    # Texture: a noise pyramid from 4 cells across up to half size, each octave
    # `decay` times the one above (roughly the 1/f spectrum of natural images).
    gw, gh = max(2, round(4 * w / max(w, h))), max(2, round(4 * h / max(w, h)))
    amp = 35.0
    tex = rng.standard_normal((3, gh, gw), dtype=np.float32) * amp
    while gw < w or gh < h:
        gw, gh = min(w, gw * 2), min(h, gh * 2)
        amp *= decay
        tex = _upsample(tex, gw, gh) + rng.standard_normal((3, gh, gw), dtype=np.float32) * amp
    lum = tex.mean(0, keepdims=True)
    tex = lum + 0.3 * (tex - lum)  # colour varies far less than brightness in photographs
    y = np.arange(h, dtype=np.float32)[:, None]
    x = np.arange(w, dtype=np.float32)[None, :]
    top, bottom = (str(t) for t in rng.choice(list(TONES), 2, replace=False))
    rise = rng.uniform(0.3, 0.7) * h
    line = rise + 0.05 * h * np.sin(x / w * rng.uniform(2, 9) + rng.uniform(0, 6))
    below = np.clip((y - line) / 1.5, -1, 1) * 0.5 + 0.5  # a 3-pixel edge, in focus
    tone = [np.array(TONES[t], np.float32)[:, None, None] for t in (top, bottom)]
    img = tone[0] * (1 - below) + tone[1] * below + (1 - below) * (y / h * 30 - 15)
    objects: list[dict[str, Any]] = []
    for _ in range(int(rng.integers(1, 5))):
        colour = str(rng.choice(list(COLOURS)))
        cx, cy = float(rng.uniform(0, w)), float(rng.uniform(0, h))
        rx, ry = (float(r) for r in rng.uniform(0.05, 0.25, 2) * min(w, h))
        # only the blob's box is computed: its mask is zero outside
        x0, x1 = max(0, int(cx - rx)), min(w, int(cx + rx) + 2)
        y0, y1 = max(0, int(cy - ry)), min(h, int(cy + ry) + 2)
        bx, by = x[:, x0:x1], y[y0:y1]
        d = np.sqrt(((bx - cx) / rx) ** 2 + ((by - cy) / ry) ** 2)
        mask = np.clip((1 - d) * min(rx, ry) / 1.5, 0, 1)  # in focus too
        base = np.array(COLOURS[colour], np.float32) + rng.uniform(-20, 20, 3)
        shade = base[:, None, None] * (1.15 - 0.3 * np.clip(d, 0, 1))  # lit centre, dark rim
        img[:, y0:y1, x0:x1] = img[:, y0:y1, x0:x1] * (1 - mask) + shade * mask
        objects.append({"colour": colour, "shape": "blob", "x": 2 * cx, "y": 2 * cy,
                        "size": [4 * rx, 4 * ry]})  # fmt: skip
    half = np.clip(img + tex, 0, 255).astype(np.uint8).transpose(1, 2, 0)
    full = Image.fromarray(np.ascontiguousarray(half)).resize((width, height), Image.BICUBIC)
    pixels = np.asarray(full, dtype=np.float32)
    # Sensor noise, per pixel and channel, stronger in bright parts (shot noise): what
    # makes a photograph's JPEG large, and what the smooth parts above cannot give.
    pixels += rng.standard_normal(pixels.shape, dtype=np.float32) * (
        grain * np.sqrt(pixels / 128 + 0.1)
    )
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    counts: dict[str, int] = {}
    for o in objects:
        counts[o["colour"]] = counts.get(o["colour"], 0) + 1
    groups = [_phrase(n, c, "blob") for c, n in counts.items()]
    blobs = groups[0] if len(groups) == 1 else f"{', '.join(groups[:-1])} and {groups[-1]}"
    noise = "fine" if grain < 3 else "visible" if grain < 4.5 else "heavy"
    caption = f"{blobs[0].upper()}{blobs[1:]} against {top} above {bottom}, with {noise} grain."
    meta = {"objects": objects, "size": [width, height], "quality": quality, "grain": grain,
            "tones": [top, bottom]}  # fmt: skip
    return buf.getvalue(), "jpg", caption, meta


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
    make: Callable[..., tuple[bytes, str, str, dict[str, Any]]] | None = None,
) -> int:
    """A WebDataset shard of `count` captioned images; returns the sample count.
    `make(rng, sizes)` draws one (default `scene`; `photo` for photograph-like ones)."""
    make = make or scene
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(first, first + count):
            key = f"{prefix}{i:06d}"
            data, ext, caption, meta = make(rng, sizes)
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
