"""JSON Lines files (plain or gzip, local or remote), one document per line.

A file is indexed once: the byte range of every non-blank line, found by a
vectorised newline scan over fixed-size chunks of the (decompressed) stream,
so memory stays bounded whatever the file size. The index is an (n, 2) int64
`.npy` in the cache, written row by row as the scan goes and memory-mapped
when read; one process per node builds it (cache.build_once), the others
wait and map it. A block read is then one byte-range read of its lines.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.files import atomic_file
from zephon.schema.recipe import SourceSpec
from zephon.sources.cache import build_once, cache_key
from zephon.sources.formats import SourceFormat, register_format
from zephon.sources.gzipped import GzipRandomAccess
from zephon.sources.gzipped import scan as gzip_scan
from zephon.sources.part import SourcePart
from zephon.sources.storage import ByteObject
from zephon.sources.values import check_value
from zephon.stage_profile import PARSE, current

try:  # several times faster than json on the common case; json decides everything else
    import orjson

    _fast_loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency
    _fast_loads = None

SCAN_CHUNK = 4 << 20  # bytes per step of the index scan: bounds its memory
RUN_BYTES = 8 << 20  # at most this much read at once by read_docs (unless one line is longer)
_IS_BLANK_BYTE = np.zeros(256, dtype=bool)
_IS_BLANK_BYTE[[9, 10, 11, 12, 13, 32]] = True  # what bytes.strip() strips
_NON_BLANK = re.compile(rb"[^\t\n\x0b\x0c\r ]")


def _chunks(f: Any, size: int = SCAN_CHUNK) -> Iterator[bytes]:
    while chunk := f.read(size):
        yield chunk


def scan_lines(chunks: Iterator[bytes], out: Any) -> int:
    """Write (start, end) int64 rows of every non-blank line to `out`; return the count.

    A line is blank when it holds only ASCII whitespace (as `bytes.strip()`
    sees it). Only lines that could be blank (short, or starting with
    whitespace: a JSON record starts with '{') are looked at byte by byte.
    Lines may span chunks: the unfinished line's start, and whether it has
    shown a non-blank byte yet, are carried over.
    """
    pos, carry_start, carry_has, count = 0, 0, False, 0
    for chunk in chunks:
        c = np.frombuffer(chunk, dtype=np.uint8)
        nl = np.flatnonzero(c == 10)
        if len(nl):
            local_starts = np.concatenate([[0], nl[:-1] + 1])
            maybe_blank = (nl - local_starts < 8) | _IS_BLANK_BYTE[c[local_starts]]
            maybe_blank[0] = True  # the first line may have begun in an earlier chunk
            has = np.ones(len(nl), dtype=bool)
            for i in np.flatnonzero(maybe_blank):
                found = _NON_BLANK.search(chunk, int(local_starts[i]), int(nl[i])) is not None
                has[i] = found or (i == 0 and carry_has)
            starts = pos + local_starts
            starts[0] = carry_start
            rows = np.stack([starts, pos + nl], axis=1)[has].astype("<i8")
            out.write(rows.tobytes())
            count += len(rows)
            carry_start = pos + int(nl[-1]) + 1
            carry_has = _NON_BLANK.search(chunk, int(nl[-1]) + 1) is not None
        else:
            carry_has = carry_has or _NON_BLANK.search(chunk) is not None
        pos += len(c)
    if carry_has:
        out.write(np.array([[carry_start, pos]], dtype="<i8").tobytes())
        count += 1
    return count


def _write_npy(dest: str, raw_path: str, count: int) -> None:
    """An (count, 2) int64 .npy at dest from a file of raw rows, copied in chunks."""

    with atomic_file(dest) as f:
        header = {"descr": "<i8", "fortran_order": False, "shape": (count, 2)}
        np.lib.format.write_array_header_1_0(f, header)
        with open(raw_path, "rb") as src:
            shutil.copyfileobj(src, f, 1 << 20)


def build_indexes(objs: list[ByteObject], cache_dir: str) -> None:
    """Index files not indexed yet, skipping those another process is indexing.

    Ranks that start together thus index different files in parallel; the
    JsonlFile constructors then wait for whatever is still being built.
    """
    for obj in objs:
        _Index(obj, cache_dir).build(wait=False)


class _Index:
    """Where a file's line index (and gzip seek points) live in the cache."""

    def __init__(self, obj: ByteObject, cache_dir: str):
        self.obj, self.cache_dir = obj, cache_dir
        self.gzip = obj.url.endswith(".gz")
        self.key = cache_key(*obj.identity())
        self.index_path = os.path.join(cache_dir, "index", self.key + ".npy")
        self.seek_path = os.path.join(cache_dir, "gzindex", self.key + ".gzidx")

    def build(self, wait: bool = True) -> bool:
        outputs = [self.index_path] + ([self.seek_path] if self.gzip else [])
        return build_once(self.cache_dir, self.key, outputs, self._build, wait)

    def _build(self) -> None:
        cache = os.path.dirname(self.index_path)
        os.makedirs(cache, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache, prefix=".tmp-raw-") as raw:
            if self.gzip:
                count = scan_lines(gzip_scan(self.obj, self.seek_path), raw)
            else:
                with self.obj.open() as f:
                    count = scan_lines(_chunks(f), raw)
            raw.flush()
            _write_npy(self.index_path, raw.name, count)


