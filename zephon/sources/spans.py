"""Cutting a document range at part boundaries (files of a source, row groups of a file)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def spans(starts: np.ndarray, a: int, b: int) -> Iterator[tuple[int, int, int, int]]:
    """For documents [a, b) over parts whose first documents are `starts` (cumulative,
    ending with the total): (part, part's first document, start, end) of each piece."""
    p = int(np.searchsorted(starts, a, side="right")) - 1
    while a < b:
        first = int(starts[p])
        take = min(b, int(starts[p + 1]))
        yield p, first, a, take
        a, p = take, p + 1
