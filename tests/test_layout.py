"""The layout planner: one answer to which lanes and rows each rank runs."""

from __future__ import annotations

import pytest

from zephon import LayoutError, plan_layout


def test_even_layout_gives_every_rank_its_contiguous_lanes():
    layout = plan_layout(lanes=8, dp_size=4, global_batch_size=32, micro_batch_size=2)
    assert [list(layout.lanes_of(r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.rows_per_lane == 4
    assert [layout.rows_of(r) for r in range(4)] == [8, 8, 8, 8]
    assert layout.rows_per_rank == 8
    assert [layout.padded_rows(r) for r in range(4)] == [0, 0, 0, 0]
    assert layout.micro_steps == 4
    assert layout.idle_share == 0.0


def test_every_lane_is_owned_once_in_lane_order():
    for dp in (1, 2, 4, 8):
        layout = plan_layout(8, dp, 16)
        owned = [lane for r in range(dp) for lane in layout.lanes_of(r)]
        assert owned == list(range(8))
        assert sum(layout.rows_of(r) for r in range(dp)) == 16


def test_default_micro_batch_is_the_whole_local_batch():
    assert plan_layout(8, 2, 16).micro_steps == 1


def test_rank_outside_the_group_is_refused():
    with pytest.raises(LayoutError, match="outside"):
        plan_layout(8, 2, 16).lanes_of(2)
