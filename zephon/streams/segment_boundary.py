"""Crossing a phase boundary that ends a segment: the lanes' flush points at their
boundary row become the next segment's starting points.

Every lane stopped exactly at its boundary row R (packing.py), so its flush
point there holds cursors, mixer counts and, for `concat`, the documents cut
at R (the carry). The next segment starts from row 0 with:
- the same lanes (seq_len or mixture changed): the same cursors (a paused
  source keeps its place), the carry emitted first, and the mixer counts
  kept when only seq_len changed, restarted at zero when the weights did
  (the deficit is cumulative: old counts would make a newly weighted source
  be drawn alone until it caught up with the whole past);
- a new lane count (deal.py): cursors at the start of each source's dealt
  documents, zero counts, and new lane j carries the cut documents of the old
  lanes l with l mod L' == j, in old-lane order, before its first pick. That
  needs every old lane's point: the merged state of all ranks.
"""

from __future__ import annotations

from typing import Any

from zephon.errors import StateError
from zephon.recipe.phases import Segment
from zephon.state.flush_log import FlushPoint
from zephon.state.lane_count_deal import Record, deal_source
from zephon.streams.context import PipelineContext


def _zero(ctx: PipelineContext) -> dict[str, int]:
    return {s.name: 0 for s in ctx.recipe.sources}


def enter_segment(
    ctx: PipelineContext,
    points: dict[int, FlushPoint],
    before: Segment,
    after: Segment,
) -> tuple[dict[int, FlushPoint], dict[str, list[Record]]]:
    """Starting points of the lanes of `after`, from the lanes' points at the end of
    `before`; and the lane-count changes to keep (ctx.deals, with this one)."""
    for lane, p in points.items():
        if int(p["row"]) != before.end_row or int(p.get("skip_tokens", 0)):
            raise StateError(
                f"lane {lane}: flush point at row {p['row']} is not a boundary point of "
                f"row {before.end_row}"
            )
    if before.lanes == after.lanes:
        restart = before.weights != after.weights
        starts = {
            lane: {
                "row": 0,
                "mix": _zero(ctx) if restart else dict(p["mix"]),
                "sources": p["sources"],
                "skip_tokens": 0,
                **({"carry": p["carry"]} if p.get("carry") else {}),
            }
            for lane, p in points.items()
        }
        return starts, ctx.deals
    if sorted(points) != list(range(before.lanes)):
        raise StateError(
            f"the lane count changes from {before.lanes} to {after.lanes} at step "
            f"{after.start_step}: that needs the flush points of every lane (the merged "
            f"state of all ranks), got lanes {sorted(points)}"
        )
    return _deal(ctx, points, before, after)


def _deal(
    ctx: PipelineContext, points: dict[int, FlushPoint], before: Segment, after: Segment
) -> tuple[dict[int, FlushPoint], dict[str, list[Record]]]:
    old, new = before.lanes, after.lanes
    deals: dict[str, list[Record]] = {}
    cursors: dict[str, list[Any]] = {}
    for i, spec in enumerate(ctx.recipe.sources):
        at = [points[lane]["sources"].get(spec.name) for lane in range(old)]
        mine = [(0, 0, False) if c is None else (c["epoch"], c["pos"], c["retired"]) for c in at]
        walk = ctx.shuffle_of(i, old).per_lane_walk
        chain, starts = deal_source(ctx.deals.get(spec.name, []), mine, walk, new, after.first.name)
        if chain:
            deals[spec.name] = chain
        cursors[spec.name] = starts
    out = {}
    for j in range(new):
        carry = [c for lane in range(j, old, new) for c in points[lane].get("carry", [])]
        out[j] = {
            "row": 0,
            "mix": _zero(ctx),
            "sources": {
                name: dict(zip(("epoch", "pos", "retired"), starts[j], strict=True))
                for name, starts in cursors.items()
            },
            "skip_tokens": 0,
            **({"carry": carry} if carry else {}),
        }
    return out, deals
