"""Source readers: random access to the documents of one recipe source.

A reader exposes `num_docs` and `read_range(start, end)`, returning the text
(or token ids) of documents [start, end) in file order. Readers are shared by
all lanes and worker threads, so they keep no cursor of their own: a lane's
position is its own business (see lanes.py).

JSONL files are indexed once (byte offset of every non-blank line) and the
index is cached on disk keyed by path, size and mtime; gzip files are
decompressed once into the cache so they can be read by offset too. Parquet
is read by row group; Hugging Face datasets are Arrow-backed and sliced.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import mmap
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.recipe import SourceSpec

INDEX_VERSION = 2  # 2: whitespace-only lines of any length are blank


def default_cache_dir() -> str:
    env = os.environ.get("ZEPHON_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "zephon")


def _file_key(path: str) -> str:
    st = os.stat(path)
    raw = f"{INDEX_VERSION}|{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _atomic_write(dest: str, write: Any) -> None:
    """Write through a temporary file so a crash never leaves a half cache entry."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _line_number(path: str, offset: int) -> int:
    """1-based line number of a byte offset (only computed on the error path)."""
    with open(path, "rb") as f:
        return f.read(offset).count(b"\n") + 1


def _check_value(value: Any, spec: SourceSpec, where: Any) -> Any:
    """Check a document's value; `where` is a string or a callable giving one
    (so the costly location is only computed when there is an error)."""
    if _value_ok(value, spec):
        return value
    where = where() if callable(where) else where
    if spec.pretokenized:
        got = type(value).__name__
        if isinstance(value, list):
            k = next(k for k, t in enumerate(value) if not _value_ok([t], spec))
            got = f"{value[k]!r} at index {k}"
        raise DataError(
            f"{where}: field '{spec.token_field}' must be a list of non-negative "
            f"token ids, got {got}"
        )
    raise DataError(
        f"{where}: field '{spec.text_field}' must be a string, got {type(value).__name__}"
    )


def _value_ok(value: Any, spec: SourceSpec) -> bool:
    if spec.pretokenized:
        return isinstance(value, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
        )
    return isinstance(value, str)


