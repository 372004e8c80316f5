"""The layout planner: one answer to which lanes and rows each rank runs."""

from __future__ import annotations

import pytest

from zephon import LayoutError, resolve_layout


def test_even_layout_gives_every_rank_its_contiguous_lanes():
    layout = resolve_layout(lanes=8, dp_size=4, global_batch_size=32, micro_batch_size=2)
    assert [list(layout.lanes_of(r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.rows_per_lane == 4
    assert [layout.rows_of(r) for r in range(4)] == [8, 8, 8, 8]
    assert layout.rows_per_rank == 8
    assert [layout.padded_rows(r) for r in range(4)] == [0, 0, 0, 0]
    assert layout.micro_steps == 4
    assert layout.idle_share == 0.0


def test_every_lane_is_owned_once_in_lane_order():
    for dp in (1, 2, 4, 8):
        layout = resolve_layout(8, dp, 16)
        owned = [lane for r in range(dp) for lane in layout.lanes_of(r)]
        assert owned == list(range(8))
        assert sum(layout.rows_of(r) for r in range(dp)) == 16


def test_default_micro_batch_is_the_whole_local_batch():
    assert resolve_layout(8, 2, 16).micro_steps == 1


def test_rank_outside_the_group_is_refused():
    with pytest.raises(LayoutError, match="outside"):
        resolve_layout(8, 2, 16).lanes_of(2)


# -- any data-parallel size up to the lane count --------------------------------------


@pytest.mark.parametrize("dp", [1, 5, 6, 7, 12, 48, 56, 64])
def test_rank_r_owns_lanes_floor_r_l_over_d(dp):
    layout = resolve_layout(64, dp, 128, 2)
    owned = [list(layout.lanes_of(r)) for r in range(dp)]
    assert owned == [list(range(r * 64 // dp, (r + 1) * 64 // dp)) for r in range(dp)]
    assert [lane for lanes in owned for lane in lanes] == list(range(64))
    assert {len(lanes) for lanes in owned} <= {64 // dp, -(-64 // dp)}
    assert sum(layout.rows_of(r) for r in range(dp)) == 128


def test_uneven_ranks_pad_to_the_largest_rank():
    layout = resolve_layout(lanes=8, dp_size=3, global_batch_size=16, micro_batch_size=2)
    assert [list(layout.lanes_of(r)) for r in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert [layout.rows_of(r) for r in range(3)] == [4, 6, 6]
    assert layout.rank_rows == {4: 1, 6: 2}
    assert layout.rows_per_rank == 6
    assert [layout.padded_rows(r) for r in range(3)] == [2, 0, 0]
    assert layout.micro_steps == 3
    assert layout.total_padded_rows == 2
    assert layout.idle_share == pytest.approx(2 / 18)
    note = layout.imbalance()
    assert note is not None
    for part in ("rows per rank 4 on 1 rank, 6 on 2 ranks", "every rank runs 6 rows", "11.1%"):
        assert part in note


def test_micro_batch_rounds_the_rows_every_rank_runs_up():
    """The rows every rank runs are the largest rank's rows rounded up to whole
    micro-batches (docs/design.md §2): a micro-batch that does not divide them pads."""
    even = resolve_layout(8, 2, 16, 3)
    assert (even.rows_per_rank, even.micro_steps, even.padded_rows(0)) == (9, 3, 1)
    assert even.rank_rows == {8: 2}
    uneven = resolve_layout(64, 7, 64, 4)  # 9 or 10 lanes of one row each
    assert uneven.rank_rows == {9: 6, 10: 1}
    assert (uneven.rows_per_rank, uneven.micro_steps) == (12, 3)
    assert uneven.idle_share == pytest.approx(1 - 64 / 84)
    # Without a micro-batch size every rank runs the largest rank's rows at once.
    whole = resolve_layout(64, 7, 64)
    assert (whole.rows_per_rank, whole.micro_steps) == (10, 1)


def test_even_layout_reports_no_imbalance():
    layout = resolve_layout(64, 8, 128, 4)
    assert layout.imbalance() is None and layout.idle_share == 0.0
    assert resolve_layout(64, 8, 128, 4, max_idle_share=0.0) == layout


def test_max_idle_share_refuses_only_above_it():
    assert resolve_layout(8, 3, 16, 2, max_idle_share=0.12).idle_share == pytest.approx(2 / 18)
    assert resolve_layout(8, 3, 16, 2, max_idle_share=2 / 18).micro_steps == 3
    with pytest.raises(LayoutError) as info:
        resolve_layout(8, 3, 16, 2, max_idle_share=0.1)
    for part in (
        "rows per rank 4 on 1 rank, 6 on 2 ranks",
        "11.1% of the compute idles, more than the allowed 10.0%",
        "data-parallel sizes without padding: 1, 2, 4, 8",
    ):
        assert part in str(info.value)


def test_layout_invariants_for_every_small_shape():
    for lanes in range(1, 13):
        for dp in range(1, lanes + 1):
            for per_lane in (1, 3):
                for micro in (1, 2, 4, 5):
                    g = lanes * per_lane
                    layout = resolve_layout(lanes, dp, g, micro)
                    rows = [layout.rows_of(r) for r in range(dp)]
                    owned = [lane for r in range(dp) for lane in layout.lanes_of(r)]
                    assert owned == list(range(lanes))
                    assert sum(rows) == g
                    assert max(rows) <= layout.rows_per_rank < max(rows) + micro
                    assert layout.rows_per_rank == layout.micro_steps * micro
                    assert sum(layout.padded_rows(r) for r in range(dp)) == (
                        layout.total_padded_rows
                    )
                    assert sorted(layout.rank_rows) == sorted(set(rows))
                    assert sum(layout.rank_rows.values()) == dp
