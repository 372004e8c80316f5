"""SourceReader: all files of one recipe source, addressed by one document index.

A reader exposes `spec`, `num_docs` and `read_range(start, end)`, the values
(text; token ids as a list or integer array; or, for sources with images,
a `MultimodalDoc`, see multimodal.py) of documents [start, end) in file order. Readers are shared by all lanes and worker threads, so they keep
no cursor of their own: a lane's position is its own business (see lane.py).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.recipe.spec import SourceSpec
from zephon.sources.cache import default_cache_dir
from zephon.sources.content import source_fingerprints
from zephon.sources.spans import spans
from zephon.sources.storage import ByteObject, LocalObject, is_remote, open_object


class SourceReader:
    def __init__(self, spec: SourceSpec, cache_dir: str | None = None):
        self.spec = spec
        cache = cache_dir or default_cache_dir()
        self.cache_dir = cache
        storage = spec.storage_options

        def objects() -> list[ByteObject]:
            return [open_object(p, storage, cache) for p in spec.paths]

        if spec.format in ("hf", "hf_disk") and any(is_remote(p) for p in spec.paths):
            raise DataError(
                f"source '{spec.name}': format '{spec.format}' reads local files only; "
                "remote sources need format jsonl, parquet, tokens or webdataset"
            )
        self.objects: list[ByteObject] = []
        if spec.format == "jsonl":
            from zephon.sources.jsonl import JsonlFile, build_indexes

            self.objects = objects()
            build_indexes(self.objects, cache)
            parts: list[Any] = [JsonlFile(o, spec, cache) for o in self.objects]
        elif spec.format == "parquet":
            from zephon.sources.parquet import ParquetFile

            self.objects = objects()
            parts = [ParquetFile(o, spec) for o in self.objects]
        elif spec.format == "tokens":
            from zephon.sources.tokens import TokenArrayFile

            self.objects = objects()
            parts = [TokenArrayFile(o, storage, cache) for o in self.objects]
        elif spec.format == "webdataset":
            from zephon.sources.webdataset import TarShard

            self.objects = objects()
            parts = [TarShard(o, spec, cache) for o in self.objects]
        elif spec.format == "hf_disk":
            from zephon.sources.hf import HFDataset

            parts = [HFDataset(spec, p, cache) for p in spec.paths]
        else:
            from zephon.sources.hf import HFDataset

            parts = [HFDataset(spec, None, cache)]
        self.parts = parts
        counts = [len(p) for p in parts]
        self.part_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_docs = int(self.part_starts[-1])
        if self.num_docs == 0:
            raise DataError(
                f"source '{spec.name}': no documents in {', '.join(spec.paths)} (empty source)"
            )

    def remote_versions(self) -> dict[str, str]:
        """URL -> ETag (or size and mtime) of every remote file: for the fingerprint."""
        objs = list(self.objects) + [p.offsets.obj for p in self.parts if hasattr(p, "offsets")]
        return {o.url: str(o.identity()[1]) for o in objs if is_remote(o.url)}

    def content_files(self) -> list[ByteObject]:
        """Every file whose bytes define the source's documents, in order: its files
        (a token array's offsets file after it), or a saved dataset's Arrow files."""
        if self.objects:
            out: list[ByteObject] = []
            for obj, part in zip(self.objects, self.parts, strict=True):
                out.append(obj)
                if hasattr(part, "offsets"):
                    out.append(part.offsets.obj)
            return out
        if self.spec.format == "hf_disk":
            return [LocalObject(f) for folder in self.spec.paths for f in _arrow_files(folder)]
        return [LocalObject(p) for p in self.spec.paths]

    def content_fingerprints(self) -> list[Any]:
        """Size and sampled-block hashes of each of `content_files` (content.py)."""
        return source_fingerprints(self.content_files(), self.cache_dir)

    def read_range(self, start: int, end: int) -> list[Any]:
        """Values of documents [start, end), in file order."""
        out: list[Any] = []
        for p, first, a, b in spans(self.part_starts, start, end):
            out.extend(self.parts[p].read(a - first, b - first))
        return out

    def read_docs(self, docs: list[int]) -> list[Any]:
        """Values of documents `docs` (any order, in that order), as read_range(i, i + 1)
        gives each; a bad record raises read_range's error for it. Parts that can
        (JSONL) read their documents together, in file order."""
        idx = np.asarray(docs, dtype=np.int64)
        where = np.searchsorted(self.part_starts, idx, side="right") - 1
        if len(where) and where[0] == where[-1] and (where == where[0]).all():
            return self._read_part_docs(int(where[0]), idx)  # the common case: one file
        out: list[Any] = [None] * len(docs)
        for p in np.unique(where).tolist():
            ks = np.flatnonzero(where == p)
            for k, v in zip(ks.tolist(), self._read_part_docs(p, idx[ks]), strict=True):
                out[k] = v
        return out

    def _read_part_docs(self, p: int, docs: np.ndarray) -> list[Any]:
        part = self.parts[p]
        local = (docs - self.part_starts[p]).tolist()
        if hasattr(part, "read_docs"):
            return part.read_docs(local)
        return [part.read(i, i + 1)[0] for i in local]


def _arrow_files(folder: str) -> list[str]:
    """A saved dataset's data files (all its files if it has no Arrow file), sorted by
    their path inside the folder."""
    found = sorted(
        os.path.relpath(os.path.join(root, n), folder)
        for root, _, names in os.walk(folder)
        for n in names
    )
    data = [f for f in found if f.endswith(".arrow")] or found
    return [os.path.join(folder, f) for f in data]
