"""A stand-in lane of numbered documents for the packer tests (test_packing,
test_phases): document d's token j is d * 1000 + j, so every row can be traced
back to what was packed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zephon.lanes.packing import Piece, RowBuilder

ROW = 16
PAD = -7
SOURCES = 2


def documents(lengths: list[int]) -> list[tuple[np.ndarray, int]]:
    return [
        (np.arange(d * 1000, d * 1000 + n, dtype=np.int32), d % SOURCES)
        for d, n in enumerate(lengths)
    ]


DOCS = documents([5, 40, 3, 16, 9, 1, 33, 12, 7, 2, 20, 11, 6, 14, 4, 30, 8, 10, 15, 13] * 3)


class ListDocuments:
    """The document side of a stand-in lane: documents (ids, source) from a list, the
    position being the list index. Subclasses say what a row and a flush point record."""

    docs: list[tuple[np.ndarray, int]]
    at: int

    def pick(self) -> tuple[np.ndarray, int, int] | None:
        if self.at == len(self.docs):
            return None
        self.at += 1
        ids, source = self.docs[self.at - 1]
        return ids, source, self.at - 1

    def unpick(self) -> None:
        self.at -= 1

    def snapshot(self) -> tuple:
        return (self.at,)


class ListLane(ListDocuments):
    """A lane whose documents come from a list; its rows are built as the loader's are."""

    def __init__(self, docs: list[tuple[np.ndarray, int]], at: int = 0, rows_emitted: int = 0):
        self.docs, self.at, self.rows_emitted = docs, at, rows_emitted
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []
        self.flushes: list[tuple[int, int, int]] = []  # (row, list index, skip tokens)
        self.builder = RowBuilder(ROW, PAD, SOURCES)

    def emit(self, pieces: list[Piece]) -> None:
        tokens, positions, _, _ = self.builder.build(pieces)
        self.rows.append((tokens, positions))
        self.rows_emitted += 1

    def flush_point(self, snapshot: tuple, skip_tokens: int, carry: Sequence = ()) -> None:
        assert not carry  # no phase boundary here
        self.flushes.append((self.rows_emitted, snapshot[0], skip_tokens))
