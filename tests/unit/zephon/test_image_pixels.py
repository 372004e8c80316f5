"""The pixel definition (zephon/images/): decode, the decompression-bomb refusal
before decoding, the decode peak, resize sizes, patch order and the decode canary."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from helpers.images import encode, jpeg, noise, png, png16
from PIL import Image, ImageFile

from zephon.errors import ImageError, RecipeError
from zephon.images import (
    canary_mismatch,
    decode,
    decode_canary,
    from_patches,
    patch_positions,
    prepare_image,
    read_header,
    size_image,
    target_size,
    to_patches,
)
from zephon.images.pixels.canary import CANARY_DIR, CANARY_FILES
from zephon.images.pixels.resize import resize_array
from zephon.recipe.load import parse_recipe
from zephon.schema.recipe import ImageSpec, identity_of

SPEC = ImageSpec()


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


# --------------------------------------------------------------------------- decode


def test_decode_is_deterministic_across_calls_and_threads() -> None:
    blobs = [(CANARY_DIR / n).read_bytes() for n in CANARY_FILES] + [jpeg(90, 130, seed=3)]
    first = [decode(b, f"img{i}", SPEC) for i, b in enumerate(blobs)]
    again = [decode(b, f"img{i}", SPEC) for i, b in enumerate(blobs)]
    with ThreadPoolExecutor(4) as pool:  # many at once on four threads
        threaded = list(pool.map(lambda ib: decode(ib[1], "t", SPEC), enumerate(blobs * 4)))
    for k, a in enumerate(first):
        assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3
        assert np.array_equal(a, again[k])
        for t in threaded[k :: len(blobs)]:
            assert np.array_equal(a, t)


# EXIF orientation -> what displays the stored array
ORIENT = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
    8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation: int) -> None:
    a = noise(5, 8, seed=orientation)
    data = encode(Image.fromarray(a), "PNG", exif=_exif(orientation))  # lossless: exact
    assert np.array_equal(decode(data, "x", SPEC), ORIENT[orientation](a))
    header = read_header(data, "x", SPEC.max_decoded_pixels)
    assert header.size == ((5, 8) if orientation >= 5 else (8, 5))  # displayed (w, h)


def test_exif_rotated_jpeg_is_the_plain_jpeg_rotated() -> None:
    im = Image.fromarray(noise(48, 64, seed=1))
    rotated = encode(im, "JPEG", quality=90, exif=_exif(6))
    plain = encode(im, "JPEG", quality=90)
    assert np.array_equal(decode(rotated, "r", SPEC), np.rot90(decode(plain, "p", SPEC), -1))


def _over(rgb: np.ndarray, alpha: np.ndarray, bg: tuple[int, int, int]) -> np.ndarray:
    c, a = rgb.astype(np.int64), alpha.astype(np.int64)[..., None]
    return ((c * a + np.array(bg) * (255 - a) + 127) // 255).astype(np.uint8)


@pytest.mark.parametrize("bg", [(255, 255, 255), (0, 128, 255)])
def test_alpha_is_composited_over_the_background(bg: tuple[int, int, int]) -> None:
    spec = ImageSpec(background=bg)
    rgba = noise(6, 9, seed=2, channels=4)
    got = decode(encode(Image.fromarray(rgba, "RGBA"), "PNG"), "rgba", spec)
    assert np.array_equal(got, _over(rgba[..., :3], rgba[..., 3], bg))
    la = noise(6, 9, seed=3, channels=2)
    got = decode(encode(Image.fromarray(la, "LA"), "PNG"), "la", spec)
    assert np.array_equal(got, _over(np.repeat(la[..., :1], 3, axis=2), la[..., 1], bg))
    # palette with per-entry alpha (tRNS)
    index = (np.arange(54).reshape(6, 9) % 4).astype(np.uint8)
    palette = np.array([[200, 10, 10], [10, 200, 10], [10, 10, 200], [90, 90, 90]], np.uint8)
    p = Image.fromarray(index, "P")
    p.putpalette(palette.reshape(-1).tolist())
    got = decode(encode(p, "PNG", transparency=bytes([0, 128, 255, 30])), "p", spec)
    alpha = np.array([0, 128, 255, 30], np.uint8)[index]
    assert np.array_equal(got, _over(palette[index], alpha, bg))
    # an RGB image with a transparent colour (tRNS)
    rgb = noise(6, 9, seed=4)
    rgb[2, 3] = (1, 2, 3)
    got = decode(encode(Image.fromarray(rgb), "PNG", transparency=(1, 2, 3)), "t", spec)
    want = rgb.copy()
    want[2, 3] = bg
    assert np.array_equal(got, want)


def test_palette_grey_and_bilevel_become_rgb() -> None:
    index = (np.arange(40).reshape(5, 8) % 3).astype(np.uint8)
    palette = np.array([[1, 2, 3], [250, 128, 0], [9, 99, 199]], np.uint8)
    p = Image.fromarray(index, "P")
    p.putpalette(palette.reshape(-1).tolist())
    assert np.array_equal(decode(encode(p, "PNG"), "p", SPEC), palette[index])
    grey = noise(5, 8, seed=5, channels=1)
    want = np.repeat(grey[..., None], 3, axis=2)
    assert np.array_equal(decode(encode(Image.fromarray(grey, "L"), "PNG"), "g", SPEC), want)
    bits = grey > 128
    got = decode(encode(Image.fromarray(bits), "PNG"), "1", SPEC)
    assert np.array_equal(got, np.repeat(np.where(bits, 255, 0)[..., None], 3, 2))
    cmyk = decode(encode(Image.new("CMYK", (8, 5), (10, 20, 30, 40)), "JPEG"), "c", SPEC)
    assert cmyk.shape == (5, 8, 3) and cmyk.dtype == np.uint8


def test_sixteen_bit_samples_keep_their_high_byte() -> None:
    rng = np.random.default_rng(6)
    grey = rng.integers(0, 65536, (5, 7), dtype=np.uint16)
    got = decode(png16(grey), "g16", SPEC)
    assert np.array_equal(got, np.repeat((grey >> 8).astype(np.uint8)[..., None], 3, axis=2))
    rgb = rng.integers(0, 65536, (5, 7, 3), dtype=np.uint16)
    assert np.array_equal(decode(png16(rgb), "rgb16", SPEC), (rgb >> 8).astype(np.uint8))


def test_full_decode_then_resize_never_a_draft() -> None:
    data = jpeg(600, 800, seed=7, quality=90)
    full = decode(data, "big", SPEC)
    assert full.shape == (600, 800, 3)  # no reduced-size (draft) decode
    small = ImageSpec(max_pixels=28 * 28 * 12)
    out = prepare_image(data, "big", small)
    expected = resize_array(full, target_size(800, 600, small))
    assert np.array_equal(from_patches(out.patches, out.grid, 14, 2), expected)


def test_truncated_and_corrupt_images_name_the_record() -> None:
    data = jpeg(64, 64, seed=8)
    with pytest.raises(ImageError, match=r"shard-7\.tar: key k1: cannot decode the JPEG image"):
        decode(data[: len(data) // 2], "shard-7.tar: key k1", SPEC)
    with pytest.raises(ImageError, match=r"key k2: not an image"):
        decode(b"this is text, not pixels", "key k2", SPEC)
    with pytest.raises(ImageError, match=r"key k3: zero-size image"):
        decode(b"", "key k3", SPEC)
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        with pytest.raises(ImageError, match="LOAD_TRUNCATED_IMAGES"):
            decode(data, "key k4", SPEC)
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False


def test_bombs_are_refused_from_the_header_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads: list[str] = []
    real_load = ImageFile.ImageFile.load

    def counting_load(self: ImageFile.ImageFile) -> object:
        loads.append(self.format or "?")
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counting_load)
    bomb = png(30_000, 20_000, 8, 2, None)  # 600 megapixels claimed, nothing behind it
    with pytest.raises(ImageError, match=r"shard\.tar: key b1: refused before decoding"):
        decode(bomb, "shard.tar: key b1", SPEC)
    big = png(9000, 8000, 8, 2, None)  # 72 MP: above the default 64 MP, below Pillow's limit
    with pytest.raises(ImageError, match=r"key b2: image of 9000 x 8000 = 72000000 pixels"):
        size_image(big, "key b2", SPEC)
    small = jpeg(100, 120, seed=9)
    with pytest.raises(ImageError, match=r"key b3: .*exceeds max_decoded_pixels \(5000\)"):
        prepare_image(small, "key b3", ImageSpec(max_decoded_pixels=5000))
    assert loads == []  # nothing was decoded
    prepare_image(small, "key b4", SPEC)
    assert loads and set(loads) == {"JPEG"}  # the counter does see a decode


def test_decode_peak_is_known_from_the_header() -> None:
    data = jpeg(300, 400, seed=10)
    plan = size_image(data, "x", SPEC)
    assert plan.header.pixels == 120_000
    assert plan.decode_peak_bytes == len(data) + 120_000 * 14  # RGB: 4 stored + 10 working
    webp = encode(Image.fromarray(noise(30, 40, 1, channels=4), "RGBA"), "WEBP")
    assert size_image(webp, "w", SPEC).decode_peak_bytes == len(webp) + 1200 * 22


PEAK = """
import sys
from zephon.images import size_image, prepare_image
from zephon.schema.recipe import ImageSpec

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

