"""Properties of the phase schedule (DESIGN §12, docs/design.md §12, zephon/recipe/phases.py).

For any list of `[[phase]]` tables: each phase's settings are the last ones set by
it or before it; the phase of a batch is the last one started by it; segments are
the runs of phases that change only the batch size, and a lane's rows and tokens
are counted batch by batch here; editing a phase changes nothing before it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchtitan.datasets.phase_timeline import DataTimeline
from zephon import LayoutError
from zephon.recipe.phases import NEVER, Phase, PhaseTimeline, SegmentSteps, resolve_phases
from zephon.schema.recipe import PhaseSpec, Recipe, SourceSpec

NAMES = ("prose", "code", "math")
LANES = (1, 2, 3, 4, 6, 12)  # every global batch below is a multiple of 12: whole rows per lane


def recipe_of(lanes: int, specs: tuple[PhaseSpec, ...]) -> Recipe:
    sources = tuple(
        SourceSpec(name=n, paths=(f"/data/{n}.jsonl",), format="jsonl", weight=w)
        for n, w in zip(NAMES, (0.5, 0.3, 0.2), strict=True)
    )
    return Recipe("/data/recipe.toml", "props", 7, lanes, sources, phases=specs)


# A phase's weights table: unset (None), or some sources' weights (the others paused).
weights = st.tuples(*[st.sampled_from([None, 0.0, 0.5, 1.0])] * len(NAMES)).map(
    lambda ws: tuple((n, w) for n, w in zip(NAMES, ws, strict=True) if w is not None) or None
)


@st.composite
def specs(draw: st.DrawFn, first_start: int = 0, count: tuple[int, int] = (1, 5)) -> tuple:
    """[[phase]] tables in step order from `first_start`: about half are batch-size
    ramps (one segment goes on), the others set any settings."""
    n = draw(st.integers(*count))
    gaps = draw(st.lists(st.integers(1, 6), min_size=n, max_size=n))
    starts = [first_start + sum(gaps[1:i + 1]) for i in range(n)]  # fmt: skip
    tag = draw(st.sampled_from("pqr"))
    out = []
    for i, start in enumerate(starts):
        gbs = draw(st.none() | st.sampled_from([12, 24, 36, 72]))
        spec = PhaseSpec(f"{tag}{first_start}_{i}", start, global_batch_size=gbs)
        if draw(st.booleans()):  # not only a ramp
            spec = replace(
                spec,
                weights=draw(weights),
                seq_len=draw(st.none() | st.integers(1, 9)),
                lanes=draw(st.none() | st.sampled_from(LANES)),
            )
        out.append(spec)
    return tuple(out)


@st.composite
def schedules(draw: st.DrawFn) -> tuple[Recipe, PhaseTimeline, int, int]:
    recipe = recipe_of(draw(st.sampled_from(LANES)), draw(st.just(()) | specs()))
    seq, gbs = draw(st.integers(1, 9)), draw(st.sampled_from([12, 24, 48]))
    return recipe, resolve_phases(recipe, seq, gbs), seq, gbs


def last_set(specs: tuple[PhaseSpec, ...], i: int, key: str, default: object) -> object:
    return next((getattr(s, key) for s in reversed(specs[: i + 1]) if getattr(s, key)), default)


@given(schedules())
def test_each_phase_keeps_every_setting_it_does_not_set(case):
    recipe, timeline, seq, gbs = case
    base = tuple(s.weight for s in recipe.sources)
    specs = recipe.phases or (PhaseSpec(None, 0),)  # type: ignore[arg-type]
    assert timeline.named == bool(recipe.phases)
    want = []
    for i, spec in enumerate(specs):
        given_w = last_set(specs, i, "weights", None)
        w = base if given_w is None else tuple(dict(given_w).get(n, 0.0) for n in NAMES)
        end = specs[i + 1].start_step if i + 1 < len(specs) else None
        lanes = last_set(specs, i, "lanes", recipe.lanes)
        # the phase whose table set the lane count (None: [recipe] lanes)
        setters = [p.name for p in specs[: i + 1] if p.lanes is not None]
        lanes_from = setters[-1] if setters else None
        g, s = last_set(specs, i, "global_batch_size", gbs), last_set(specs, i, "seq_len", seq)
        want.append(Phase(spec.name, spec.start_step, end, g, s, lanes, w, NAMES, lanes_from))
    assert timeline.phases == tuple(want)


@given(schedules())
def test_the_phase_of_a_step_is_the_last_one_started_by_it(case):
    _, timeline, _, _ = case
    phases = timeline.phases
    for index in range(phases[-1].start_step + 4):
        want = [p for p in phases if p.start_step <= index][-1]
        assert timeline.phase_of(index) == want
        assert timeline.phase_at(index + 1) == want  # the trainer's step, counted from 1
        assert timeline.segment_of(index).phase_of(index) == want
        assert timeline.started(index) == tuple(p for p in phases if p.start_step < index)
        assert timeline.unfinished(index) == tuple(
            p for p in phases if p.end_step is None or p.end_step > index
        )
    assert timeline.phase_at(0) == phases[0]


@given(schedules())
def test_segments_are_the_runs_of_phases_that_change_only_the_batch_size(case):
    _, timeline, _, _ = case
    segs = timeline.segments
    assert [p for seg in segs for p in seg.phases] == list(timeline.phases)
    assert [seg.index for seg in segs] == list(range(len(segs)))
    for seg in segs:
        assert len({(p.lanes, p.seq_len, p.weights) for p in seg.phases}) == 1
        assert (seg.lanes, seg.seq_len, seg.row_len) == (
            seg.first.lanes,
            seg.first.seq_len,
            seg.first.seq_len + 1,
        )
    for a, b in zip(segs, segs[1:], strict=False):
        x, y = a.phases[-1], b.first
        assert (x.lanes, x.seq_len, x.weights) != (y.lanes, y.seq_len, y.weights)
        assert a.end_step == b.start_step


def lane_batches(timeline: PhaseTimeline, seg_index: int, beyond: int) -> list[tuple[int, int]]:
    """(batch index, rows each lane gives to it) for the segment's batches, counted
    one by one; `beyond` batches past the start of an endless last segment."""
    seg = timeline.segments[seg_index]
    end = seg.end_step if seg.end_step is not None else seg.phases[-1].start_step + beyond
    return [
        (b, timeline.phase_of(b).global_batch_size // timeline.phase_of(b).lanes)
        for b in range(seg.start_step, end)
    ]


@given(schedules(), st.integers(0, 4))
def test_rows_before_a_batch_and_the_boundary_row_add_up_batch_by_batch(case, beyond):
    _, timeline, _, _ = case
    for seg in timeline.segments:
        batches = lane_batches(timeline, seg.index, beyond)
        for k, (b, _) in enumerate(batches):
            assert seg.rows_before(b) == sum(rows for _, rows in batches[:k])
        total = sum(rows for _, rows in batches)
        assert seg.end_row == (None if seg.end_step is None else total)
        if seg.end_step is not None:
            assert seg.rows_before(seg.end_step) == total


@given(schedules(), st.integers(0, 3), st.data())
def test_the_step_of_a_lane_token_is_the_batch_whose_rows_hold_it(case, held, data):
    _, timeline, _, _ = case
    seg = data.draw(st.sampled_from(timeline.segments))
    steps = SegmentSteps(seg, held_rows=held)
    owner = []  # the batch of every token of the lane's stream, in order
    for b, rows in lane_batches(timeline, seg.index, 3):
        owner += [b] * (rows * seg.row_len)
        assert steps.lane_tokens(b) == rows * seg.row_len
    assert steps.lane_tokens(seg.start_step - 1) == steps.lane_tokens(seg.start_step)
    # Each batch's first and last token (where an off-by-one shows), and a few more.
    edges = [i for i in range(len(owner)) if i == 0 or owner[i] != owner[i - 1]]
    edges += [i - 1 for i in edges[1:]] + [len(owner) - 1, len(owner)]
    more = data.draw(st.lists(st.integers(0, len(owner) + 20), max_size=8))
    for offset in edges + more:
        if offset < len(owner):
            back = max(0, offset - held * seg.row_len)
            assert steps.step_of(offset) == owner[offset]
            assert steps.need_step(offset) == owner[back]
        elif seg.end_step is not None:
            assert steps.step_of(offset) == steps.need_step(offset) == NEVER


def summary(p: Phase) -> tuple:
    return (p.name, p.start_step, p.global_batch_size, p.seq_len, p.lanes, p.weights)


@given(schedules(), st.data())
def test_editing_a_later_phase_changes_nothing_before_it(case, data):
    """Prefix stability: phases k.. replaced (settings, start steps, how many, or
    none) leave every batch before both versions' phase k as it was."""
    recipe, timeline, seq, gbs = case
    phases = recipe.phases
    if len(phases) < 2:
        return
    k = data.draw(st.integers(1, len(phases) - 1))
    tail = data.draw(st.just(()) | specs(phases[k - 1].start_step + 1, (1, 3)))
    edited = replace(recipe, phases=phases[:k] + tail)
    other = resolve_phases(edited, seq, gbs)
    cut = min(phases[k].start_step, tail[0].start_step if tail else NEVER)
    for index in range(cut):
        a, b = timeline.phase_of(index), other.phase_of(index)
        assert summary(a) == summary(b)
        assert a.identity(recipe) == b.identity(edited)
        sa, sb = timeline.segment_of(index), other.segment_of(index)
        assert (sa.index, sa.start_step) == (sb.index, sb.start_step)
        assert sa.rows_before(index + 1) == sb.rows_before(index + 1)
        started = (timeline.started(index + 1), other.started(index + 1))
        assert [summary(p) for p in started[0]] == [summary(p) for p in started[1]]


@given(schedules())
def test_boundary_checkpoints_are_the_steps_after_which_a_phase_starts(case):
    recipe, timeline, _, _ = case
    data = DataTimeline(timeline, 1, None, recipe.path)
    last = timeline.phases[-1].start_step
    want = [s for s in range(1, last + 3) if data.phase_at(s + 1).start_step == s]
    assert list(data.boundaries()) == want


@given(schedules())
def test_a_phase_whose_layout_fails_is_named_with_its_start(case):
    _, timeline, _, _ = case
    for p in timeline.phases:
        if p.name is None:
            with pytest.raises(LayoutError, match="^data-parallel size"):
                timeline.layout_of(p, p.lanes + 1)
        else:
            with pytest.raises(
                LayoutError, match=f"^phase '{p.name}' \\(from step {p.start_step}\\)"
            ):
                timeline.layout_of(p, p.lanes + 1)
