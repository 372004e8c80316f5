"""The packers on their own, over a stand-in lane of numbered documents.

Token ids name their document and offset (document d's token j is
d * 1000 + j), so every row can be traced back to what was packed.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.packing import DOCS, PAD, ROW, ListLane, documents

from zephon.lanes.packing import BestFitPacker, ConcatPacker


def drain(packer: ConcatPacker | BestFitPacker, lane: ListLane) -> ListLane:
    while packer.fill(lane):
        pass
    return lane


def real(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return tokens[positions >= 0]


def expected_positions(tokens: np.ndarray) -> list[int]:
    """0 at the row's start, wherever a document starts (offset 0) and wherever a
    piece of another document begins (a split document's rest), else one more."""
    out: list[int] = []
    prev = -1
    for t in tokens.tolist():
        starts = not out or t % 1000 == 0 or t // 1000 != prev // 1000
        out.append(0 if starts else out[-1] + 1)
        prev = t
    return out


def check_rows(lane: ListLane) -> None:
    for tokens, positions in lane.rows:
        n = int((positions >= 0).sum())
        # Padding is a tail: pad ids at position -1, nothing after it.
        assert (positions[n:] == -1).all() and (tokens[n:] == PAD).all()
        assert (positions[:n] >= 0).all()
        assert positions[:n].tolist() == expected_positions(tokens[:n])


def test_concat_joins_documents_and_pads_only_the_last_row():
    lane = drain(ConcatPacker(ROW, flush_interval=4), ListLane(DOCS))
    check_rows(lane)
    flat = np.concatenate([real(*row) for row in lane.rows])
    assert flat.tolist() == np.concatenate([ids for ids, _ in DOCS]).tolist()
    padded = [i for i, (_, pos) in enumerate(lane.rows) if (pos < 0).any()]
    assert padded in ([], [len(lane.rows) - 1])
    # Long documents span rows: document 1 (40 tokens) touches three rows.
    assert sum(any(t // 1000 == 1 for t in real(*row).tolist()) for row in lane.rows) == 3


def test_concat_flush_points_restart_the_rows_exactly():
    lane = drain(ConcatPacker(ROW, flush_interval=3), ListLane(DOCS))
    assert [row for row, _, _ in lane.flushes] == list(range(3, len(lane.rows) + 1, 3))
    assert any(skip > 0 for _, _, skip in lane.flushes)  # some flush points are mid-document
    for row, at, skip in lane.flushes:
        resumed = drain(ConcatPacker(ROW, 3, skip), ListLane(DOCS, at, row))
        assert len(resumed.rows) == len(lane.rows) - row
        for (t1, p1), (t2, p2) in zip(resumed.rows, lane.rows[row:], strict=True):
            assert t1.tolist() == t2.tolist() and p1.tolist() == p2.tolist()


def test_best_fit_places_each_document_in_the_tightest_bin():
    lane = ListLane(documents([6, 5, 3, 4, 2]))
    drain(BestFitPacker(10, open_bins=2, flush_interval=100), lane)
    rows = [[t // 1000 for t in real(*row).tolist()] for row in lane.rows]
    # 6 -> A (4 free); 5 fits nowhere -> B (5 free); 3 -> A, the tighter (1 free);
    # 4 -> B (1 free); 2 fits nowhere with two bins open: A, the fullest, is closed.
    assert rows == [[0] * 6 + [2] * 3, [1] * 5 + [3] * 4, [4] * 2]


@pytest.mark.parametrize("open_bins", [1, 4])
def test_best_fit_keeps_every_token_and_pads_only_rows_it_must_close(open_bins):
    lane = ListLane(DOCS)
    packer = BestFitPacker(ROW, open_bins, flush_interval=10_000)
    closed_for: list[int] = []  # per row: the piece that could not be placed when it closed
    while True:
        before = len(lane.rows)
        more = packer.fill(lane)
        ids = lane.docs[lane.at - 1][0]
        closed_for += [len(ids) % ROW] * (len(lane.rows) - before)
        if not more:
            ends = len(lane.rows) - before  # rows the final flush closed
            break
    check_rows(lane)
    tokens = sorted(np.concatenate([real(*row) for row in lane.rows]).tolist())
    assert tokens == sorted(np.concatenate([ids for ids, _ in DOCS]).tolist())
    for i, (_, positions) in enumerate(lane.rows[: len(lane.rows) - ends]):
        padding = int((positions < 0).sum())
        # A row closes early only when no open bin fits the next piece and all are open.
        assert padding == 0 or padding < closed_for[i], (i, padding, closed_for[i])
    # Long documents are split into whole rows plus a rest: document 1 (40 tokens).
    whole = [row for row in lane.rows if [t // 1000 for t in real(*row).tolist()] == [1] * ROW]
    assert len(whole) == 2


def test_best_fit_flush_points_hold_nothing_and_restart_the_rows_exactly():
    lane = drain(BestFitPacker(ROW, 4, flush_interval=5), ListLane(DOCS))
    assert lane.flushes and all(skip == 0 for _, _, skip in lane.flushes)
    for row, at, _ in lane.flushes:
        # Everything picked before the flush point is in the rows before it, and
        # nothing else: the packer held no tokens there.
        before = sorted(np.concatenate([real(*r) for r in lane.rows[:row]]).tolist())
        assert before == sorted(np.concatenate([ids for ids, _ in DOCS[:at]]).tolist())
        resumed = drain(BestFitPacker(ROW, 4, 5, start_row=row), ListLane(DOCS, at, row))
        for (t1, p1), (t2, p2) in zip(resumed.rows, lane.rows[row:], strict=True):
            assert t1.tolist() == t2.tolist() and p1.tolist() == p2.tolist()
