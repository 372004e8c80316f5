"""Packing: turning a lane's documents into rows of seq_len + 1 tokens.

Packers pull documents from their lane (`lane.pick()`: ids and source), push
finished rows as pieces (ids, source, whether the piece starts its document)
with `lane.emit(pieces)` and declare flush points with
`lane.flush_point(snapshot, skip_tokens)`: places where the packer holds no
state, so a resume can restart from the lane's cursors alone. `RowBuilder`
turns a row's pieces into tokens and positions: positions restart at 0 at
every piece, that is at every document start, every row start and (best_fit)
where the rest of a split document follows another document in a row;
padding (pad id, position -1) fills only what the pieces leave free.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

# A piece of a row: (token ids, source index, whether the piece starts its
# document). Packers build them; rows count tokens and documents by source.
Piece = tuple[np.ndarray, int, bool]


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

    def pick(self) -> tuple[np.ndarray, int] | None: ...
    def emit(self, pieces: list[Piece]) -> None: ...
    def snapshot(self) -> tuple: ...
    def flush_point(self, snapshot: tuple, skip_tokens: int) -> None: ...


class ConcatPacker:
    """Documents joined with EOS and cut into rows: no padding except at the very end.

    A flush point every `flush_interval` rows records the lane's cursors as they
    were before the document that straddles the row boundary, plus how many of
    its tokens were already emitted; replay re-picks that document and skips them.
    """

    def __init__(self, row_len: int, flush_interval: int, skip_tokens: int = 0):
        self.row_len, self.flush_interval = row_len, flush_interval
        self.cur: np.ndarray | None = None
        self.cur_source = 0
        self.off = 0
        self.cur_pre: tuple = ()
        self.pending_skip = skip_tokens  # set on restore from a mid-document flush point

    def fill(self, lane: PackerLane) -> bool:
        """Emit one row; False once the lane's sources are exhausted."""
        pieces: list[Piece] = []
        need = self.row_len
        while need:
            if self.cur is None or self.off == len(self.cur):
                pre = lane.snapshot()
                doc = lane.pick()
                if doc is None:
                    self.cur = None
                    break
                (self.cur, self.cur_source), self.cur_pre = doc, pre
                # A document resumed mid-way (pending_skip) started in an earlier row.
                self.off, self.pending_skip = self.pending_skip, 0
                continue
            off = self.off
            take = min(need, len(self.cur) - off)
            pieces.append((self.cur[off : off + take], self.cur_source, off == 0))
            self.off = off + take
            need -= take
        if not pieces:
            return False
        lane.emit(pieces)
        # Record the flush point as soon as its row is out, so a checkpoint
        # taken right at the boundary replays nothing.
        if lane.rows_emitted % self.flush_interval == 0:
            if self.cur is not None and self.off < len(self.cur):
                lane.flush_point(self.cur_pre, self.off)
            else:
                lane.flush_point(lane.snapshot(), 0)
        return True


class BestFitPacker:
    """K open bins; each document (split into row-sized chunks) goes to the bin
    it fits most tightly. When no bin fits and K are open, the fullest bin is
    closed (padded). Every `flush_interval` rows all bins are closed, so the
    flush point is simply the lane's cursors."""

    def __init__(self, row_len: int, open_bins: int, flush_interval: int, start_row: int = 0):
        self.row_len, self.k, self.flush_interval = row_len, open_bins, flush_interval
        self.bins: list[list[Piece]] = []
        self.free: list[int] = []
        self.rows_at_flush = start_row

    def _close(self, lane: PackerLane, i: int) -> None:
        lane.emit(self.bins.pop(i))
        self.free.pop(i)

    def _flush(self, lane: PackerLane) -> None:
        while self.bins:
            self._close(lane, 0)

    def fill(self, lane: PackerLane) -> bool:
        """Place one document (possibly emitting rows); False at the end of the data."""
        picked = lane.pick()
        if picked is None:
            self._flush(lane)
            return False
        doc, source = picked
        for a in range(0, len(doc), self.row_len):
            ids = doc[a : a + self.row_len]
            n = len(ids)
            # The first chunk is emitted first (whole rows go out at once), so it
            # is the one that starts the document.
            chunk = (ids, source, a == 0)
            if n == self.row_len:
                lane.emit([chunk])
                continue
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
        if lane.rows_emitted - self.rows_at_flush >= self.flush_interval:
            self._flush(lane)
            self.rows_at_flush = lane.rows_emitted
            lane.flush_point(lane.snapshot(), 0)
        return True
