"""`bad_records = "drop"`: a reader that turns unreadable records into empty documents.

The wrapper reads a range as usual; only when that raises a DataError does it
read the range record by record (`read_or_recover`, which `zephon validate
--scan` uses too) and put an empty value in place of each bad record. An empty value tokenizes to a document of just EOS at the record's
own index, so the shuffle, the blocks and every other lane's reads stay
exactly as they were; only the lane that owns the record sees it vanish.
Out-of-vocabulary ids of pretokenized sources are not read errors and still
stop the run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from zephon.errors import DataError
from zephon.sources import SourceReader

logger = logging.getLogger("zephon")

POLICIES = ("error", "drop")


class DroppingReader:
    """A SourceReader whose bad records read as empty documents (and are counted)."""

    def __init__(self, reader: SourceReader):
        self.reader = reader
        self.spec = reader.spec
        self.num_docs = reader.num_docs
        self.dropped: dict[int, str] = {}  # document index -> why
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Everything but read_range (e.g. remote_versions) is the wrapped reader's.
        return getattr(self.reader, name)

    def read_range(self, start: int, end: int) -> list[Any]:
        return read_or_recover(self.reader, start, end, self._drop)

    def drop(self, i: int, exc: DataError) -> None:
        """Record document `i` as dropped for `exc` (an image found bad after reading)."""
        self._drop(i, exc)

    def _drop(self, i: int, exc: DataError) -> Any:
        with self._lock:
            if i not in self.dropped:
                self.dropped[i] = str(exc)
                logger.warning(f"bad_records = drop: dropped {exc}")
        return [] if self.spec.pretokenized else ""


def read_or_recover(
    reader: Any, start: int, end: int, on_bad: Callable[[int, DataError], Any]
) -> list[Any]:
    """Values of documents [start, end): one read_range, and only if that raises a
    DataError, record by record, with `on_bad(index, error)` in place of each bad
    record (`zephon validate --scan` lists them, `drop` empties them)."""
    try:
        return reader.read_range(start, end)
    except DataError:
        pass
    out: list[Any] = []
    for i in range(start, end):
        try:
            out.extend(reader.read_range(i, i + 1))
        except DataError as exc:
            out.append(on_bad(i, exc))
    return out


def with_policy(reader: SourceReader, policy: str) -> SourceReader | DroppingReader:
    """The reader to use under a recipe's bad_records policy."""
    return DroppingReader(reader) if policy == "drop" else reader


def dropped_state(readers: list[Any]) -> dict[str, list[int]]:
    """{source name: sorted dropped document indices} (for the loader state)."""
    return {r.spec.name: sorted(r.dropped) for r in readers if isinstance(r, DroppingReader)}


def restore_dropped(readers: list[Any], saved: dict[str, list[int]]) -> None:
    for r in readers:
        if isinstance(r, DroppingReader):
            for i in saved.get(r.spec.name, []):
                r.dropped.setdefault(int(i), "dropped before the resume")


def dropped_count(readers: list[Any]) -> int:
    return sum(len(r.dropped) for r in readers if isinstance(r, DroppingReader))
