"""Properties of the size an image is resized to (zephon/images/pixels/resize.py, its rules 1-3).

The expected size is worked out here from the rules as the module's docstring
states them, in exact integer and rational arithmetic of its own (searches, not
integer square roots), for any merge window, pixel budget and image size.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from math import floor

from hypothesis import given
from hypothesis import strategies as st

from zephon.images.pixels.resize import target_size
from zephon.schema.recipe import ImageSpec


@st.composite
def cases(draw: st.DrawFn) -> tuple[ImageSpec, int, int]:
    """Any window (patch x merge) and budget, and an image of up to 64 megapixels (the
    default decode limit). max_pixels is at least one window, not always whole
    windows; min_pixels anywhere up to it, often whole windows or close below
    max_pixels (the bounds a rounding step apart); sides often near whole windows."""
    patch, merge = draw(st.integers(1, 16)), draw(st.integers(1, 3))
    f = patch * merge
    cap = draw(st.integers(1, 1500))
    most = f * f * cap + draw(st.integers(0, f * f - 1))
    least = draw(
        st.integers(1, most)
        | st.integers(1, cap).map(lambda k: k * f * f)
        | st.integers(max(1, most - 2 * f * f), most)
    )
    spec = ImageSpec(patch_size=patch, merge=merge, min_pixels=least, max_pixels=most)
    near = st.builds(lambda k, d: max(1, k * f + d), st.integers(0, 8000 // f), st.integers(-1, 1))
    width, height = (draw(st.integers(1, 8000) | near) for _ in range(2))
    return spec, width, height


def search(ok: Callable[[int], bool], lo: int = 0) -> int:
    """The largest k >= lo with ok(k), ok being true up to a point and false after."""
    hi = lo + 1
    while ok(hi):
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def shrunk(width: int, height: int, f: int, most: int) -> tuple[int, int]:
    """Rule 2 in windows: each side floor(side * s / f), s^2 = most / (width * height),
    at least one window; a side at one window cuts the other to what fits."""
    cap = most // (f * f)
    w = max(1, search(lambda k: (k * f) ** 2 * height <= most * width))
    h = max(1, search(lambda k: (k * f) ** 2 * width <= most * height))
    if h == 1:
        w = min(w, cap)
    elif w == 1:
        h = min(h, cap)
    return w, h


def grown(width: int, height: int, f: int, least: int) -> tuple[int, int]:
    """Rule 3 in windows: each side ceil(side * s / f), s^2 = least / (width * height)."""
    w = search(lambda k: (k * f) ** 2 * height < least * width) + 1
    h = search(lambda k: (k * f) ** 2 * width < least * height) + 1
    return w, h


def rounded(width: int, height: int, f: int) -> tuple[int, int]:
    """Rule 1 in windows: each side to the nearest whole number, halves up, at least one."""
    w, h = (max(1, floor(Fraction(side, f) + Fraction(1, 2))) for side in (width, height))
    return w, h


def expected(width: int, height: int, spec: ImageSpec) -> tuple[int, int]:
    f, least, most = spec.window, spec.min_pixels, spec.max_pixels
    w, h = rounded(width, height, f)
    if w * h * f * f > most:
        w, h = shrunk(width, height, f, most)
    elif w * h * f * f < least:
        w, h = grown(width, height, f, least)
        if w * h * f * f > most:  # the bounds within a rounding step: rule 2's size
            w, h = shrunk(width, height, f, most)
    return w * f, h * f


@given(cases())
def test_the_size_follows_the_three_rules(case):
    spec, width, height = case
    assert target_size(width, height, spec) == expected(width, height, spec)


# Each rule on its own, its bounds included: budgets drawn around the image's rule-1 area.
images = st.tuples(
    st.integers(1, 16), st.integers(1, 3), st.integers(1, 3000), st.integers(1, 3000)
)


def spec_of(patch: int, merge: int, least: int, most: int) -> ImageSpec:
    return ImageSpec(patch_size=patch, merge=merge, min_pixels=least, max_pixels=most)


@given(images, st.data())
def test_rule_1s_size_is_kept_within_the_budget_bounds_included(image, data):
    patch, merge, width, height = image
    f = patch * merge
    w, h = rounded(width, height, f)
    area = w * h * f * f
    least = data.draw(st.just(area) | st.integers(1, area))
    most = data.draw(st.just(area) | st.integers(area, 4 * area))
    assert target_size(width, height, spec_of(patch, merge, least, most)) == (w * f, h * f)


@given(images, st.data())
def test_over_max_pixels_both_sides_scale_down_by_rule_2(image, data):
    patch, merge, width, height = image
    f = patch * merge
    w, h = rounded(width, height, f)
    if w * h == 1:
        return  # one window is the least max_pixels there is
    most = data.draw(st.integers(f * f, w * h * f * f - 1))
    least = data.draw(st.integers(1, most))
    got = target_size(width, height, spec_of(patch, merge, least, most))
    assert got == tuple(side * f for side in shrunk(width, height, f, most))


@given(images, st.data())
def test_under_min_pixels_both_sides_scale_up_by_rule_3_or_down_past_max(image, data):
    """Scaled up to min_pixels; where that passes max_pixels (the bounds a rounding
    step apart), rule 2's size instead."""
    patch, merge, width, height = image
    f = patch * merge
    w, h = rounded(width, height, f)
    least = data.draw(st.integers(w * h * f * f + 1, 4 * w * h * f * f))
    gw, gh = grown(width, height, f, least)
    grown_area = gw * gh * f * f  # often just above or below max_pixels
    most = data.draw(
        st.integers(max(least, grown_area - f * f), grown_area) | st.integers(least, 2 * grown_area)
    )
    got = target_size(width, height, spec_of(patch, merge, least, most))
    if grown_area <= most:
        assert got == (gw * f, gh * f)
    else:
        assert got == tuple(side * f for side in shrunk(width, height, f, most))