data = open(sys.argv[1], "rb").read()
sizing = size_image(data, "x", ImageSpec())
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from the current resident size
before = kib("VmRSS")
prepare_image(data, "x", ImageSpec())
print(kib("VmHWM") - before, sizing.decode_peak_bytes - len(data))
"""


@pytest.mark.parametrize("kind", ["webp_rgba", "png_palette_alpha"])
def test_decode_peak_bounds_the_measured_peak(kind: str, tmp_path: Path) -> None:
    """Peak resident memory of one decode (a fresh process each) stays under the bound."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc to reset and read the peak resident size")
    small = Image.fromarray(noise(150, 200, seed=11))
    big = small.resize((2000, 1500))  # 3 MP
    path = tmp_path / kind
    if kind == "webp_rgba":
        big = big.convert("RGBA")
        big.putalpha(100)
        path.write_bytes(encode(big, "WEBP", quality=60))
    else:
        path.write_bytes(encode(big.convert("P"), "PNG", transparency=3, compress_level=1))
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, check=True
    )
    grew, bound = map(int, proc.stdout.split())
    assert 0 < grew <= bound, (kind, grew, bound)


# --------------------------------------------------------------------------- resize


def test_resize_rounds_to_windows_within_the_budget() -> None:
    assert target_size(56, 84, SPEC) == (56, 84)  # already whole windows
    assert target_size(69, 70, SPEC) == (56, 84)  # 69/28 = 2.46 -> 2; 70/28 = 2.5 -> 3
    assert target_size(100, 3, SPEC) == (112, 28)  # a side of at least one window
    assert target_size(10, 10, SPEC) == (56, 56)  # up to min_pixels (4 windows)
    w, h = target_size(4000, 3000, SPEC)  # down to max_pixels, aspect kept
    assert (w, h) == (1008, 756) and w * h <= SPEC.max_pixels
    assert target_size(20_000, 10, SPEC) == (19_992, 28)  # 714 x 1 windows fit
    assert target_size(40_000, 10, SPEC) == (1024 * 28, 28)  # cut to 1024 windows


