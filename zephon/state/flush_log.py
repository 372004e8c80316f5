"""Flush points per lane: what a checkpoint records, and what a restore starts from.

A lane may be restarted from any of its flush points (a row where its packer
held nothing) by replaying the rows after it. The log keeps, per lane, the
newest flush point the trainer has reached and the later ones the prefetcher
has passed, so that the state written for a step counts what the trainer
consumed, never what was produced ahead of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from zephon.errors import StateError

FlushPoint = dict[str, Any]  # {"row", "mix", "sources", "skip_tokens", "carry"?} (lane.py)


class FlushLog:
    """The flush points of each lane that a checkpoint may still need."""

    def __init__(self, starts: dict[int, FlushPoint]):
        self._points: dict[int, list[FlushPoint]] = {lane: [p] for lane, p in starts.items()}

    def add(self, lane: int, points: Iterable[FlushPoint], consumed: int) -> None:
        """Record a lane's new flush points; `consumed`: rows the trainer has taken."""
        log = self._points[lane]
        log.extend(points)
        # Keep the newest point the trainer has reached, and later ones.
        while len(log) > 1 and log[1]["row"] <= consumed:
            log.pop(0)

    def state_lanes(self, lanes: Sequence[int], consumed: int) -> dict[str, Any]:
        """The state's per-lane entries once the trainer has taken `consumed` rows per lane."""
        out = {}
        for lane in lanes:
            log = self._points[lane]
            flush = log[0] if log else None
            if flush is None or flush["row"] > consumed:
                raise StateError(f"lane {lane}: no flush point at or before row {consumed}")
            out[str(lane)] = {"flush": flush, "rows_since_flush": consumed - flush["row"]}
        return out


def restore_points(
    state: dict[str, Any], lanes: Sequence[int], consumed: int
) -> dict[int, tuple[FlushPoint, int]]:
    """Per lane, (flush point, rows to replay after it) from a loader state,
    checked against the rows each lane gave in its segment by the state's step."""
    missing = [lane for lane in lanes if str(lane) not in state["lanes"]]
    if missing:
        raise StateError(f"loader state has no entry for lane(s) {missing} of this rank")
    step = int(state["step"])
    points = {}
    for lane in lanes:
        entry = state["lanes"][str(lane)]
        flush = entry["flush"]
        if flush["row"] + entry["rows_since_flush"] != consumed:
            raise StateError(
                f"lane {lane}: flush row {flush['row']} + {entry['rows_since_flush']} rows "
                f"does not match the {consumed} rows each lane gave by step {step}"
            )
        points[lane] = (flush, int(entry["rows_since_flush"]))
    return points
