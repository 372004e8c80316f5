"""Remote source files through fsspec (`s3://`, `gs://`, `hf://`, any installed
protocol), read in byte ranges with retries and a bounded local cache.

- Identity: the object's ETag (or size and mtime when the store has none),
  so cache entries and checkpoint fingerprints follow the object's content.
- Reads: `pread` fetches the aligned `CHUNK`-sized pieces a range needs and
  keeps them in the cache (`remote/`), evicting the least recently used
  pieces once the cache exceeds its limit. `open()` gives a seekable file
  that reads ranges directly, uncached: the one streaming pass that builds an
  index, gzip seek-point reads, and Parquet footers and row groups.
- Failures: every request is retried with exponential back-off; what still
  fails raises a DataError naming the URL.

Credentials and endpoints come from the usual places (for S3: the
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL environment
variables, ~/.aws) or from the recipe's `[storage]` options.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from zephon.errors import DataError
from zephon.files import atomic_write
from zephon.sources.cache import cache_key, default_cache_dir

T = TypeVar("T")

CHUNK = 8 << 20  # bytes per cached piece of a remote object
ATTEMPTS = 6
BACKOFF_S = 0.2  # first wait; doubles up to MAX_BACKOFF_S
MAX_BACKOFF_S = 5.0
DEFAULT_CACHE_GB = 20.0
# Not worth retrying: the object or the permission is missing.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)

_filesystems: dict[str, Any] = {}


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """(fsspec keyword arguments, cache limit in GB) from a source's storage options."""
    opts = dict(options)
    limit = opts.pop("cache_limit_gb", None)
    if limit is None:
        limit = float(os.environ.get("ZEPHON_REMOTE_CACHE_GB", DEFAULT_CACHE_GB))
    return opts, float(limit)


def filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """The fsspec file system of a URL (one per protocol and options) and its path."""
    import fsspec

    protocol = url.split("://", 1)[0]
    key = f"{protocol}|{sorted(options.items())}"
    if key not in _filesystems:
        try:
            _filesystems[key] = fsspec.filesystem(protocol, **options)
        except (ImportError, ValueError) as exc:
            raise DataError(
                f"{url}: no file system for '{protocol}://' ({exc}); install its fsspec "
                "package (s3fs, gcsfs, huggingface_hub...)"
            ) from None
    fs = _filesystems[key]
    return fs, fs._strip_protocol(url)


def retry(url: str, what: str, fn: Callable[[], T]) -> T:
    """fn(), retried with exponential back-off; a DataError naming the URL at the end."""
    wait = BACKOFF_S
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return fn()
        except _PERMANENT as exc:
            raise DataError(f"{url}: {what} failed: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # network errors come in many types; all are worth a retry
            if attempt == ATTEMPTS:
                raise DataError(
                    f"{url}: {what} failed after {ATTEMPTS} attempts: {type(exc).__name__}: {exc}"
                ) from None
            time.sleep(wait)
            wait = min(wait * 2, MAX_BACKOFF_S)
    raise AssertionError("unreachable")


def glob(pattern: str, options: dict[str, Any]) -> list[str]:
    """Sorted URLs matching a remote pattern (or the URL itself if it exists)."""
    fs, path = filesystem(pattern, split_options(options)[0])
    protocol = pattern.split("://", 1)[0]
    if any(c in path for c in "*?["):
        found = retry(pattern, "listing", lambda: fs.glob(path))
    else:
        found = [path] if retry(pattern, "lookup", lambda: fs.exists(path)) else []
    return sorted(f"{protocol}://{p}" for p in found)


def content_version(info: dict[str, Any], size: int) -> str:
    """What identifies an object's content in a store's metadata: its ETag (S3),
    generation or hash (GCS), blob id or LFS hash (Hugging Face Hub), else size
    and modification time."""
    lfs = info.get("lfs") if isinstance(info.get("lfs"), dict) else {}
    for key, value in (
        ("etag", info.get("ETag") or info.get("etag")),
        ("generation", info.get("generation")),
        ("md5", info.get("md5Hash")),
        ("sha256", lfs.get("sha256")),
        ("blob", info.get("blob_id")),
    ):
        if value:
            return f"{key}:{str(value).strip(chr(34))}"
    mtime = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
    return f"size:{size}|mtime:{mtime}"


class RemoteObject:
    def __init__(self, url: str, options: dict[str, Any], cache_dir: str | None = None):
        self.url = url
        fs_options, limit_gb = split_options(options)
        self.fs, self.path = filesystem(url, fs_options)
        self.fs.invalidate_cache(self.path)  # a listing cached by the glob may be stale
        info = retry(url, "reading metadata", lambda: self.fs.info(self.path))
        if info.get("type") == "directory":
            raise DataError(f"{url}: is a folder; expected a file")
        self.size = int(info["size"])
        self.version = content_version(info, self.size)
        self.cache_dir = os.path.join(cache_dir or default_cache_dir(), "remote")
        self.limit = int(limit_gb * (1 << 30))
        self.key = cache_key(url, self.version)

    def identity(self) -> tuple[Any, ...]:
        return (self.url, self.version)

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes [start, end) straight from the store, retried; checked for length."""

        def get() -> bytes:
            data = self.fs.cat_file(self.path, start=start, end=end)
            if len(data) != end - start:
                raise OSError(f"short read: {len(data)} of {end - start} bytes at {start}")
            return data

        if end <= start:
            return b""
        return retry(self.url, f"reading bytes {start}-{end}", get)

    def _piece(self, k: int) -> bytes:
        path = os.path.join(self.cache_dir, self.key, f"{k}")
        try:
            with open(path, "rb") as f:
                data = f.read()
            os.utime(path)  # recently used: evicted last
            return data
        except FileNotFoundError:
            pass
        data = self.fetch(k * CHUNK, min((k + 1) * CHUNK, self.size))
        atomic_write(path, data)
        self._evict()
        return data

    def _evict(self) -> None:
        """Drop least recently used pieces (of any object) until the cache fits its limit."""
        entries = []
        for root, _, files in os.walk(self.cache_dir):
            for name in files:
                p = os.path.join(root, name)
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    continue  # evicted by another process meanwhile
                entries.append((st.st_mtime, st.st_size, p))
        total = sum(e[1] for e in entries)
        for _, size, p in sorted(entries):
            if total <= self.limit:
                break
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
            total -= size

    def pread(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end <= offset:
            return b""
        pieces = [self._piece(k) for k in range(offset // CHUNK, (end - 1) // CHUNK + 1)]
        blob = b"".join(pieces)
        start = offset - (offset // CHUNK) * CHUNK
        return blob[start : start + (end - offset)]

    def sample(self, offset: int, n: int) -> bytes:
        """Bytes [offset, offset + n) by one ranged request, not through the piece
        cache: a content fingerprint's blocks (content.py) are small and read once."""
        return self.fetch(offset, min(offset + n, self.size))

    def open(self) -> io.BufferedReader:
        # Small buffer: Parquet footers and gzip seeks read little; big reads bypass it.
        return io.BufferedReader(_RangeFile(self), buffer_size=1 << 20)


class _RangeFile(io.RawIOBase):
    """A seekable, read-only file over a remote object's range reads."""

    def __init__(self, obj: RemoteObject):
        self.obj, self.pos = obj, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.obj.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buf: Any) -> int:
        end = min(self.pos + len(buf), self.obj.size)
        if end <= self.pos:
            return 0
        data = self.obj.fetch(self.pos, end)
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)
