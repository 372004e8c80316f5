"""The schedule's arithmetic on hand-made phases (zephon/recipe/phases.py): which phases
form a segment, which phase and segment a step falls in, how many rows each
lane gave before a step, which step needs a token offset, and how recipe
phase tables resolve."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any

import pytest

from zephon.errors import LayoutError, RecipeError
from zephon.recipe.phases import NEVER, Phase, PhaseTimeline, SegmentSteps, flushes, resolve_phases
from zephon.schema.recipe import PhaseSpec

NAMES = ("prose", "code")


def phase(name: str | None, start: int, end: int | None, **kw: Any) -> Phase:
    kw = {"gbs": 8, "seq": 16, "lanes": 4, "weights": (0.7, 0.3), **kw}
    return Phase(name, start, end, kw["gbs"], kw["seq"], kw["lanes"], kw["weights"], NAMES)


WARM, RAMP = phase("warm", 0, 2), phase("ramp", 2, 4, gbs=16)
LONG = phase("long", 4, 6, seq=32)
ANNEAL = phase("anneal", 6, None, lanes=8, weights=(0.0, 1.0))


def four() -> PhaseTimeline:
    """Built in each test, not at import: the code under test runs inside the test."""
    return PhaseTimeline((WARM, RAMP, LONG, ANNEAL), named=True)


def test_anything_but_the_batch_size_ends_a_segment():
    timeline = four()
    assert not flushes(WARM, RAMP)
    assert flushes(RAMP, LONG) and flushes(LONG, ANNEAL)
    assert flushes(WARM, phase("w", 2, None, weights=(0.5, 0.5)))
    assert flushes(WARM, phase("l", 2, None, lanes=8, gbs=16))
    assert [[p.name for p in s.phases] for s in timeline.segments] == [
        ["warm", "ramp"], ["long"], ["anneal"],
    ]  # fmt: skip
    assert [s.index for s in timeline.segments] == [0, 1, 2]
    again = PhaseTimeline((WARM, RAMP, phase("back", 4, None)), named=True)
    assert [len(s.phases) for s in again.segments] == [3]


def test_rows_each_lane_gave_before_a_step_across_a_batch_size_ramp():
    timeline = four()
    ramp, long, anneal = timeline.segments
    # warm: 8 rows over 4 lanes = 2 a step for 2 steps, then ramp: 4 a step.
    assert [ramp.rows_before(i) for i in range(6)] == [0, 2, 4, 8, 12, 12]
    assert (ramp.end_row, long.end_row, anneal.end_row) == (12, 4, None)
    assert [long.rows_before(i) for i in (4, 5, 6)] == [0, 2, 4]
    assert anneal.rows_before(9) == 3


def test_the_phase_and_segment_of_a_batch_and_of_a_trainer_step():
    timeline = four()
    assert [timeline.phase_of(i).name for i in range(8)] == [
        "warm", "warm", "ramp", "ramp", "long", "long", "anneal", "anneal",
    ]  # fmt: skip
    assert [timeline.phase_at(s).name for s in (0, 1, 2, 3, 5, 7)] == [
        "warm", "warm", "warm", "ramp", "long", "anneal",
    ]  # fmt: skip
    short = PhaseTimeline((phase("a", 0, 1), phase("b", 1, None, gbs=16)), named=True)
    assert [short.phase_at(s).name for s in (0, 1, 2)] == ["a", "a", "b"]
    assert [timeline.segment_of(i).index for i in (0, 3, 4, 5, 6, 100)] == [0, 0, 1, 1, 2, 2]
    assert timeline.segment_of(-1) is timeline.segments[0]
    with pytest.raises(ValueError) as info:
        timeline.segments[1].phase_of(3)
    assert str(info.value) == "batch 3 is before segment 1"


def test_phases_started_and_unfinished_after_some_steps():
    timeline = four()
    names = lambda ps: [p.name for p in ps]  # noqa: E731
    assert [names(timeline.started(n)) for n in (0, 1, 2, 3)] == [
        [], ["warm"], ["warm"], ["warm", "ramp"],
    ]  # fmt: skip
    assert names(timeline.unfinished(0)) == ["warm", "ramp", "long", "anneal"]
    assert names(timeline.unfinished(2)) == ["ramp", "long", "anneal"]
    assert names(timeline.unfinished(100)) == ["anneal"]
    assert (WARM.steps(), RAMP.steps(), ANNEAL.steps()) == (2, 2, None)


def test_layouts_of_the_phases_still_to_come():
    timeline = four()
    assert list(timeline.layouts(2)) == ["warm", "ramp", "long", "anneal"]
    assert list(timeline.layouts(2, from_step=4)) == ["long", "anneal"]
    short = PhaseTimeline((phase("a", 0, 1), phase("b", 1, None, gbs=16)), named=True)
    assert list(short.layouts(2)) == ["a", "b"]
    got = timeline.layouts(2, micro_batch=lambda p: p.global_batch_size // 4)
    assert {n: (lay.dp_size, lay.micro_batch_size) for n, lay in got.items()} == {
        "warm": (2, 2), "ramp": (2, 4), "long": (2, 2), "anneal": (2, 2),
    }  # fmt: skip
    assert timeline.layout_of(ANNEAL, 2).describe() == (
        "lanes=8 dp=2 global_batch=8 rows/lane/step=1 rows/rank=4 micro_batch=4 micro_steps=1 "
        "idle=0.0%"
    )
    assert timeline.layout_of(RAMP, 4, micro_batch=2).micro_steps == 2


def test_micro_batch_tokens_are_whole_rows_of_the_phases_seq_len():
    timeline = four()
    by_tokens = timeline.layout_of(LONG, 2, micro_batch_tokens=64)
    assert by_tokens.describe() == (
        "lanes=4 dp=2 global_batch=8 rows/lane/step=2 rows/rank=4 micro_batch=2 micro_steps=2 "
        "idle=0.0%"
    )
    assert timeline.layout_of(WARM, 2, micro_batch_tokens=16).micro_batch_size == 1
    for tokens in (40, 8):
        with pytest.raises(LayoutError) as info:
            timeline.layout_of(WARM, 2, micro_batch_tokens=tokens)
        assert str(info.value) == (
            f"phase 'warm' (from step 0): micro_batch_tokens {tokens} is not a whole number of "
            "rows of seq_len 16"
        )
    with pytest.raises(LayoutError) as info:  # a recipe without phases: the bare reason
        PhaseTimeline((phase(None, 0, None),), named=False).layout_of(
            phase(None, 0, None), 2, micro_batch_tokens=8
        )
    assert str(info.value) == "micro_batch_tokens 8 is not a whole number of rows of seq_len 16"
    with pytest.raises(LayoutError) as info:
        timeline.layout_of(phase("x", 3, None, lanes=3), 2, max_idle_share=0.5)
    assert str(info.value).startswith(
        "phase 'x' (from step 3): global batch size 8 is not divisible by the lane count 3"
    )


def test_which_step_needs_a_token_offset_of_the_lane():
    timeline = four()
    ramp = SegmentSteps(timeline.segments[0])
    # Rows of 17 tokens: 2 a step (34 tokens) in steps 0-1, 4 (68 tokens) in steps 2-3.
    offsets = (0, 33, 34, 67, 68, 135, 136, 203, 204, 10_000)
    assert [ramp.step_of(o) for o in offsets] == [0, 0, 1, 1, 2, 2, 3, 3, NEVER, NEVER]
    assert [ramp.need_step(o) for o in offsets] == [ramp.step_of(o) for o in offsets]
    held = SegmentSteps(timeline.segments[0], held_rows=2)  # 34 tokens ahead
    assert [held.need_step(o) for o in (10, 34, 68, 102, 203, 204)] == [0, 0, 1, 2, 3, NEVER]
    last = SegmentSteps(timeline.segments[2], held_rows=1)
    assert [last.step_of(o) for o in (0, 16, 17, 170)] == [6, 6, 7, 16]
    assert last.need_step(17) == 6
    assert [ramp.lane_tokens(s) for s in (0, 1, 2, 3)] == [34, 34, 68, 68]
    assert SegmentSteps(timeline.segments[1]).lane_tokens(0) == 66  # from the segment's start


class FakeRecipe:
    path = "r.toml"
    lanes = 4

    def __init__(self, phases: list[PhaseSpec]) -> None:
        self.sources = [
            SimpleNamespace(name="prose", weight=0.7),
            SimpleNamespace(name="code", weight=0.3),
        ]
        self.phases = phases

    def data_identity(
        self, lanes: int, weights: dict[str, float], paths: bool = False
    ) -> dict[str, Any]:
        out = {"weights": weights, "lanes": lanes}  # not in key order: sorted when hashed
        return {**out, "paths": "relative"} if paths else out


def test_a_recipe_without_phases_is_one_phase_of_the_jobs_shape():
    sched = resolve_phases(FakeRecipe([]), 16, 8)
    assert sched.phases == (Phase(None, 0, None, 8, 16, 4, (0.7, 0.3), NAMES),)
    assert sched.named is False and len(sched.segments) == 1
    assert resolve_phases(FakeRecipe([]), 1, 8).phases[0].seq_len == 1
    with pytest.raises(ValueError) as info:
        resolve_phases(FakeRecipe([]), 0, 8)
    assert str(info.value) == "seq_len must be >= 1, got 0"


def test_phase_tables_inherit_what_they_leave_out():
    specs = [
        PhaseSpec("warm", 0, global_batch_size=12),
        PhaseSpec("ramp", 3, global_batch_size=24),
        PhaseSpec("long", 5, seq_len=32, weights=(("code", 1.0),)),
        PhaseSpec("wide", 8, lanes=8),
    ]
    sched = resolve_phases(FakeRecipe(specs), 16, 8)
    assert sched.named is True
    assert sched.phases == (
        Phase("warm", 0, 3, 12, 16, 4, (0.7, 0.3), NAMES),
        Phase("ramp", 3, 5, 24, 16, 4, (0.7, 0.3), NAMES),
        Phase("long", 5, 8, 24, 32, 4, (0.0, 1.0), NAMES),
        Phase("wide", 8, None, 24, 32, 8, (0.0, 1.0), NAMES, lanes_from="wide"),
    )


def test_the_first_phases_shape_has_one_source_of_truth():
    specs = [PhaseSpec("warm", 0, seq_len=32, global_batch_size=12), PhaseSpec("b", 4)]
    for key, job in (("seq_len", (16, 12)), ("global_batch_size", (32, 8))):
        with pytest.raises(RecipeError) as info:
            resolve_phases(FakeRecipe(specs), *job, explicit={key})
        mine = 32 if key == "seq_len" else 12
        theirs = job[0] if key == "seq_len" else job[1]
        assert str(info.value) == (
            f"r.toml: phase 'warm' sets {key} = {mine} but the job sets {key} = {theirs}; set "
            f"the first phase's {key} in one place"
        )
    # Set by the job only by default, or to the same value, or by the job alone: no conflict.
    assert resolve_phases(FakeRecipe(specs), 16, 8).phases[0].seq_len == 32
    resolve_phases(FakeRecipe(specs), 32, 12, explicit={"seq_len", "global_batch_size"})
    plain = [PhaseSpec("warm", 0), PhaseSpec("b", 4)]
    assert resolve_phases(FakeRecipe(plain), 16, 8, explicit={"seq_len"}).phases[0].seq_len == 16


def test_a_phases_identity_is_its_lanes_and_active_weights_hashed_in_key_order():
    recipe = FakeRecipe([])
    blob = json.dumps({"lanes": 8, "weights": {"code": 1.0}}, sort_keys=True).encode()
    assert ANNEAL.identity(recipe) == hashlib.sha256(blob).hexdigest()
    assert ANNEAL.weights_by_name == {"code": 1.0}
