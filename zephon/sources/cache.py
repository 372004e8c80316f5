"""The on-disk cache of derived source metadata: where it lives, how entries
are named and how they are written.

Entries (JSONL line indexes, gzip seek points, remote byte ranges) are
derived from a source file and keyed by what identifies that file's content
(path with size and mtime, or a remote object's ETag), so a changed file gets
a new entry instead of a stale one. Entries are written through a temporary
file and renamed, so a crash never leaves half an entry, and built under a
file lock, so the ranks and processes of one node wait for a single builder
and then read its result instead of scanning the data each.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import TypeVar

from filelock import FileLock, Timeout

T = TypeVar("T")

# Bump when the layout of any derived entry changes: old entries are then ignored.
INDEX_VERSION = 3  # 3: (n, 2) start/end rows, built in chunks; gzip seek points


def default_cache_dir() -> str:
    env = os.environ.get("ZEPHON_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zephon")


def cache_key(*identity: object) -> str:
    """A short, stable file name for an entry derived from `identity`."""
    raw = "|".join(str(p) for p in (INDEX_VERSION, *identity))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def build_once(
    cache_dir: str, key: str, outputs: list[str], build: Callable[[], None], wait: bool = True
) -> bool:
    """Run `build` (which writes every path in `outputs`) unless they all exist.

    Concurrent callers on one node (ranks, worker processes) serialise on a
    lock file: the first builds, the others wait and then find the outputs.
    With wait=False a caller that finds the lock taken returns False at once
    (to build another file meanwhile); otherwise the outputs exist on return.
    """
    if all(os.path.exists(p) for p in outputs):
        return True
    lock_dir = os.path.join(cache_dir, "locks")
    os.makedirs(lock_dir, exist_ok=True)
    try:
        with FileLock(os.path.join(lock_dir, key + ".lock"), timeout=-1 if wait else 0):
            if not all(os.path.exists(p) for p in outputs):
                build()
    except Timeout:
        return False
    return True
