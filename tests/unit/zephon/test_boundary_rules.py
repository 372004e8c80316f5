"""Crossing a segment boundary (zephon/streams/segment_boundary.py) and the lane-count change's
record (zephon/state/lane_count_deal.py `deal_source`), on hand-made flush points and cursors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from zephon.errors import StateError
from zephon.lanes.documents import ShuffledLaneDocs
from zephon.lanes.shuffle import SourceShuffle, keyed_permutation
from zephon.recipe.phases import Phase, Segment
from zephon.state.lane_count_deal import Deal, build_lane_docs, deal_source
from zephon.streams.segment_boundary import enter_segment

NAMES = ("a", "b")


def segment(index: int, start: int, end: int | None, **kw: Any) -> Segment:
    kw = {"gbs": 8, "seq": 16, "lanes": 4, "weights": (0.5, 0.5), **kw}
    p = Phase(f"p{index}", start, end, kw["gbs"], kw["seq"], kw["lanes"], kw["weights"], NAMES)
    return Segment(index, (p,))


BEFORE = segment(0, 0, 2)  # 2 rows a lane a step: the boundary row is 4


def ctx(deals: dict[str, list] | None = None, per_lane_walk: bool = False) -> Any:
    recipe = SimpleNamespace(sources=[SimpleNamespace(name=n) for n in NAMES])
    order = SimpleNamespace(per_lane_walk=per_lane_walk)
    return SimpleNamespace(recipe=recipe, deals=deals or {}, shuffle_of=lambda i, lanes: order)


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


def test_a_point_without_skip_tokens_is_a_boundary_point():
    bare = {k: v for k, v in point(0).items() if k != "skip_tokens"}
    starts, _ = enter_segment(ctx(), {0: bare}, BEFORE, segment(1, 2, None, seq=32))
    assert starts[0]["skip_tokens"] == 0


def test_a_lane_count_change_asks_each_sources_shuffle_and_continues_its_chain():
    # Source b is small in the old shuffle (a walk per lane); a's chain so far is kept.
    kept = {"phase": "p0", "lanes_before": 2, "lanes_after": 4,
            "cursors": [[0, 3, False], [0, 1, False]]}  # fmt: skip
    asked = []

    def shuffle_of(i: int, lanes: int) -> Any:
        asked.append((i, lanes))
        return SimpleNamespace(per_lane_walk=(i == 1))

    c = SimpleNamespace(recipe=ctx().recipe, deals={"a": [kept]}, shuffle_of=shuffle_of)
    points = {lane: point(lane) for lane in range(4)}
    points[2]["sources"]["b"] = {"epoch": 1, "pos": 2, "retired": False}
    starts, deals = enter_segment(c, points, BEFORE, segment(1, 2, None, lanes=2))
    assert asked == [(0, 4), (1, 4)]
    assert deals == {"a": [kept, {"phase": "p1", "lanes_before": 4, "lanes_after": 2,
                                  "cursors": [[0, 5, False], [0, 6, False], [0, 7, False],
                                              [0, 8, False]]}]}  # fmt: skip
    # b's walks: lane 2 began epoch 1, so every new lane starts epoch 2.
    assert [s["sources"]["b"] for s in starts.values()] == [
        {"epoch": 2, "pos": 0, "retired": False}
    ] * 2


# -- the deal itself (zephon/state/lane_count_deal.py) -------------------------------------------------------


def shuffle3() -> SourceShuffle:
    """Built in each test, not at import: the code under test runs inside the test."""
    return SourceShuffle("s", 23, 3, 4, 7, True)  # lane blocks of epoch 0: [1, 0], [3, 4], [5, 2]


def old_lanes() -> list[ShuffledLaneDocs]:
    return [ShuffledLaneDocs(shuffle3(), lane, True) for lane in range(3)]


CURSORS = [(0, 1, False), (0, 0, False), (1, 5, False)]


def dealt_by_hand(pool: list[tuple[int, int, int]], order: list[int], lanes: int) -> list[list]:
    return [[pool[k] for i, k in enumerate(order) if i % lanes == j] for j in range(lanes)]


def test_the_pool_of_an_epoch_is_what_its_old_lanes_had_not_drawn_dealt_in_keyed_order():
    deal = Deal(old_lanes(), CURSORS, 2, (7, "s", "ph"), True)
    assert (deal.first, deal.last) == (0, 1)
    # Epoch 0: lane 0 took 1 document of its first block, lane 1 none, lane 2 is past it.
    pool0 = [(0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    order0 = keyed_permutation(4, 7, "s", 0, "deal", "ph").tolist()
    assert deal.pieces(0) == dealt_by_hand(pool0, order0, 2) == [
        [(0, 1, 0), (1, 1, 0)], [(0, 0, 1), (1, 0, 0)],
    ]  # fmt: skip
    # Epoch 1: all of lanes 0 and 1; lane 2 from its 6th document (block 1, offset 2).
    assert old_lanes()[2].locate(1, 5) == (1, 2)
    pool1 = [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (2, 1, 2)]
    order1 = keyed_permutation(5, 7, "s", 1, "deal", "ph").tolist()
    assert deal.pieces(1) == dealt_by_hand(pool1, order1, 2)
    unshuffled = Deal(old_lanes(), CURSORS, 2, (7, "s", "ph"), False)
    assert unshuffled.pieces(1) == dealt_by_hand(pool1, list(range(5)), 2)


def test_retired_lanes_and_lanes_at_their_epochs_end_give_nothing():
    cursors = [(0, 8, False), (3, 0, True), (0, 0, False)]  # lane 0 drew all 8 of epoch 0
    deal = Deal(old_lanes(), cursors, 2, (7, "s", "ph"), False)
    assert (deal.first, deal.last) == (0, 0)
    assert deal.pieces(0) == [[(2, 0, 0)], [(2, 1, 0)]]


def test_a_new_lanes_documents_are_its_pieces_then_the_new_shuffle():
    chain = [{"phase": "ph", "lanes_before": 3, "lanes_after": 2,
              "cursors": [list(c) for c in CURSORS]}]  # fmt: skip
    new = build_lane_docs(
        chain, lambda n: SourceShuffle("s", 23, n, 4, 7, True), True, 7, "s", True
    )
    lane = new[1]  # epoch 0 pieces: 3 documents of old lane 0's block 1, all of lane 1's block 3
    assert (lane.epoch_docs(0), lane.num_blocks(0), lane.repeat) == (7, 2, True)
    assert [lane.block_size(0, j) for j in range(2)] == [3, 4]
    parts = [lane.block(0, j) for j in range(2)]
    assert [(p.start, p.end) for p in parts] == [(4, 8), (12, 16)]
    assert parts[0].order.tolist() == shuffle3().block_order(0, 1)[1:].tolist()
    assert parts[1].order.tolist() == shuffle3().block_order(0, 3).tolist()
    assert [lane.locate(0, pos) for pos in range(7)] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3),
    ]  # fmt: skip
    # Past the dealt epochs: the plain shuffle for two lanes.
    after = ShuffledLaneDocs(SourceShuffle("s", 23, 2, 4, 7, True), 1, True)
    assert (lane.epoch_docs(2), lane.num_blocks(2)) == (after.epoch_docs(2), after.num_blocks(2))
    assert [lane.locate(2, pos) for pos in (0, 5)] == [after.locate(2, pos) for pos in (0, 5)]
    # In epoch 6 the new shuffle's short block (3 documents) is this lane's second.
    assert lane.locate(6, 7) == after.locate(6, 7) == (2, 0)
    assert [lane.block_size(2, j) for j in range(3)] == [after.block_size(2, j) for j in range(3)]
    assert [(b.start, b.end) for b in (lane.block(2, j) for j in range(3))] == [
        (b.start, b.end) for b in (after.block(2, j) for j in range(3))
    ]


def test_a_record_is_read_with_its_retired_lanes_and_must_cover_its_lanes():
    plan_for = lambda n: SourceShuffle("s", 23, n, 4, 7, True)  # noqa: E731
    retired = [{"phase": "ph", "lanes_before": 3, "lanes_after": 2,
                "cursors": [[0, 1, False], [0, 0, 1], [0, 0, False]]}]  # fmt: skip
    new = build_lane_docs(retired, plan_for, True, 7, "s", False)
    # Lane 0 left 7 of its 8, lane 2 all of its 7 (its block 5 is short), lane 1 nothing.
    assert sum(lane.epoch_docs(0) for lane in new) == 7 + 7
    short = [{**retired[0], "cursors": [[0, 1, False], [0, 0, False]]}]
    with pytest.raises(ValueError):
        build_lane_docs(short, plan_for, True, 7, "s", False)[0].epoch_docs(0)


def test_a_dropped_chain_leaves_the_new_record_alone():
    chain = [{"phase": "x", "lanes_before": 2, "lanes_after": 2,
              "cursors": [[0, 1, False], [1, 0, False]]}]  # fmt: skip
    assert deal_source(chain, [(2, 3, False), (2, 0, False)], False, 2, "y") == (
        [{"phase": "y", "lanes_before": 2, "lanes_after": 2,
          "cursors": [[2, 3, False], [2, 0, False]]}],
        [(2, 0, False)] * 2,
    )  # fmt: skip
