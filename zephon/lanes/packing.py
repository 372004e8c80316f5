"""Packing: turning a lane's documents into rows of seq_len + 1 tokens.

Packers pull documents from their lane (`lane.pick()`: ids, source and
document index), push finished rows as pieces (ids, source, whether the piece
starts its document) with `lane.emit(pieces)` and declare flush points with
`lane.flush_point(snapshot, skip_tokens, carry)`: places where the packer
holds no state, so a resume can restart from the lane's cursors alone.
`RowBuilder` turns a row's pieces into tokens and positions: positions
restart at 0 at every piece, that is at every document start, every row
start and (best_fit) where the rest of a split document follows another
document in a row; padding (pad id, position -1) fills only what the pieces
leave free.

The flush-point contract. A flush point is (lane snapshot, skip_tokens,
carry): the lane's cursors and mixer counts; for `concat`, either the
cursors as they were before the document cut at that row plus how many of
its tokens were emitted (skip_tokens), or the cursors after it plus the
*carry*: (source, document index, tokens emitted) of each document whose
rest is still to come, in order. A packer restarted from a flush point emits
the carried rests first, before any mixing decision, then picks.

Phase boundaries (`end_row`, docs/design.md "Phases"). When the lane's
segment ends, the packer stops exactly at its boundary row R and declares a
flush point there, holding nothing:
- concat cuts the row stream at R; the document cut there is carried (its
  cursors are after it; the next segment emits its rest first). Nothing is
  skipped or repeated, no padding.
- best_fit places one document at a time and may emit several rows at once,
  so before placing a document it counts exactly the rows that placing it
  and then closing every open bin would reach; if that passes R, the document
  is un-picked (the flush point is the snapshot taken before the pick, so the
  document stays first in its source's cursor, or in the pool at a
  lane-count change), every open bin is closed (padded), and rows of padding
  only fill up to R. A placement that reaches R exactly is followed by
  closing the bins. No row crosses R; nothing is carried.

Images (documents of sources with images, images/documents.py). An image is
a block of tokens (start, placeholders, end) that is never split across
rows, so its placeholders always lie in the row's inputs: `concat` closes a
row with padding where an image block would cross its end, and the image
starts the next row (text is still cut anywhere); `best_fit` cuts chunks only
between image blocks. A block longer than a row never reaches a packer (the
lane refuses or drops it). Flush points therefore never fall inside a block,
and the offsets they carry across a boundary are those of the document as the
worker made it (`original_offset`), whatever the lane removed from it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from zephon.images.documents import ImageDocIds, block_cut, image_chunks, original_offset

# A piece of a row: (token ids, source index, whether the piece starts its
# document). Packers build them; rows count tokens and documents by source.
Piece = tuple[np.ndarray, int, bool]


def held_rows(algorithm: str, open_bins: int) -> int:
    """Rows' worth of tokens a lane's packer may hold before emitting them: a
    document is needed that many rows before its offset in the lane's stream
    (phases.SegmentSteps). `concat` emits each row as it fills; `best_fit`
    keeps up to `open_bins` bins open."""
    return open_bins if algorithm == "best_fit" else 0


# A document whose rest a lane emits before its first pick: (source, document
# index, tokens already emitted); with its ids once fetched (CarriedDoc).
Carry = tuple[int, int, int]
CarriedDoc = tuple[np.ndarray, int, int, int]  # (ids, source, document index, emitted)


class RowBuilder:
    """Builds a row of `row_len` tokens from its pieces, and counts it by source."""

    def __init__(self, row_len: int, pad_id: int, num_sources: int):
        self.row_len, self.pad_id, self.num_sources = row_len, pad_id, num_sources
        self._arange = np.arange(row_len, dtype=np.int32)

    def build(self, pieces: list[Piece]) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
        """(tokens, positions, tokens per source, documents starting here per source)."""
        row_len = self.row_len
        tokens = np.empty(row_len, dtype=np.int32)
        positions = np.empty(row_len, dtype=np.int32)
        src_tokens = [0] * self.num_sources
        src_docs = [0] * self.num_sources
        arange = self._arange
        at = 0
        for ids, source, starts in pieces:
            n = len(ids)
            tokens[at : at + n] = ids
            positions[at : at + n] = arange[:n]
            at += n
            src_tokens[source] += n
            if starts:
                src_docs[source] += 1
        if at < row_len:
            tokens[at:] = self.pad_id
            positions[at:] = -1
        return tokens, positions, src_tokens, src_docs


class PackerLane(Protocol):
    """What a packer needs of its lane (LaneStream, or a test's stand-in)."""

    rows_emitted: int

    def pick(self) -> tuple[np.ndarray, int, int] | None: ...
    def unpick(self) -> None: ...
    def emit(self, pieces: list[Piece]) -> None: ...
    def snapshot(self) -> tuple: ...
    def flush_point(self, snapshot: tuple, skip_tokens: int, carry: Sequence[Carry]) -> None: ...


class ConcatPacker:
    """Documents joined with EOS and cut into rows: no padding except at the very end.

    A flush point every `flush_interval` rows records the lane's cursors as they
    were before the document that straddles the row boundary, plus how many of
    its tokens were already emitted; replay re-picks that document and skips them.
    At `end_row` (a phase boundary) and while carried rests are being emitted,
    the flush point carries the cut documents instead (module notes).
    """

    def __init__(
        self,
        row_len: int,
        flush_interval: int,
        skip_tokens: int = 0,
        carry: Sequence[CarriedDoc] = (),
        end_row: int | None = None,
    ):
        self.row_len, self.flush_interval, self.end_row = row_len, flush_interval, end_row
        self.cur: np.ndarray | None = None
        self.cur_source = 0
        self.cur_doc = -1
        self.cur_carried = False
        self.off = 0
        self.cur_pre: tuple = ()
        self.pending_skip = skip_tokens  # set on restore from a mid-document flush point
        self.carry: deque[CarriedDoc] = deque(carry)

    def held(self) -> dict[tuple[int, int], np.ndarray]:
        """Ids of the documents a flush point here carries, by (source, index): the
        next segment's lanes take them from memory instead of reading them again."""
        out = {(s, d): ids for ids, s, d, _ in self.carry}
        if self.cur is not None:
            out[(self.cur_source, self.cur_doc)] = self.cur
        return out

    def tails(self) -> list[Carry]:
        """What a flush point here carries: the current document if it is cut, then
        the carried rests not begun."""
        out = [(s, d, original_offset(ids, off)) for ids, s, d, off in self.carry]
        if self.cur is not None and self.off < len(self.cur):
            out.insert(0, (self.cur_source, self.cur_doc, original_offset(self.cur, self.off)))
        return out

    def fill(self, lane: PackerLane) -> bool:
        """Emit one row; False once the lane's sources are exhausted."""
        if self.end_row is not None and lane.rows_emitted >= self.end_row:
            raise RuntimeError(f"lane asked past its boundary row {self.end_row}")
        pieces: list[Piece] = []
        need = self.row_len
        while need:
            if self.cur is None or self.off == len(self.cur):
                if self.carry:  # carried rests come first, before any mixing decision
                    self.cur, self.cur_source, self.cur_doc, self.off = self.carry.popleft()
                    self.cur_carried = True
                    continue
                pre = lane.snapshot()
                doc = lane.pick()
                if doc is None:
                    self.cur = None
                    break
                (self.cur, self.cur_source, self.cur_doc), self.cur_pre = doc, pre
                self.cur_carried = False
                # A document resumed mid-way (pending_skip) started in an earlier row.
                self.off, self.pending_skip = self.pending_skip, 0
                continue
            off = self.off
            take = min(need, len(self.cur) - off)
            if take == need and type(self.cur) is ImageDocIds:
                fit = block_cut(self.cur, off + need) - off
                if fit < need:  # an image would cross the row end: it starts the next row
                    if not pieces and not fit:  # fit_row lets no such block through
                        raise AssertionError(f"an image block at {off} is longer than a row")
                    if fit:
                        pieces.append((self.cur[off : off + fit], self.cur_source, off == 0))
                    self.off = off + fit
                    break
            pieces.append((self.cur[off : off + take], self.cur_source, off == 0))
            self.off = off + take
            need -= take
        if not pieces:
            return False
        lane.emit(pieces)
        # Record the flush point as soon as its row is out, so a checkpoint
        # taken right at the boundary replays nothing.
        rows = lane.rows_emitted
        if rows == self.end_row:  # the phase boundary: cut here, carry the rest
            lane.flush_point(lane.snapshot(), 0, self.tails())
        elif rows % self.flush_interval == 0:
            if self.cur is not None and self.off < len(self.cur) and not self.cur_carried:
                lane.flush_point(self.cur_pre, self.off, ())
            else:
                lane.flush_point(lane.snapshot(), 0, self.tails())
        return True


class BestFitPacker:
    """K open bins; each document (split into row-sized chunks) goes to the bin
    it fits most tightly. When no bin fits and K are open, the fullest bin is
    closed (padded). Every `flush_interval` rows all bins are closed, so the
    flush point is simply the lane's cursors; at `end_row` (a phase boundary)
    the lane stops exactly there (module notes)."""

    def __init__(
        self,
        row_len: int,
        open_bins: int,
        flush_interval: int,
        start_row: int = 0,
        end_row: int | None = None,
    ):
        self.row_len, self.k, self.flush_interval = row_len, open_bins, flush_interval
        self.end_row = end_row
        self.bins: list[list[Piece]] = []
        self.free: list[int] = []
        self.rows_at_flush = start_row

    def _close(self, lane: PackerLane, i: int) -> None:
        lane.emit(self.bins.pop(i))
        self.free.pop(i)

    def _flush(self, lane: PackerLane) -> None:
        while self.bins:
            self._close(lane, 0)

    def _place(self, lane: PackerLane, chunk: Piece) -> None:
        """One chunk of a document: a whole row at once, else into the tightest bin
        it fits (the fullest bin closed when none fits and K are open). The first
        chunk is placed first (whole rows go out at once), so it is the one that
        starts the document."""
        n = len(chunk[0])
        if n == self.row_len:
            lane.emit([chunk])
            return
        best = -1
        for i, free in enumerate(self.free):
            if free >= n and (best < 0 or free < self.free[best]):
                best = i
        if best < 0:
            if len(self.bins) == self.k:
                self._close(lane, self.free.index(min(self.free)))
            self.bins.append([])
            self.free.append(self.row_len)
            best = len(self.bins) - 1
        self.bins[best].append(chunk)
        self.free[best] -= n
        if self.free[best] == 0:
            self._close(lane, best)

    def rows_placing(self, n: int) -> tuple[int, int]:
        """(rows emitted, bins open after) if a document of n tokens were placed now."""
        full, rest = divmod(n, self.row_len)
        bins = len(self.bins)
        if not rest:
            return full, bins
        fits = [f for f in self.free if f >= rest]
        if fits:
            return (full + 1, bins - 1) if min(fits) == rest else (full, bins)
        return (full + 1, bins) if bins == self.k else (full, bins + 1)

    def rows_placing_chunks(self, lengths: list[int]) -> tuple[int, int]:
        """rows_placing for a document cut into chunks of these lengths (one with
        images, whose chunks end between image blocks): placed as `_place` would."""
        free, rows = list(self.free), 0
        for n in lengths:
            if n == self.row_len:
                rows += 1
                continue
            fits = [i for i, f in enumerate(free) if f >= n]
            if fits:
                best = min(fits, key=lambda i: free[i])  # the first of the tightest
            else:
                if len(free) == self.k:
                    free.pop(free.index(min(free)))
                    rows += 1
                free.append(self.row_len)
                best = len(free) - 1
            free[best] -= n
            if free[best] == 0:
                free.pop(best)
                rows += 1
        return rows, len(free)

    def _stop_at_end(self, lane: PackerLane, snapshot: tuple) -> None:
        """Close every bin, pad up to the boundary row and declare it a flush point."""
        assert self.end_row is not None
        self._flush(lane)
        while lane.rows_emitted < self.end_row:
            lane.emit([])
        self.rows_at_flush = lane.rows_emitted
        lane.flush_point(snapshot, 0, ())

    def fill(self, lane: PackerLane) -> bool:
        """Place one document (possibly emitting rows); False at the end of the data."""
        end = self.end_row
        if end is not None and lane.rows_emitted >= end:
            raise RuntimeError(f"lane asked past its boundary row {end}")
        pre = lane.snapshot() if end is not None else ()
        picked = lane.pick()
        if picked is None:
            self._flush(lane)
            return False
        doc, source, _ = picked
        # A document with images is cut only between its image blocks.
        cuts = image_chunks(doc, self.row_len) if type(doc) is ImageDocIds else None
        if end is not None:
            if cuts is None:
                rows, bins = self.rows_placing(len(doc))
            else:
                rows, bins = self.rows_placing_chunks([b - a for a, b in cuts])
            if lane.rows_emitted + rows + bins > end:  # it would cross the boundary
                lane.unpick()
                self._stop_at_end(lane, pre)
                return True
        if cuts is None:
            for a in range(0, len(doc), self.row_len):
                self._place(lane, (doc[a : a + self.row_len], source, a == 0))
        else:
            for a, b in cuts:
                self._place(lane, (doc[a:b], source, a == 0))
        if end is not None and lane.rows_emitted + len(self.bins) >= end:
            self._stop_at_end(lane, lane.snapshot())
        elif lane.rows_emitted - self.rows_at_flush >= self.flush_interval:
            self._flush(lane)
            self.rows_at_flush = lane.rows_emitted
            lane.flush_point(lane.snapshot(), 0, ())
        return True
