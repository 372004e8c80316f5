"""Byte access to one source file, local or remote, behind one small interface.

Format readers see an object with a `url`, an `identity` (what the cache is
keyed by), a `size`, `pread` for a byte range, `sample` for a small one-off
range (read straight, never cached) and `open` for a seekable binary file. A local path is read with
plain file calls; a URL (`s3://`, `gs://`, `hf://`...) goes through fsspec
(see remote.py), so every format reads local and remote data the same way.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO, Protocol

from zephon.errors import DataError


class ByteObject(Protocol):
    url: str
    size: int

    def identity(self) -> tuple[Any, ...]: ...

    def pread(self, offset: int, n: int) -> bytes: ...

    def sample(self, offset: int, n: int) -> bytes: ...

    def open(self) -> BinaryIO: ...


def is_remote(path: str) -> bool:
    """True for URLs with a protocol (`s3://...`); `file://` counts as local."""
    return "://" in path and not path.startswith("file://")


class LocalObject:
    """A file on a local (or network-mounted) file system."""

    def __init__(self, path: str):
        self.url = path
        try:
            st = os.stat(path)
        except OSError as exc:
            raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
        self.size, self._mtime = st.st_size, st.st_mtime_ns

    def identity(self) -> tuple[Any, ...]:
        return (os.path.abspath(self.url), self.size, self._mtime)

    def pread(self, offset: int, n: int) -> bytes:
        with open(self.url, "rb") as f:
            f.seek(offset)
            return f.read(n)

    def sample(self, offset: int, n: int) -> bytes:
        """A small one-off read (content fingerprints, content.py)."""
        return self.pread(offset, n)

    def open(self) -> BinaryIO:
        return open(self.url, "rb")


def open_object(
    path: str, storage: dict[str, Any] | None = None, cache_dir: str | None = None
) -> ByteObject:
    """The byte object of a local path or a remote URL (fsspec `storage` options)."""
    if is_remote(path):
        from zephon.sources.remote import RemoteObject

        return RemoteObject(path, storage or {}, cache_dir)
    return LocalObject(path)
