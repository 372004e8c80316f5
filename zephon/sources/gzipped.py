"""Random access into gzip files without a decompressed copy.

The first pass (the one that indexes JSONL lines anyway) decompresses the
file with `indexed_gzip`, which records a seek point every `SPACING`
decompressed bytes (the deflate state plus a 32 KiB window); the seek points
are saved in the cache. Later reads of a byte range of the decompressed
stream start from the nearest seek point, so they decompress at most
`SPACING` bytes more than they return, and the cache holds about
32 KiB / SPACING of the data (3% at 1 MiB) instead of a full copy.

Reads go through the chunks between consecutive seek points: a missing chunk
is decompressed whole from its own seek point (nothing decompressed is thrown
away) and kept in one process-wide LRU of at most `CHUNK_CACHE_BYTES`, so the
many small reads that land in one chunk (blocks of short documents, lanes
reading neighbouring blocks) decompress it once.

indexed_gzip stops quietly at a truncated end of file, so the scan checks
that the decompressed size matches the gzip trailer (ISIZE); when it does not
(a truncated file, or a valid file of several gzip members such as bgzip
output) the file is decompressed once more with Python's gzip module, which
raises on truncation and verifies every member's CRC.
"""

from __future__ import annotations

import gzip
import struct
import threading
import zlib
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from zephon.errors import DataError
from zephon.files import atomic_path
from zephon.sources.storage import ByteObject

SPACING = 1 << 20  # decompressed bytes between seek points
READ_CHUNK = 4 << 20
CHUNK_CACHE_BYTES = 32 << 20  # decompressed chunks kept, all gzip files together


class _ChunkCache:
    """A byte-bounded LRU of decompressed chunks, shared by every gzip file."""

    def __init__(self, limit: int):
        self.limit, self.size = limit, 0
        self.items: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> bytes | None:
        with self.lock:
            data = self.items.get(key)
            if data is not None:
                self.items.move_to_end(key)
            return data

    def put(self, key: tuple[str, int], data: bytes) -> None:
        with self.lock:
            if key in self.items or len(data) > self.limit:
                return
            self.items[key] = data
            self.size += len(data)
            while self.size > self.limit:
                self.size -= len(self.items.popitem(last=False)[1])


_CHUNKS = _ChunkCache(CHUNK_CACHE_BYTES)


def clear_chunk_cache() -> None:
    """Drop every decompressed chunk (benchmarks start cold with it)."""
    with _CHUNKS.lock:
        _CHUNKS.items.clear()
        _CHUNKS.size = 0


def _error(url: str, exc: BaseException) -> DataError:
    return DataError(f"{url}: cannot decompress gzip file: {exc}")


def _check_complete(obj: ByteObject, total: int) -> None:
    """Raise unless `total` decompressed bytes is all the file holds."""
    if obj.size >= 18:  # smallest gzip member: 10-byte header, 2-byte block, 8-byte trailer
        with obj.open() as f:  # not pread: a remote pread fetches a whole cache piece
            f.seek(obj.size - 4)
            (isize,) = struct.unpack("<I", f.read(4))
        if isize == total % (1 << 32):
            return
    # Several members, or a damaged file: let Python's gzip decide.
    n = 0
    try:
        with obj.open() as raw, gzip.GzipFile(fileobj=raw) as f:
            while chunk := f.read(READ_CHUNK):
                n += len(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise _error(obj.url, exc) from None
    if n != total:
        raise _error(obj.url, f"{n} bytes decompressed by gzip, {total} by indexed_gzip")


def scan(obj: ByteObject, seek_points_dest: str) -> Iterator[bytes]:
    """Yield the decompressed stream in chunks; at its end save the seek points."""
    import indexed_gzip

    total = 0
    try:
        with obj.open() as raw:
            f = indexed_gzip.IndexedGzipFile(fileobj=raw, spacing=SPACING)
            try:
                while chunk := f.read(READ_CHUNK):
                    total += len(chunk)
                    yield chunk
                _check_complete(obj, total)
                # Completes the seek points the read left (cheap: the data is decoded,
                # but a file shorter than SPACING may have none yet).
                f.build_full_index()
                with atomic_path(seek_points_dest) as tmp:
                    f.export_index(tmp)
            finally:
                f.close()
    except DataError:
        raise
    except Exception as exc:  # indexed_gzip raises ZranError, OSError, ValueError...
        raise _error(obj.url, exc) from None


class GzipRandomAccess:
    """Byte ranges of the decompressed stream of a gzip file, from its seek points."""

    def __init__(self, obj: ByteObject, seek_points: str):
        self.obj, self.seek_points = obj, seek_points
        self._lock = threading.Lock()  # one decompressor, shared by worker threads
        self._file: Any = None
        self._raw: Any = None
        self._starts: list[int] | None = None  # decompressed offsets of the seek points

    def _open(self) -> Any:
        import indexed_gzip

        if self._file is None:
            self._raw = self.obj.open()
            # A small read-ahead buffer: a block read is one seek and one large read,
            # and the default (4 x SPACING) would decompress megabytes nobody asked for.
            self._file = indexed_gzip.IndexedGzipFile(
                fileobj=self._raw,
                index_file=self.seek_points,
                auto_build=False,
                buffer_size=1 << 16,
            )
        return self._file

    def pread(self, offset: int, n: int) -> bytes:
        """Up to `n` bytes of the decompressed stream from `offset` (fewer at its end)."""
        end = offset + n
        out: list[bytes] = []
        with self._lock:
            try:
                f = self._open()
                if self._starts is None:
                    self._starts = [int(p[0]) for p in f.seek_points()] or [0]
                i = max(bisect_right(self._starts, offset) - 1, 0)
                at = offset
                while at < end and i < len(self._starts):
                    chunk = self._chunk(f, i)
                    base = self._starts[i]
                    piece = chunk[max(at - base, 0) : end - base]
                    out.append(piece)
                    at += len(piece)
                    i += 1
            except DataError:
                raise
            except Exception as exc:
                raise _error(self.obj.url, exc) from None
        return out[0] if len(out) == 1 else b"".join(out)

    def _chunk(self, f: Any, i: int) -> bytes:
        """The decompressed bytes from seek point i to the next one (the last: to the end)."""
        key = (self.seek_points, i)
        data = _CHUNKS.get(key)
        if data is None:
            starts = self._starts
            assert starts is not None
            f.seek(starts[i])
            data = f.read(starts[i + 1] - starts[i]) if i + 1 < len(starts) else f.read()
            _CHUNKS.put(key, data)
        return data

    def stream(self) -> Iterator[bytes]:
        """The decompressed stream from the start (used on error paths only)."""
        with self.obj.open() as raw, gzip.GzipFile(fileobj=raw) as f:
            while chunk := f.read(READ_CHUNK):
                yield chunk
