"""Each phase's seq_len must fit the largest image `[image]` allows
(zephon/recipe/phases.py `images_too_long`): its placeholder tokens plus start and end
in one row of seq_len + 1 tokens. The message names the phase, the tokens needed, the
seq_len that fits them and the max_pixels that would fit the phase's seq_len."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from zephon.recipe.phases import Phase, PhaseTimeline, images_too_long
from zephon.schema.recipe import ImageSpec

NAMES = ("prose", "photos")


def small_image(max_pixels: int = 10 * 16) -> ImageSpec:
    """4 x 4-pixel merge windows: max_pixels / 16 placeholder tokens at most."""
    return ImageSpec(patch_size=2, merge=2, min_pixels=16, max_pixels=max_pixels)


def recipe(image: ImageSpec, multimodal: bool = True) -> Any:
    sources = [
        SimpleNamespace(name="prose", multimodal=False),
        SimpleNamespace(name="photos", multimodal=multimodal),
    ]
    return SimpleNamespace(sources=sources, image=image)


def phase(name: str | None, start: int, end: int | None, seq_len: int) -> Phase:
    return Phase(name, start, end, 8, seq_len, 4, (0.5, 0.5), NAMES)


def test_the_largest_image_needs_its_placeholders_plus_start_and_end_in_one_row():
    # 10 placeholders + start + end = 12 tokens: a row of seq_len + 1 >= 12 holds them.
    timeline = PhaseTimeline(
        (phase("fits", 0, 3, 11), phase("short", 3, 5, 10), phase("also", 5, None, 11)),
        named=True,
    )
    assert images_too_long(recipe(small_image()), timeline) == [
        "phase 'short' (from step 3): seq_len 10 is too short for the largest image [image] "
        "allows: 10 placeholder tokens (max_pixels 160, one per 4 x 4 pixels) + start and end "
        "= 12 tokens, which need seq_len >= 11; raise the seq_len, or lower [image] max_pixels "
        "to at most 144"
    ]


def test_every_phase_that_is_too_short_is_named_after_one_that_fits():
    timeline = PhaseTimeline(
        (phase("long", 0, 2, 64), phase("a", 2, 4, 9), phase("b", 4, None, 1)), named=True
    )
    found = images_too_long(recipe(small_image()), timeline)
    assert [m.split(":")[0] for m in found] == [
        "phase 'a' (from step 2)",
        "phase 'b' (from step 4)",
    ]
    assert found[0].endswith("need seq_len >= 11; raise the seq_len, or lower [image] "
                             "max_pixels to at most 128")  # fmt: skip
    # The suggestion never goes below one merge window, the least max_pixels allowed.
    assert found[1].endswith("max_pixels to at most 16")


def test_a_recipe_without_phases_is_named_as_the_recipe():
    timeline = PhaseTimeline((phase(None, 0, None, 8),), named=False)
    assert images_too_long(recipe(small_image()), timeline) == [
        "the recipe: seq_len 8 is too short for the largest image [image] allows: 10 "
        "placeholder tokens (max_pixels 160, one per 4 x 4 pixels) + start and end = 12 "
        "tokens, which need seq_len >= 11; raise the seq_len, or lower [image] max_pixels to "
        "at most 112"
    ]


def test_the_suggested_max_pixels_makes_the_phase_fit():
    for seq_len in (2, 5, 10):  # from 2 on: a row of 3 tokens holds a one-window image
        timeline = PhaseTimeline((phase("p", 0, None, seq_len),), named=True)
        (message,) = images_too_long(recipe(small_image()), timeline)
        fits = int(message.rsplit(" ", 1)[1])
        assert images_too_long(recipe(small_image(fits)), timeline) == []
        assert images_too_long(recipe(small_image(fits + 16)), timeline) != []


def test_a_text_recipe_has_no_image_to_fit():
    timeline = PhaseTimeline((phase("p", 0, None, 1),), named=True)
    assert images_too_long(recipe(small_image(), multimodal=False), timeline) == []
    assert images_too_long(recipe(small_image(), multimodal=True), timeline) != []
