"""A phase's layout refusal points at the table that sets its lane count
(zephon/recipe/phases.py `PhaseTimeline.layout_of`, `Phase.lanes_setting`)."""

from __future__ import annotations

import pytest

from zephon.errors import LayoutError
from zephon.recipe.phases import Phase, PhaseTimeline

NAMES = ("prose", "code")


def phase(name: str | None, start: int, end: int | None, lanes: int, lanes_from: str | None):
    return Phase(name, start, end, 8, 16, lanes, (0.7, 0.3), NAMES, lanes_from)


def layout_refusal(timeline: PhaseTimeline, p: Phase, dp_size: int) -> str:
    with pytest.raises(LayoutError) as info:
        timeline.layout_of(p, dp_size)
    return str(info.value)


def test_too_many_ranks_for_a_phases_lanes_names_where_the_count_is_set():
    first = phase("warm", 0, 4, 8, None)
    own = phase("narrow", 4, 6, 2, "narrow")
    kept = phase("anneal", 6, None, 2, "narrow")
    timeline = PhaseTimeline((first, own, kept), named=True)
    assert layout_refusal(timeline, own, 4) == (
        "phase 'narrow' (from step 4): data-parallel size 4 exceeds the lane count 2: every "
        "rank needs at least one lane; raise `lanes` of [[phase]] 'narrow' to a multiple of 4"
    )
    assert layout_refusal(timeline, kept, 4) == (
        "phase 'anneal' (from step 6): data-parallel size 4 exceeds the lane count 2: every "
        "rank needs at least one lane; raise `lanes` of [[phase]] 'narrow' (phase 'anneal' "
        "keeps its count) to a multiple of 4"
    )
    assert layout_refusal(timeline, phase("late", 6, None, 2, None), 4).endswith(
        "raise [recipe] lanes to a multiple of 4"
    )
    assert timeline.layout_of(first, 4).dp_size == 4
