"""The packers' exact rows and counts on small hand-made documents (zephon/lanes/packing.py).

Token ids name their document and offset (document d's token j is d * 100 + j).
The lane here records every row, piece by piece, and every flush point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from helpers.packing import ListDocuments

from zephon.images.documents import DocImage, ImageDoc, ImageDocIds, fit_row
from zephon.lanes.packing import BestFitPacker, ConcatPacker, RowBuilder, held_rows

PAD = -1


def doc(d: int, n: int) -> np.ndarray:
    return np.arange(d * 100, d * 100 + n, dtype=np.int32)


class Lane(ListDocuments):
    """Documents from a list; records rows as lists of (first id, length, source, starts)."""

    def __init__(self, lengths: Sequence[int], rows_emitted: int = 0, sources: int = 2):
        self.docs = [(doc(d, n), d % sources) for d, n in enumerate(lengths)]
        self.at, self.rows_emitted = 0, rows_emitted
        self.rows: list[list[tuple[int, int, int, bool]]] = []
        self.flushes: list[tuple[int, tuple, int, list]] = []

    def emit(self, pieces: list[Any]) -> None:
        self.rows.append([(int(ids[0]), len(ids), s, starts) for ids, s, starts in pieces])
        self.rows_emitted += 1

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
    assert packer.rows_placing_chunks([10, 10, 7, 7]) == (3, 3)  # 2 whole rows, the 3-free closes
    packer.free = [6, 4]
    assert packer.rows_placing_chunks([3, 4]) == (0, 2)  # 3 into the tighter 4: 4 fits in 6


def test_best_fit_stops_at_the_boundary_row_with_padding_and_a_bare_flush_point():
    lane = Lane([6, 5, 3, 4, 2, 9, 7])
    packer = BestFitPacker(10, 2, flush_interval=100, end_row=3)
    drain_to = [packer.fill(lane) for _ in range(5)]
    assert drain_to == [True] * 5
    # 6 -> A, 5 -> B, 3 -> A, 4 -> B; the 2 would close A and open a bin: 1 row out
    # + 2 open = 3, at the boundary, so it is placed and every bin closes; no row
    # crosses row 3 and the point is the cursor after it, carrying nothing.
    assert lane.rows == [
        [(0, 6, 0, True), (200, 3, 0, True)],
        [(100, 5, 1, True), (300, 4, 1, True)],
        [(400, 2, 0, True)],
    ]
    assert lane.flushes == [(3, (5,), 0, [])]
    with pytest.raises(RuntimeError) as info:
        packer.fill(lane)
    assert str(info.value) == "lane asked past its boundary row 3"


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


def image_doc(parts: list[Any], first: int = 0) -> Any:
    """An ImageDocIds of text runs (ints: tokens) and images (tuples: placeholders,
    a block of that + 2 tokens); ids count up from `first`."""
    images, at = [], 0
    for p in parts:
        if isinstance(p, tuple):
            grid = (2, 2 * p[0])
            patches = np.zeros((4 * p[0], 12), dtype=np.uint8)
            images.append(DocImage(at, p[0], grid, patches, f"img@{at}"))
        at += p[0] + 2 if isinstance(p, tuple) else p
    return ImageDocIds.make(np.arange(first, first + at), ImageDoc(tuple(images)))


class ImageLane(Lane):
    def __init__(self, docs: list[tuple[Any, int]]):
        super().__init__([])
        self.docs = docs


def test_best_fit_cuts_a_document_with_images_only_between_blocks_and_counts_them_at_a_boundary():
    # A 4-token text opens a bin with 6 free; the image document (3 text, a 4-token
    # image at 3, 9 text) is cut at 10 (not inside the image): a whole row, then 6
    # tokens that close the open bin. 2 rows, no bin left open: exactly the boundary.
    lane = ImageLane([(doc(0, 4), 0), (image_doc([3, (2,), 9], first=100), 1)])
    packer = BestFitPacker(10, 2, flush_interval=100, end_row=2)
    assert packer.fill(lane) and packer.fill(lane)
    assert lane.rows == [[(100, 10, 1, True)], [(0, 4, 0, True), (110, 6, 1, False)]]
    assert lane.flushes == [(2, (2,), 0, [])]


def test_concat_tails_put_the_cut_document_first_at_its_offset_in_the_workers_document():
    class Drops:
        def drop(self, i: int, exc: Exception) -> None:
            pass

    whole = image_doc([5, (20,), 4])  # the 22-token image is longer than rows of 10
    kept = fit_row(whole, 10, Drops(), 7)
    assert len(kept) == 9 and kept.doc.removed == ((5, 22),)
    # Rows of 4: document 3 (6 tokens) is cut after 4; `kept` waits, 6 of its tokens
    # out, which is 6 + 22 in the worker's document (the image was left out before 6).
    packer = ConcatPacker(4, 100, carry=[(doc(3, 6), 0, 3, 0), (kept, 1, 7, 6)])
    lane = Lane([])
    packer.fill(lane)
    assert lane.rows == [[(300, 4, 0, True)]]
    assert packer.tails() == [(0, 3, 4), (1, 7, 28)]


def test_concat_flush_points_at_document_ends_and_at_the_lanes_end():
    # Rows of 5, a flush point every row: document 0 fills row 1 exactly (the point
    # is the cursor after it, nothing skipped); row 2 ends inside document 2.
    lane = drain(ConcatPacker(5, flush_interval=1), Lane([5, 3, 4]))
    assert lane.flushes == [(1, (1,), 0, []), (2, (2,), 2, []), (3, (3,), 0, [])]
    # The lane runs out on a flush row: the point is its end.
    assert drain(ConcatPacker(5, flush_interval=2), Lane([3, 4])).flushes == [(2, (2,), 0, [])]


def test_a_carried_document_cut_at_a_flush_row_is_carried_again():
    packer = ConcatPacker(5, flush_interval=1, carry=[(doc(7, 8), 1, 7, 1)])
    lane = Lane([4])
    packer.fill(lane)
    # 5 of the carried document's 7 left: its point carries it on, from token 6.
    assert lane.rows == [[(701, 5, 1, False)]]
    assert lane.flushes == [(1, (0,), 0, [(1, 7, 6)])]


def test_concat_stops_at_its_boundary_row():
    lane = Lane([3, 4, 6])
    packer = ConcatPacker(5, flush_interval=100, end_row=1)
    packer.fill(lane)
    assert lane.flushes == [(1, (2,), 0, [(1, 1, 2)])]  # document 1 cut after 2 tokens
    with pytest.raises(RuntimeError) as info:
        packer.fill(lane)
    assert str(info.value) == "lane asked past its boundary row 1"


def test_concat_starts_a_row_with_an_image_that_would_cross_its_end():
    lane = ImageLane([(image_doc([3, (4,), 2], first=100), 0)])
    drain(ConcatPacker(8, flush_interval=100), lane)
    # The 6-token image at 3 would cross row 1's end at 8: row 1 is 3 tokens (padded).
    assert lane.rows == [[(100, 3, 0, True)], [(103, 8, 0, False)]]
    with pytest.raises(AssertionError) as info:
        drain(ConcatPacker(5, flush_interval=100), ImageLane([(image_doc([(4,), 1]), 0)]))
    assert str(info.value) == "an image block at 0 is longer than a row"


def test_a_row_counts_every_document_starting_in_it_by_source():
    builder = RowBuilder(8, PAD, 2)
    _, _, tokens, starts = builder.build(
        [(doc(1, 2), 1, True), (doc(2, 3), 1, True), (doc(3, 1), 0, False)]
    )
    assert (tokens, starts) == ([1, 5], [0, 2])
