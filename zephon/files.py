"""Files that readers see whole or not at all: the one way this project writes them.

Every file another process may read while it is written (cache entries, index
seek points, checkpoint manifests and loader state, metrics logs, error
records, the dump-folder lock) goes through a temporary file beside its
destination, is flushed to disk, and is renamed over the destination; the
folder is synced so the rename itself survives a power loss. A failure at any
moment leaves either the old file or the new one, and no temporary behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


def _sync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems do not open folders: the rename still happened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(dest: str, durable: bool = True) -> Iterator[str]:
    """A temporary path beside `dest` to write (for writers that take a path);
    renamed over `dest` when the block ends without an error, removed otherwise."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    os.close(fd)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        _sync_folder(folder)


@contextmanager
def atomic_file(dest: str, mode: str = "wb", durable: bool = True) -> Iterator[IO[Any]]:
    """An open temporary file beside `dest` ("wb" or "w"), renamed over it on success."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_file writes a new file: mode 'wb' or 'w', not {mode!r}")
    with atomic_path(dest, durable=False) as tmp:
        encoding = None if "b" in mode else "utf-8"
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
    if durable:
        _sync_folder(os.path.dirname(os.path.abspath(dest)))


def atomic_write(dest: str, data: str | bytes, durable: bool = True) -> None:
    """Write `data` (text as UTF-8) to `dest`, whole or not at all."""
    with atomic_file(dest, "w" if isinstance(data, str) else "wb", durable=durable) as f:
        f.write(data)
