"""Which flush point a checkpoint records per lane, and how a restore reads it back
(zephon/state/flush_log.py), on hand-made points."""

from __future__ import annotations

from typing import Any

import pytest

from zephon.errors import StateError
from zephon.state.flush_log import FlushLog, restore_points


def fp(row: int) -> dict[str, Any]:
    return {"row": row, "mix": {"a": row}, "sources": {}, "skip_tokens": 0}


def rows(log: FlushLog, lane: int) -> list[int]:
    return [p["row"] for p in log._points[lane]]


def test_the_log_keeps_the_newest_point_reached_and_the_later_ones():
    log = FlushLog({0: fp(0), 1: fp(0)})
    log.add(0, [fp(8), fp(16)], consumed=5)
    assert rows(log, 0) == [0, 8, 16]
    log.add(0, [], consumed=8)  # reached exactly: the point at 8 is the newest reached
    assert rows(log, 0) == [8, 16]
    log.add(0, [fp(24)], consumed=30)
    assert rows(log, 0) == [24]
    log.add(1, [], consumed=3)
    log.add(1, [fp(8)], consumed=8)
    assert rows(log, 1) == [8]


def test_a_lanes_state_entry_is_its_point_and_the_rows_since():
    log = FlushLog({0: fp(0), 3: fp(4)})
    log.add(0, [fp(8), fp(16)], consumed=10)
    assert log.state_lanes([0, 3], 10) == {
        "0": {"flush": fp(8), "rows_since_flush": 2},
        "3": {"flush": fp(4), "rows_since_flush": 6},
    }
    assert log.state_lanes([3], 4) == {"3": {"flush": fp(4), "rows_since_flush": 0}}
    with pytest.raises(StateError) as info:
        log.state_lanes([3], 3)
    assert str(info.value) == "lane 3: no flush point at or before row 3"


def test_restore_points_check_each_lanes_rows_against_the_step():
    state = {
        "step": 5,
        "lanes": {
            "0": {"flush": fp(8), "rows_since_flush": 2},
            "2": {"flush": fp(0), "rows_since_flush": 10},
        },
    }
    assert restore_points(state, [0, 2], 10) == {0: (fp(8), 2), 2: (fp(0), 10)}
    with pytest.raises(StateError) as info:
        restore_points(state, [0, 1, 2, 3], 10)
    assert str(info.value) == "loader state has no entry for lane(s) [1, 3] of this rank"
    with pytest.raises(StateError) as info:
        restore_points(state, [2, 0], 11)
    assert str(info.value) == (
        "lane 2: flush row 0 + 10 rows does not match the 11 rows each lane gave by step 5"
    )