def test_resize_bounds_hold_for_any_size() -> None:
    rng = np.random.default_rng(12)
    specs = [
        SPEC,
        ImageSpec(patch_size=16, merge=1, min_pixels=256, max_pixels=256 * 30),
        ImageSpec(min_pixels=28 * 28 * 9, max_pixels=28 * 28 * 10),  # bounds one step apart
    ]
    for spec in specs:
        f = spec.window
        for _ in range(400):
            width, height = (int(v) for v in rng.integers(1, 6000, size=2))
            w, h = target_size(width, height, spec)
            assert w % f == 0 and h % f == 0 and w >= f and h >= f
            assert w * h <= spec.max_pixels
            if w > f and h > f:  # no side held at one window: each within a window of
                # the exact scaled size, so the aspect ratio is kept that closely
                assert (w - f) * height <= width * (h + f)
                assert width * (h - f) <= (w + f) * height
            if spec is SPEC:
                assert w * h >= spec.min_pixels


# --------------------------------------------------------------------------- patches


def test_patch_order_round_trip_and_window_layout() -> None:
    pixels = noise(84, 112, seed=13)  # 6 x 8 patches of 14, 3 x 4 windows of 2 x 2
    patches, grid = to_patches(pixels, 14, 2)
    assert patches.shape == (48, 3 * 14 * 14) and patches.dtype == np.uint8 and grid == (6, 8)
    assert np.array_equal(from_patches(patches, grid, 14, 2), pixels)
    positions = patch_positions(grid, 2)
    assert positions[:8].tolist() == [
        [0, 0],
        [0, 1],
        [1, 0],
        [1, 1],
        [0, 2],
        [0, 3],
        [1, 2],
        [1, 3],
    ]
    for k, (r, c) in enumerate(positions):  # each row: one patch, channel-major
        block = pixels[r * 14 : (r + 1) * 14, c * 14 : (c + 1) * 14]
        assert np.array_equal(patches[k], block.transpose(2, 0, 1).reshape(-1))
    out = prepare_image(encode(Image.fromarray(pixels), "PNG"), "p", SPEC)
    assert out.grid == (6, 8) and out.num_tokens == 12
    assert np.array_equal(out.patches, patches)


# --------------------------------------------------------------------------- canary


