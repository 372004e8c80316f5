"""The packers' exact rows and counts on small hand-made documents (zephon/packing.py).

Token ids name their document and offset (document d's token j is d * 100 + j).
The lane here records every row, piece by piece, and every flush point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from zephon.packing import BestFitPacker, ConcatPacker, RowBuilder, held_rows

PAD = -1


def doc(d: int, n: int) -> np.ndarray:
    return np.arange(d * 100, d * 100 + n, dtype=np.int32)


class Lane:
    """Documents from a list; records rows as lists of (first id, length, source, starts)."""

    def __init__(self, lengths: Sequence[int], rows_emitted: int = 0, sources: int = 2):
        self.docs = [(doc(d, n), d % sources) for d, n in enumerate(lengths)]
        self.at, self.rows_emitted = 0, rows_emitted
        self.rows: list[list[tuple[int, int, int, bool]]] = []
        self.flushes: list[tuple[int, tuple, int, list]] = []

    def pick(self) -> tuple[np.ndarray, int, int] | None:
        if self.at == len(self.docs):
            return None
        self.at += 1
        ids, source = self.docs[self.at - 1]
        return ids, source, self.at - 1

    def unpick(self) -> None:
        self.at -= 1

    def emit(self, pieces: list[Any]) -> None:
        self.rows.append([(int(ids[0]), len(ids), s, starts) for ids, s, starts in pieces])
        self.rows_emitted += 1

    def snapshot(self) -> tuple:
        return (self.at,)

    def flush_point(self, snapshot: tuple, skip_tokens: int, carry: Sequence) -> None:
        self.flushes.append((self.rows_emitted, snapshot, skip_tokens, list(carry)))


def drain(packer: Any, lane: Lane) -> Lane:
    while packer.fill(lane):
        pass
    return lane


def test_held_rows_are_best_fits_open_bins_only():
    assert (held_rows("best_fit", 4), held_rows("concat", 4), held_rows("best_fit", 0)) == (4, 0, 0)


def test_a_row_is_its_pieces_then_padding_with_counts_by_source():
    builder = RowBuilder(8, PAD, 3)
    tokens, positions, src_tokens, src_docs = builder.build(
        [(doc(1, 3), 0, True), (doc(2, 2)[1:], 2, False), (doc(3, 1), 2, True)]
    )
    assert tokens.tolist() == [100, 101, 102, 201, 300, PAD, PAD, PAD]
    assert positions.tolist() == [0, 1, 2, 0, 0, -1, -1, -1]
    assert (src_tokens, src_docs) == ([3, 0, 2], [1, 0, 1])
    assert tokens.dtype == np.int32 and positions.dtype == np.int32
    full, pos, _, _ = builder.build([(doc(4, 8), 1, True)])
    assert full.tolist() == list(range(400, 408)) and pos.tolist() == list(range(8))
    empty, pos, counts, starts = builder.build([])
    assert empty.tolist() == [PAD] * 8 and pos.tolist() == [-1] * 8
    assert (counts, starts) == ([0, 0, 0], [0, 0, 0])


def test_concat_cuts_documents_at_row_ends_and_flushes_mid_document():
    lane = drain(ConcatPacker(5, flush_interval=2), Lane([3, 4, 6, 1]))
    assert lane.rows == [
        [(0, 3, 0, True), (100, 2, 1, True)],
        [(102, 2, 1, False), (200, 3, 0, True)],
        [(203, 3, 0, False), (300, 1, 1, True)],
    ]
    # Row 2 ends inside document 2: the point is the cursor before it, 3 tokens in.
    assert lane.flushes == [(2, (2,), 3, [])]


def test_a_restored_concat_packer_skips_what_was_emitted():
    lane = Lane([3, 4, 6, 1])
    lane.at, lane.rows_emitted = 2, 2
    drain(ConcatPacker(5, flush_interval=2, skip_tokens=3), lane)
    assert lane.rows == [[(203, 3, 0, False), (300, 1, 1, True)]]


def test_a_fresh_concat_packer_holds_nothing_but_its_carry():
    assert ConcatPacker(5, 2).held() == {} and ConcatPacker(5, 2).tails() == []
    carried = ConcatPacker(5, 2, carry=[(doc(7, 4), 1, 7, 1)])
    assert list(carried.held()) == [(1, 7)] and carried.tails() == [(1, 7, 1)]


def test_best_fit_rows_placing_counts_rows_and_open_bins():
    packer = BestFitPacker(10, open_bins=2, flush_interval=100)
    assert packer.rows_placing(20) == (2, 0)  # whole rows only
    assert packer.rows_placing(23) == (2, 1)  # and a new bin for the rest
    packer.bins, packer.free = [[], []], [4, 6]
    assert packer.rows_placing(4) == (1, 1)  # fills the tighter bin exactly: it closes
    assert packer.rows_placing(5) == (0, 2)  # into the bin with 6 free
    assert packer.rows_placing(7) == (1, 2)  # no fit with 2 open: the fullest closes
    packer.k = 3
    assert packer.rows_placing(17) == (1, 3)  # a third bin for the 7 left
    assert packer.rows_placing_chunks([10, 4]) == (2, 1)
    assert packer.rows_placing_chunks([6, 3]) == (1, 1)
    assert packer.rows_placing_chunks([7, 7]) == (1, 3)  # a third bin, then the fullest closes
    assert (packer.bins, packer.free) == ([[], []], [4, 6])  # counted, not placed


@pytest.mark.parametrize("flush_interval", [2, 100])
def test_best_fit_closes_every_bin_once_interval_rows_are_out(flush_interval):
    lane = drain(BestFitPacker(10, 2, flush_interval), Lane([6, 5, 3, 4, 2, 9]))
    # 6 -> A, 5 -> B, 3 -> A (tighter), 4 -> B; 2 fits nowhere: A (fullest) closes;
    # 9 fits nowhere: B closes. Two rows out: with an interval of 2 every bin closes
    # and the flush point is the cursor after document 5; else the end closes them.
    assert lane.rows == [
        [(0, 6, 0, True), (200, 3, 0, True)],
        [(100, 5, 1, True), (300, 4, 1, True)],
        [(400, 2, 0, True)],
        [(500, 9, 1, True)],
    ]
    assert lane.flushes == ([(4, (6,), 0, [])] if flush_interval == 2 else [])