@given(cases())
def test_whole_windows_within_the_budget_and_the_aspect_ratio_kept(case):
    spec, width, height = case
    f, least, most = spec.window, spec.min_pixels, spec.max_pixels
    w, h = target_size(width, height, spec)
    assert w % f == 0 and h % f == 0 and w >= f and h >= f
    assert w * h <= most  # never exceeded
    if w * h < least:  # only after rule 2 (the image rounded past max_pixels), or
        # where growing to min_pixels would pass max_pixels (the bounds a step apart)
        rw, rh = rounded(width, height, f)
        gw, gh = grown(width, height, f, least)
        assert rw * rh * f * f > most or gw * gh * f * f > most
    if w > f and h > f:  # no side held at one window: within a window of one scale
        assert (w - f) * height <= width * (h + f)
        assert width * (h - f) <= (w + f) * height


@given(cases())
def test_width_and_height_are_treated_alike(case):
    spec, width, height = case
    w, h = target_size(width, height, spec)
    assert target_size(height, width, spec) == (h, w)


@given(st.integers(1, 16), st.integers(1, 3), st.integers(0, 60), st.integers(0, 60), st.data())
def test_exact_halves_round_up_on_both_sides(half, merge, kw, kh, data):
    """A side of k and a half windows becomes k + 1 windows, width as height, when
    that is within the budget (rule 1 alone)."""
    f = 2 * half * merge  # an even window, so half a window is whole pixels
    spec = ImageSpec(patch_size=2 * half, merge=merge, min_pixels=1,
                     max_pixels=f * f * (kw + 1) * (kh + 1))  # fmt: skip
    width = kw * f + f // 2
    other = data.draw(st.sampled_from([kh * f + f // 2, (kh + 1) * f]))
    assert target_size(width, other, spec) == ((kw + 1) * f, (kh + 1) * f)
    assert target_size(other, width, spec) == ((kh + 1) * f, (kw + 1) * f)