class JsonlFile(SourcePart):
    def __init__(self, obj: ByteObject, spec: SourceSpec, cache_dir: str):
        self.obj, self.origin, self.spec = obj, obj.url, spec
        index = _Index(obj, cache_dir)
        index.build()
        self.gzip, self.index_path, self.seek_path = index.gzip, index.index_path, index.seek_path
        rows = np.load(self.index_path, mmap_mode="r") if self._nonempty() else np.zeros((0, 2))
        self.starts, self.ends = rows[:, 0], rows[:, 1]
        self.bytes: Any = GzipRandomAccess(obj, self.seek_path) if self.gzip else obj

    def _nonempty(self) -> bool:
        # numpy cannot memory-map the zero bytes of an empty array
        return os.path.getsize(self.index_path) > 128

    def _stream(self) -> Iterator[bytes]:
        if self.gzip:
            yield from self.bytes.stream()
        else:
            with self.obj.open() as f:
                yield from _chunks(f)

    def _line_number(self, offset: int) -> int:
        """1-based line number of a byte offset (only computed on the error path)."""
        n, pos = 1, 0
        for chunk in self._stream():
            n += chunk.count(b"\n", 0, max(0, offset - pos))
            pos += len(chunk)
            if pos >= offset:
                break
        return n

    def __len__(self) -> int:
        return len(self.starts)

    def content_files(self) -> list[ByteObject]:
        return [self.obj]

    def _where(self, start: int) -> str:
        return f"{self.origin}:{self._line_number(start)}"

    def read(self, a: int, b: int) -> list[Any]:
        lo, hi = int(self.starts[a]), int(self.ends[b - 1])
        blob = self._pread(lo, hi)
        starts, ends = self.starts[a:b].tolist(), self.ends[a:b].tolist()
        return self._values(
            [blob[s - lo : e - lo] for s, e in zip(starts, ends, strict=True)], starts
        )

    def read_docs(self, docs: list[int]) -> list[Any]:
        """Values of documents `docs` (any order), each as read(i, i + 1) gives it,
        the first bad one (in the order given) raising the same error.

        The byte ranges are read in file order, runs of nearby lines in one read
        each: per-line reads cost a file open each, and for gzip a decompression
        from the nearest seek point each. Runs are found with numpy: this runs for
        every document a lane reads.
        """
        if not docs:
            return []
        idx = np.asarray(docs, dtype=np.int64)
        starts_a, ends_a = np.asarray(self.starts[idx]), np.asarray(self.ends[idx])
        order = np.argsort(starts_a, kind="stable")
        s, e = starts_a[order], ends_a[order]  # lines do not overlap: ends sorted too
        gap = 1 << 20 if self.gzip else 1 << 18  # reading through a gap beats a new read
        breaks = (np.flatnonzero(s[1:] - e[:-1] > gap) + 1).tolist() + [len(s)]
        starts, ends = starts_a.tolist(), ends_a.tolist()
        lines: list[bytes] = [b""] * len(docs)
        at = 0
        for stop in breaks:
            while at < stop:
                # A run's bytes are bounded (a document alone may exceed it).
                end = at + int(np.searchsorted(e[at:stop], s[at] + RUN_BYTES, side="right"))
                end = max(end, at + 1)
                lo = int(s[at])
                blob = self._pread(lo, int(e[end - 1]))
                for k in order[at:end].tolist():
                    lines[k] = blob[starts[k] - lo : ends[k] - lo]
                at = end
        return self._values(lines, starts)

    def _values(self, lines: list[bytes], starts: list[int]) -> list[Any]:
        """The values of records `lines` (starting at bytes `starts` of the file).

        The common case (a JSON object whose field is a string) is decided here,
        without a call per document; anything else goes through `_value`, which
        gives the same value or the error."""
        clock = current()
        left = clock.switch(PARSE)
        try:
            field = self.spec.token_field or self.spec.text_field
            loads = _fast_loads if not self.spec.pretokenized else None
            out: list[Any] = []
            for line, start in zip(lines, starts, strict=True):
                if loads is not None:
                    try:
                        record = loads(line)
                    except ValueError:
                        record = None
                    if type(record) is dict and type(value := record.get(field)) is str:
                        out.append(value)
                        continue
                out.append(self._value(line, start))
            return out
        finally:
            clock.switch(left)

    def _pread(self, lo: int, hi: int) -> bytes:
        blob = self.bytes.pread(lo, hi - lo)
        if len(blob) != hi - lo:
            raise DataError(
                f"{self.origin}: file is shorter than its index ({lo + len(blob)} < {hi} "
                "bytes); was it changed while being read?"
            )
        return blob

    def _value(self, line: bytes, start: int) -> Any:
        """The value of the record `line`, which starts at byte `start` of the file."""
        field = self.spec.token_field or self.spec.text_field
        if _fast_loads is not None:
            # orjson takes the bytes as they are and is strict (UTF-8, no NaN, 64-bit
            # ints, no lone surrogates): whatever it refuses goes the slow way below,
            # which gives what json.loads gives, or the error it gives.
            try:
                record = _fast_loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict) and field in record:
                return check_value(record[field], self.spec, lambda: self._where(start))
        try:
            # Decode as UTF-8 ourselves: json.loads(bytes) would guess UTF-16/32 from
            # the first bytes. A byte order mark is allowed at the start of the file.
            text = line.decode("utf-8")
            bom = text[:1] == "\ufeff" and start == 0
            record = json.loads(text[1:] if bom else text)
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{self._where(start)}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{self._where(start)}: not valid JSON ({exc.msg}, column {exc.colno})"
            ) from None
        if not isinstance(record, dict) or field not in record:
            have = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"{self._where(start)}: no field '{field}' (record has: {have})")
        return check_value(record[field], self.spec, lambda: self._where(start))


def open_jsonl(spec: SourceSpec, files: list[ByteObject], cache_dir: str) -> list[JsonlFile]:
    build_indexes(files, cache_dir)  # files no other rank is indexing first
    return [JsonlFile(obj, spec, cache_dir) for obj in files]


register_format(
    SourceFormat("jsonl", open_jsonl, suffixes=(".jsonl", ".jsonl.gz", ".json", ".json.gz"))
)
