"""Crossing a segment boundary (zephon/boundary.py) and the lane-count change's
record (zephon/deal.py `deal_source`), on hand-made flush points and cursors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from zephon.boundary import enter_segment
from zephon.deal import deal_source
from zephon.errors import StateError
from zephon.phases import Phase, Segment

NAMES = ("a", "b")


def segment(index: int, start: int, end: int | None, **kw: Any) -> Segment:
    kw = {"gbs": 8, "seq": 16, "lanes": 4, "weights": (0.5, 0.5), **kw}
    p = Phase(f"p{index}", start, end, kw["gbs"], kw["seq"], kw["lanes"], kw["weights"], NAMES)
    return Segment(index, (p,))


BEFORE = segment(0, 0, 2)  # 2 rows a lane a step: the boundary row is 4


def ctx(deals: dict[str, list] | None = None, per_lane_walk: bool = False) -> Any:
    recipe = SimpleNamespace(sources=[SimpleNamespace(name=n) for n in NAMES])
    plan = SimpleNamespace(per_lane_walk=per_lane_walk)
    return SimpleNamespace(recipe=recipe, deals=deals or {}, plan=lambda i, lanes: plan)


def point(lane: int, row: int = 4, carry: list | None = None, **kw: Any) -> dict[str, Any]:
    out = {
        "row": row,
        "mix": {"a": 3 + lane, "b": 1},
        "sources": {"a": {"epoch": 0, "pos": 5 + lane, "retired": False}},
        "skip_tokens": 0,
        **kw,
    }
    if carry is not None:
        out["carry"] = carry
    return out


def test_the_same_lanes_keep_their_cursors_counts_and_carry():
    points = {1: point(1, carry=[[0, 7, 3]]), 2: point(2, carry=[])}
    c = ctx({"a": ["kept"]})
    starts, deals = enter_segment(c, points, BEFORE, segment(1, 2, None, seq=32))
    assert starts == {
        1: {"row": 0, "mix": {"a": 4, "b": 1}, "sources": points[1]["sources"], "skip_tokens": 0,
            "carry": [[0, 7, 3]]},
        2: {"row": 0, "mix": {"a": 5, "b": 1}, "sources": points[2]["sources"], "skip_tokens": 0},
    }  # fmt: skip
    assert deals is c.deals
    starts[1]["mix"]["a"] = 99
    assert points[1]["mix"]["a"] == 4  # a copy


def test_new_weights_restart_the_mixer_counts():
    starts, _ = enter_segment(ctx(), {0: point(0)}, BEFORE, segment(1, 2, None, weights=(1.0, 0.0)))
    assert starts[0]["mix"] == {"a": 0, "b": 0} and starts[0]["sources"] == point(0)["sources"]


@pytest.mark.parametrize("bad", [{"row": 3}, {"skip_tokens": 2}])
def test_only_a_boundary_point_crosses(bad):
    points = {0: point(0), 3: {**point(3), **bad}}
    with pytest.raises(StateError) as info:
        enter_segment(ctx(), points, BEFORE, segment(1, 2, None, seq=32))
    assert str(info.value) == (
        f"lane 3: flush point at row {points[3]['row']} is not a boundary point of row 4"
    )


def test_a_lane_count_change_needs_every_lanes_point():
    with pytest.raises(StateError) as info:
        enter_segment(ctx(), {0: point(0), 2: point(2)}, BEFORE, segment(1, 2, None, lanes=2))
    assert str(info.value) == (
        "the lane count changes from 4 to 2 at step 2: that needs the flush points of every "
        "lane (the merged state of all ranks), got lanes [0, 2]"
    )


def test_a_lane_count_change_deals_cursors_and_carries_by_old_lane():
    points = {
        lane: point(lane, carry=[[0, 10 + lane, 1]] if lane != 1 else None) for lane in range(4)
    }
    points[3]["sources"]["b"] = {"epoch": 0, "pos": 0, "retired": True}
    starts, deals = enter_segment(ctx(), points, BEFORE, segment(1, 2, None, lanes=3))
    record = {"phase": "p1", "lanes_before": 4, "lanes_after": 3,
              "cursors": [[0, 5, False], [0, 6, False], [0, 7, False], [0, 8, False]]}  # fmt: skip
    b_record = {"phase": "p1", "lanes_before": 4, "lanes_after": 3,
                "cursors": [[0, 0, False], [0, 0, False], [0, 0, False], [0, 0, True]]}  # fmt: skip
    assert deals == {"a": [record], "b": [b_record]}
    first = {"a": {"epoch": 0, "pos": 0, "retired": False},
             "b": {"epoch": 0, "pos": 0, "retired": False}}  # fmt: skip
    # New lane j carries the cut documents of old lanes j, j + 3, ... in old-lane order.
    assert starts == {
        0: {"row": 0, "mix": {"a": 0, "b": 0}, "sources": first, "skip_tokens": 0,
            "carry": [[0, 10, 1], [0, 13, 1]]},
        1: {"row": 0, "mix": {"a": 0, "b": 0}, "sources": first, "skip_tokens": 0},
        2: {"row": 0, "mix": {"a": 0, "b": 0}, "sources": first, "skip_tokens": 0,
            "carry": [[0, 12, 1]]},
    }  # fmt: skip


def test_deal_records_chain_and_drop_out():
    cursors = [(0, 5, False), (1, 0, False)]
    chain, starts = deal_source([], cursors, False, 3, "x")
    assert chain == [{"phase": "x", "lanes_before": 2, "lanes_after": 3,
                      "cursors": [[0, 5, False], [1, 0, False]]}]  # fmt: skip
    assert starts == [(0, 0, False)] * 3
    # A later change still reaching epoch 1 keeps the record before it ...
    again, starts = deal_source(chain, [(1, 4, False)] * 3, False, 2, "y")
    assert again == [*chain, {"phase": "y", "lanes_before": 3, "lanes_after": 2,
                              "cursors": [[1, 4, False]] * 3}]  # fmt: skip
    assert starts == [(1, 0, False)] * 2
    # ... one past every epoch it dealt drops it; untouched lanes need no record.
    assert deal_source(chain, [(2, 0, False)] * 3, False, 2, "z") == ([], [(2, 0, False)] * 2)
    assert deal_source([], [(2, 0, False)] * 3, False, 5, "z") == ([], [(2, 0, False)] * 5)


def test_deal_records_where_lanes_stand_apart_or_retired():
    assert deal_source([], [(3, 0, False), (3, 0, True)], False, 2, "x")[0] == [
        {
            "phase": "x",
            "lanes_before": 2,
            "lanes_after": 2,
            "cursors": [[3, 0, False], [3, 0, True]],
        }
    ]
    assert deal_source([], [(1, 0, False), (2, 0, False)], False, 1, "x")[1] == [(1, 0, False)]
    # Every walk of a `stop` source ended: nothing to deal, every new lane retired.
    assert deal_source([], [(1, 3, True), (0, 2, True)], False, 3, "x") == ([], [(0, 0, True)] * 3)


def test_a_small_source_starts_each_new_lanes_walk_at_the_first_unbegun_epoch():
    assert deal_source([], [(2, 0, False), (2, 3, False), (1, 0, True)], True, 2, "x") == (
        [],
        [(3, 0, False)] * 2,
    )
    assert deal_source([], [(2, 0, False), (2, 0, False)], True, 3, "x") == (
        [],
        [(2, 0, False)] * 3,
    )
