"""`[image] decode = "reduced"` (images/pixels/decode.py, rule 1): a JPEG at least
twice its target size a side is decoded at a DCT scale, to no less than the
target, then resized to the same grid as the exact decode; other pixels, the
same every time. It is part of the recipe's identity only when set, and a
resume across the two is refused naming it (the loader's own check:
integration/zephon/test_image_loader.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.images import encode, jpeg, noise
from PIL import Image

from zephon import RecipeError, load_recipe
from zephon.errors import StateError
from zephon.images.header import open_image
from zephon.images.pixels.decode import decode_image
from zephon.images.pixels.resize import target_size
from zephon.images.prepare import prepare_image
from zephon.schema.recipe import ImageSpec
from zephon.state.checkpoint_state import check_fingerprint

EXACT = ImageSpec(max_pixels=200_704)  # about 448 x 448: photographs are larger
REDUCED = ImageSpec(max_pixels=200_704, decode="reduced")


def _decoded_size(data: bytes, spec: ImageSpec) -> tuple[int, int]:
    opened = open_image(data, "a.jpg", spec.max_decoded_pixels)
    target = target_size(*opened[1].size, spec)
    return decode_image(data, "a.jpg", spec, opened, target).size


def test_a_large_jpeg_decodes_a_quarter_of_its_pixels_to_the_same_grid():
    # 1035 x 910, target 476 x 420. (Its 1/2 scale, 518 x 455, would have a target
    # of its own of 476 x 392: the target must come from the header.)
    data = jpeg(910, 1035, seed=3, quality=90)
    assert _decoded_size(data, EXACT) == (1035, 910)
    assert _decoded_size(data, REDUCED) == (518, 455)  # 1/2 scale: still >= the target
    exact, reduced = prepare_image(data, "a", EXACT), prepare_image(data, "a", REDUCED)
    assert reduced.grid == exact.grid and reduced.num_tokens == exact.num_tokens
    assert not np.array_equal(reduced.patches, exact.patches)  # other pixels
    again = prepare_image(data, "a", REDUCED)
    assert np.array_equal(again.patches, reduced.patches)  # the same every time
    # and close to the exact ones: the same picture
    diff = np.abs(reduced.patches.astype(int) - exact.patches.astype(int))
    assert diff.mean() < 20, diff.mean()


def test_the_scale_follows_the_displayed_orientation():
    """Stored 1600 x 800, displayed 800 x 1600 (EXIF orientation 6): the target is
    for the displayed shape; the scale keeps the stored image above it."""
    exif = Image.Exif()
    exif[0x0112] = 6
    data = encode(Image.fromarray(noise(800, 1600, 5)), "JPEG", quality=90, exif=exif.tobytes())
    exact, reduced = prepare_image(data, "r", EXACT), prepare_image(data, "r", REDUCED)
    assert exact.grid[0] > exact.grid[1]  # taller than wide, as displayed
    assert reduced.grid == exact.grid
    assert _decoded_size(data, REDUCED) == (400, 800)  # displayed, after 1/2 scale


@pytest.mark.parametrize("kind", ["small jpeg", "large png"])
def test_what_cannot_be_reduced_keeps_the_exact_pixels(kind):
    """A JPEG under twice its target a side has no smaller scale to keep; other
    formats have no DCT scaling."""
    if kind == "small jpeg":
        data = jpeg(500, 700, seed=1)
    else:
        data = encode(Image.fromarray(noise(900, 1200, 2)), "PNG")
    exact, reduced = prepare_image(data, "s", EXACT), prepare_image(data, "s", REDUCED)
    assert np.array_equal(reduced.patches, exact.patches)


def _recipe(tmp_path, image: str) -> str:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    path = tmp_path / "r.toml"
    path.write_text(
        f'[recipe]\nname = "r"\nseed = 1\nlanes = 2\n[image]\n{image}\n'
        f'[[source]]\nname = "a"\npath = "{tmp_path}/a.jsonl"\n'
    )
    return str(path)


def test_the_setting_is_part_of_the_recipe_only_when_set(tmp_path):
    plain = load_recipe(_recipe(tmp_path, "")).digest()
    assert load_recipe(_recipe(tmp_path, 'decode = "exact"')).digest() == plain
    reduced = load_recipe(_recipe(tmp_path, 'decode = "reduced"'))
    assert reduced.image.decode == "reduced" and reduced.digest() != plain


def test_another_value_is_one_line_naming_it(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(_recipe(tmp_path, 'decode = "fast"'))
    message = str(err.value)
    assert "[image] decode" in message or "image.decode" in message, message
    assert "expected one of exact, reduced; got 'fast'" in message and "\n" not in message


@pytest.mark.parametrize(("saved", "now"), [("exact", "reduced"), ("reduced", "exact")])
def test_a_resume_across_the_two_is_refused_by_name(saved, now):
    def fingerprint(decode: str) -> dict:
        return {
            "seed": 1,
            "recipe": f"digest-{decode}",
            **({"image.decode": decode} if decode != "exact" else {}),
        }

    with pytest.raises(StateError) as err:
        check_fingerprint(fingerprint(saved), fingerprint(now))
    lines = str(err.value).splitlines()
    assert f"  image.decode: checkpoint has '{saved}', this run has '{now}'" == lines[1], lines