def test_canary_is_stable_and_follows_settings_and_decoders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = decode_canary(SPEC)
    again = decode_canary(SPEC)
    assert here == again and len(here["digest"]) == 64
    assert set(here["decoders"]) >= {"pillow", "libjpeg_turbo", "libwebp", "zlib"}
    for changed in (
        ImageSpec(background=(0, 0, 0)),
        ImageSpec(patch_size=16),
        ImageSpec(min_pixels=28 * 28 * 40),
    ):
        assert decode_canary(changed)["digest"] != here["digest"], changed
    # another resampler (as another Pillow build might be): same grids, other patches
    from zephon.images.pixels import resize

    with monkeypatch.context() as m:
        m.setattr(resize, "RESAMPLE", Image.Resampling.BILINEAR)
        assert decode_canary(SPEC)["digest"] != here["digest"]
    # other pixels from the same files (as another decoder build would give) change it
    folder = tmp_path / "canary"
    shutil.copytree(CANARY_DIR, folder)
    img = Image.open(folder / "baseline_420.jpg")
    encode_again = encode(img.transpose(Image.Transpose.FLIP_LEFT_RIGHT), "JPEG")
    (folder / "baseline_420.jpg").write_bytes(encode_again)
    assert decode_canary(SPEC, folder)["digest"] != here["digest"]
    (folder / "baseline_420.jpg").unlink()
    with pytest.raises(Exception, match="baseline_420.jpg: decode canary image missing"):
        decode_canary(SPEC, folder)


def test_canary_mismatch_names_both_machines() -> None:
    here = decode_canary(SPEC)
    assert canary_mismatch(dict(here), here) is None
    there = {**here, "digest": "f" * 64, "decoders": {**here["decoders"], "libjpeg_turbo": "2.1.5"}}
    msg = canary_mismatch(there, here)
    assert msg is not None
    ours = here["decoders"]["libjpeg_turbo"]
    assert f"libjpeg_turbo {ours} here vs 2.1.5 there" in msg
    assert f"pillow {here['decoders']['pillow']}" in msg and "Checkpoint's machine" in msg
    same_versions = {**here, "digest": "0" * 64}
    assert "another build" in str(canary_mismatch(same_versions, here))
    other_settings = {**here, "digest": "0" * 64, "settings": {**here["settings"], "merge": 1}}
    assert "image settings differ" in str(canary_mismatch(other_settings, here))


# --------------------------------------------------------------------------- recipe


def _recipe(tmp_path: Path, image: dict | None) -> dict:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    data: dict = {"source": [{"name": "a", "path": "a.jsonl"}]}
    if image is not None:
        data["image"] = image
    return data


def test_image_table_defaults_identity_and_errors(tmp_path: Path) -> None:
    file = str(tmp_path / "r.toml")
    plain = parse_recipe(_recipe(tmp_path, None), file)
    assert plain.image == ImageSpec() and "image" not in plain.data_identity()
    assert parse_recipe(_recipe(tmp_path, {}), file).digest() == plain.digest()
    same = parse_recipe(_recipe(tmp_path, {"patch_size": 14, "background": "#ffffff"}), file)
    assert same.digest() == plain.digest()  # defaults written out: still unset
    black = parse_recipe(_recipe(tmp_path, {"background": [0, 0, 0], "merge": 1}), file)
    assert black.image.background == (0, 0, 0)
    assert black.data_identity()["image"] == {"merge": 1, "background": (0, 0, 0)}
    assert identity_of(ImageSpec()) == {}
    for bad, match in [
        ({"background": "white"}, r"image\.background: expected \"#rrggbb\""),
        ({"background": [0, 0, 300]}, r"image\.background: expected three integers 0\.\.255"),
        ({"min_pixels": 10**7}, r"image\.min_pixels: expected at most max_pixels"),
        ({"max_pixels": 100}, r"image\.max_pixels: expected at least one merge window"),
        ({"patch_size": 0}, r"image\.patch_size: expected an integer >= 1, got 0"),
        ({"max_decoded_pixels": 10**9}, r"image\.max_decoded_pixels: expected at most"),
        ({"merge": "2"}, r"image\.merge: expected int"),
        ({"colour": 1}, r"\[image\] has unknown key\(s\): colour"),
    ]:
        with pytest.raises(RecipeError, match=match):
            parse_recipe(_recipe(tmp_path, bad), file)


def test_opening_the_three_formats_imports_no_other_pillow_plugin() -> None:
    """A loader's construction opens a WebP (the decode canary): with only Pillow's
    default plugins registered, `Image.open(formats=...)` would import all of them
    first (0.1-0.3 s in every process that reads images). In a fresh interpreter,
    after every canary image is opened and decoded, Pillow is still uninitialised."""
    code = (
        "from PIL import Image\n"
        "from zephon.images.pixels.canary import decode_canary\n"
        "from zephon.schema.recipe import ImageSpec\n"
        "decode_canary(ImageSpec(patch_size=14, merge=2, min_pixels=3136, max_pixels=200704))\n"
        "import sys\n"
        "print(Image._initialized, 'PIL.DdsImagePlugin' in sys.modules, "
        "'PIL.PsdImagePlugin' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False", "False"], out.stdout + out.stderr
