"""The ids of long documents, kept so that a document drawn again is not tokenized again.

A long document (LONG_CHARS characters or more) costs much more to tokenize
than to keep: when a lane draws it again (another epoch, or another lane of a
small source) its ids come from here. The ids are a pure function of the
data and the tokenizer, so serving them from the cache changes no byte. The
cache holds at most LONG_CACHE_BYTES, least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

# Documents at least this long keep their ids in the cache.
LONG_CHARS = 1 << 16
LONG_CACHE_BYTES = 64 << 20


class LongDocCache:
    """Token ids of long documents by (source, document index), bounded in bytes."""

    def __init__(self, max_bytes: int = LONG_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._ids: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._bytes = 0

    def get(self, source: int, doc_id: int) -> np.ndarray | None:
        """The document's ids if they are kept (it becomes the most recently used)."""
        ids = self._ids.get((source, doc_id))
        if ids is not None:
            self._ids.move_to_end((source, doc_id))
        return ids

    def remember(self, source: int, doc_id: int, ids: np.ndarray) -> None:
        """Keep the ids of a document just tokenized (unless half the cache or more)."""
        if ids.nbytes > self.max_bytes // 2:
            return
        if ids.base is not None:  # a view of a whole call's ids: keep only its own
            ids = ids.copy()
        self._ids[(source, doc_id)] = ids
        self._bytes += ids.nbytes
        while self._bytes > self.max_bytes:
            _, old = self._ids.popitem(last=False)
            self._bytes -= old.nbytes
