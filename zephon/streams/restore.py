"""Where a rank's lanes start after a restore, in a recipe that may have phases.

A state written after step s holds the lanes of the segment (phases.py) that
produced batch s, with each lane's flush point and the rows consumed since;
or, when the lanes had already entered the next segment, that segment's lanes
at row 0 (`segment_start` says which). Three cases:
- the state's lanes belong to the segment of the next batch: restore them;
- they belong to the segment that ended exactly at s, each at a clean
  boundary point (no rows since, nothing to re-pick): the next segment's
  lanes start from those points directly (boundary.py; a lane-count change
  deals from every lane's point, which the merged state holds);
- they belong to it but are not at clean boundary points (the phase at s was
  added after the state was written): they are restored in their segment,
  replay to the boundary row knowing it, and the producer crosses before the
  first batch. A lane-count change cannot start that way: it needs every
  lane's point, and no rank replays other ranks' lanes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zephon.errors import StateError
from zephon.recipe.phases import PhaseTimeline, Segment
from zephon.state.flush_log import FlushPoint, restore_points
from zephon.state.lane_count_deal import Record
from zephon.streams.context import PipelineContext
from zephon.streams.segment_boundary import enter_segment

Starts = dict[int, tuple[FlushPoint, int]]


def resume_starts(
    ctx: PipelineContext,
    timeline: PhaseTimeline,
    state: dict[str, Any],
    lanes_of: Callable[[Segment], range],
) -> tuple[Segment, Starts, dict[str, list[Record]]]:
    """(segment the lanes start in, per lane of this rank its flush point and the
    rows to replay after it, the lane-count changes in use) for a state (version 2)."""
    step = int(state["step"])
    deals: dict[str, list[Record]] = state.get("deals", {})
    ctx.set_deals(deals)
    seg = timeline.segment_of(step)
    held = int(state.get("segment_start", 0))
    num_lanes = int(state.get("num_lanes", seg.lanes))
    if held == seg.start_step:  # the lanes of the next batch's segment
        _check_lanes(num_lanes, seg, step)
        return seg, restore_points(state, lanes_of(seg), seg.rows_before(step)), deals
    prev = timeline.segment_of(step - 1) if step > 0 else seg
    if held != prev.start_step or seg is prev:
        raise StateError(
            f"loader state: its lanes started their segment at step {held}, but in this "
            f"recipe the lanes at step {step} started at step {seg.start_step}"
        )
    _check_lanes(num_lanes, prev, step)
    end = prev.end_row
    entries = state["lanes"]
    clean = all(
        int(e["rows_since_flush"]) == 0
        and int(e["flush"]["row"]) == end
        and not int(e["flush"].get("skip_tokens", 0))
        for e in entries.values()
    )
    if clean:
        points = {int(k): e["flush"] for k, e in entries.items()}
        if prev.lanes == seg.lanes:
            points = {lane: points[lane] for lane in lanes_of(seg)}
        starts, deals = enter_segment(ctx, points, prev, seg)
        ctx.set_deals(deals)
        return seg, {lane: (starts[lane], 0) for lane in lanes_of(seg)}, deals
    if prev.lanes != seg.lanes:
        raise StateError(
            f"{seg.first.label} changes the lane count at step {step}, the checkpoint's own "
            "step, but the checkpoint was not written at that boundary (its phase was added "
            f"later); start the phase at step {step + 1} or later"
        )
    assert end is not None
    return prev, restore_points(state, lanes_of(prev), end), deals


def _check_lanes(num_lanes: int, seg: Segment, step: int) -> None:
    if num_lanes != seg.lanes:
        raise StateError(
            f"loader state: it holds {num_lanes} lanes, but at step {step} this recipe has "
            f"{seg.lanes} ({seg.first.label})"
        )