class _JsonlFile:
    def __init__(self, path: str, spec: SourceSpec, cache_dir: str):
        self.origin = path
        self.spec = spec
        self.path = self._plain_copy(path, cache_dir) if path.endswith(".gz") else path
        self.starts, self.ends = self._index(cache_dir)

    @staticmethod
    def _plain_copy(path: str, cache_dir: str) -> str:
        dest = os.path.join(cache_dir, "gunzip", _file_key(path) + ".jsonl")
        if not os.path.exists(dest):

            def write(out: Any) -> None:
                try:
                    with gzip.open(path, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                except (OSError, EOFError) as exc:
                    raise DataError(f"{path}: cannot decompress gzip file: {exc}") from None

            _atomic_write(dest, write)
        return dest

    def _index(self, cache_dir: str) -> tuple[np.ndarray, np.ndarray]:
        dest = os.path.join(cache_dir, "index", _file_key(self.origin) + ".npy")
        if os.path.exists(dest):
            both = np.load(dest)
            return both[0], both[1]
        size = os.path.getsize(self.path)
        if size == 0:
            starts = ends = np.zeros(0, dtype=np.int64)
        else:
            with (
                open(self.path, "rb") as f,
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm,
            ):
                buf = np.frombuffer(mm, dtype=np.uint8)
                try:
                    newlines = np.flatnonzero(buf == 10).astype(np.int64)
                    starts = np.concatenate([[0], newlines + 1])
                    ends = np.concatenate([newlines, [size]])
                    # Lines of only whitespace are blank too: check only the short ones and
                    # those that start with whitespace (a JSON record starts with '{').
                    first = buf[np.minimum(starts, size - 1)]
                finally:
                    del buf  # else an error here becomes "BufferError: cannot close mmap"
                keep = ends > starts
                maybe_blank = (ends - starts < 8) | np.isin(first, (9, 11, 12, 13, 32))
                for i in np.flatnonzero(keep & maybe_blank):
                    if not mm[starts[i] : ends[i]].strip():
                        keep[i] = False
                starts, ends = starts[keep], ends[keep]
        _atomic_write(dest, lambda f: np.save(f, np.stack([starts, ends])))
        return starts, ends

    def __len__(self) -> int:
        return len(self.starts)

    def read(self, a: int, b: int) -> list[Any]:
        field = self.spec.token_field or self.spec.text_field
        lo, hi = int(self.starts[a]), int(self.ends[b - 1])
        with open(self.path, "rb") as f:
            f.seek(lo)
            blob = f.read(hi - lo)
        out = []
        for i in range(a, b):
            line = blob[int(self.starts[i]) - lo : int(self.ends[i]) - lo]
            try:
                # Decode as UTF-8 ourselves: json.loads(bytes) would guess UTF-16/32 from
                # the first bytes. A byte order mark is allowed at the start of the file.
                text = line.decode("utf-8")
                bom = text[:1] == "\ufeff" and int(self.starts[i]) == 0
                record = json.loads(text[1:] if bom else text)
            except UnicodeDecodeError as exc:
                where = f"{self.origin}:{_line_number(self.path, int(self.starts[i]))}"
                raise DataError(
                    f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
                ) from None
            except json.JSONDecodeError as exc:
                where = f"{self.origin}:{_line_number(self.path, int(self.starts[i]))}"
                raise DataError(
                    f"{where}: not valid JSON ({exc.msg}, column {exc.colno})"
                ) from None
            if not isinstance(record, dict) or field not in record:
                where = f"{self.origin}:{_line_number(self.path, int(self.starts[i]))}"
                have = (
                    ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
                )
                raise DataError(f"{where}: no field '{field}' (record has: {have})")
            start = int(self.starts[i])
            out.append(
                _check_value(
                    record[field],
                    self.spec,
                    lambda start=start: f"{self.origin}:{_line_number(self.path, start)}",
                )
            )
        return out


class _ParquetFile:
    """Reads one Parquet file by row group: never the whole file at once."""

    _CACHE_GROUPS = 2

    def __init__(self, path: str, spec: SourceSpec):
        import pyarrow.parquet as pq

        self.path, self.spec = path, spec
        self.field = spec.token_field or spec.text_field
        try:
            meta = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise DataError(f"{path}: cannot open as Parquet: {exc}") from None
        names = meta.schema_arrow.names
        if self.field not in names:
            raise DataError(f"{path}: no column '{self.field}' (columns: {', '.join(names)})")
        rows = [meta.metadata.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self._local = threading.local()

    def __len__(self) -> int:
        return int(self.group_starts[-1])

    def _group(self, g: int) -> list[Any]:
        import pyarrow.parquet as pq

        loc = self._local
        if not hasattr(loc, "file"):
            loc.file, loc.groups = pq.ParquetFile(self.path), OrderedDict()
        if g not in loc.groups:
            col = loc.file.read_row_group(g, columns=[self.field]).column(0)
            loc.groups[g] = col.to_pylist()
            while len(loc.groups) > self._CACHE_GROUPS:
                loc.groups.popitem(last=False)
        return loc.groups[g]

    def read(self, a: int, b: int) -> list[Any]:
        out: list[Any] = []
        g = int(np.searchsorted(self.group_starts, a, side="right")) - 1
        while a < b:
            g_start, g_end = int(self.group_starts[g]), int(self.group_starts[g + 1])
            take = min(b, g_end)
            values = self._group(g)[a - g_start : take - g_start]
            for k, v in enumerate(values):
                out.append(_check_value(v, self.spec, f"{self.path}: row {a + k}"))
            a, g = take, g + 1
        return out


class _HFDataset:
    """A Hugging Face dataset: saved with save_to_disk, or local files via load_dataset."""

    def __init__(self, spec: SourceSpec, path: str | None, cache_dir: str):
        import datasets

        self.spec = spec
        self.field = spec.token_field or spec.text_field
        label = path if path else ", ".join(spec.paths)
        self.label = label
        try:
            if spec.format == "hf_disk":
                ds = datasets.load_from_disk(path)
                if isinstance(ds, datasets.DatasetDict):
                    if "train" not in ds:
                        raise DataError(f"{path}: a DatasetDict without a 'train' split")
                    ds = ds["train"]
            else:
                ds = datasets.load_dataset(
                    spec.hf_builder,
                    data_files=list(spec.paths),
                    split="train",
                    cache_dir=os.path.join(cache_dir, "hf"),
                )
        except DataError:
            raise
        except Exception as exc:
            raise DataError(f"{label}: cannot load as a Hugging Face dataset: {exc}") from None
        if self.field not in ds.column_names:
            raise DataError(
                f"{label}: no column '{self.field}' (columns: {', '.join(ds.column_names)})"
            )
        self.ds = ds.select_columns([self.field])

    def __len__(self) -> int:
        return len(self.ds)

    def read(self, a: int, b: int) -> list[Any]:
        values = self.ds[a:b][self.field]
        return [
            _check_value(v, self.spec, f"{self.label}: row {a + k}") for k, v in enumerate(values)
        ]


class SourceReader:
    """All files of one source, addressed by a single document index."""

    def __init__(self, spec: SourceSpec, cache_dir: str | None = None):
        self.spec = spec
        cache = cache_dir or default_cache_dir()
        if spec.format == "jsonl":
            parts: list[Any] = [_JsonlFile(p, spec, cache) for p in spec.paths]
        elif spec.format == "parquet":
            parts = [_ParquetFile(p, spec) for p in spec.paths]
        elif spec.format == "hf_disk":
            parts = [_HFDataset(spec, p, cache) for p in spec.paths]
        else:
            parts = [_HFDataset(spec, None, cache)]
        self.parts = parts
        counts = [len(p) for p in parts]
        self.part_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_docs = int(self.part_starts[-1])
        if self.num_docs == 0:
            raise DataError(
                f"source '{spec.name}': no documents in {', '.join(spec.paths)} (empty source)"
            )

    def read_range(self, start: int, end: int) -> list[Any]:
        """Values of documents [start, end), in file order."""
        out: list[Any] = []
        p = int(np.searchsorted(self.part_starts, start, side="right")) - 1
        while start < end:
            p_start, p_end = int(self.part_starts[p]), int(self.part_starts[p + 1])
            take = min(end, p_end)
            out.extend(self.parts[p].read(start - p_start, take - p_start))
            start, p = take, p + 1
        return out
