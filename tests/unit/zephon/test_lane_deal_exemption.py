"""When a source whose old lanes each walked all of its documents is still dealt
(zephon/state/lane_count_deal.py `deal_source`): such a source is exempt from dealing
unless every old lane still stands in epochs an earlier change dealt, where its
documents are dealt pieces, not its own walk."""

from __future__ import annotations

from zephon.state.lane_count_deal import deal_source


def earlier_change(*cursors: tuple[int, int, bool]) -> dict:
    return {
        "phase": "b",
        "lanes_before": len(cursors),
        "lanes_after": 2,
        "cursors": [list(c) for c in cursors],
    }


def test_lanes_all_within_the_dealt_epochs_are_dealt_again_even_when_walking_per_lane():
    chain = [earlier_change((1, 4, False), (2, 5, False))]  # it dealt epochs 1..2
    cursors = [(2, 1, False), (2, 3, False)]  # both lanes in epoch 2, the last it dealt
    new_chain, starts = deal_source(chain, cursors, True, 3, "c")
    assert new_chain == [
        *chain,
        {"phase": "c", "lanes_before": 2, "lanes_after": 3,
         "cursors": [[2, 1, False], [2, 3, False]]},
    ]  # fmt: skip
    assert starts == [(2, 0, False)] * 3


def test_a_lane_past_the_dealt_epochs_makes_the_per_lane_walk_exempt():
    chain = [earlier_change((1, 4, False), (2, 5, False))]
    cursors = [(2, 1, False), (3, 0, False)]
    # Each new lane starts its own walk at the first epoch no old lane had begun.
    assert deal_source(chain, cursors, True, 3, "c") == ([], [(3, 0, False)] * 3)
    # Without a per-lane walk the same lanes are dealt, from the earliest epoch.
    dealt, starts = deal_source(chain, cursors, False, 3, "c")
    assert dealt[-1]["cursors"] == [[2, 1, False], [3, 0, False]] and len(dealt) == 2
    assert starts == [(2, 0, False)] * 3
