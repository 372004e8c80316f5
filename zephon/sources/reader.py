"""SourceReader: all files of one recipe source, addressed by one document index.

A reader exposes `spec`, `num_docs` and `read_range(start, end)`, the values
(text; token ids as a list or integer array; or, for sources with images,
a `MultimodalDoc`, see multimodal.py) of documents [start, end) in file order. Readers are shared by all lanes and worker threads, so they keep
no cursor of their own: a lane's position is its own business (see lane.py).

The source's format (formats.py) opens its parts (part.py's SourcePart: a file,
or a loaded dataset, each with its documents in file order); the reader numbers
the documents of all parts one after another and asks nothing else of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.schema.recipe import SourceSpec
from zephon.sources.cache import default_cache_dir
from zephon.sources.content import source_fingerprints
from zephon.sources.formats import get_format, one_of, registered_formats
from zephon.sources.part import SourcePart
from zephon.sources.spans import spans
from zephon.sources.storage import ByteObject, is_remote, open_object


class SourceReader:
    def __init__(self, spec: SourceSpec, cache_dir: str | None = None):
        self.spec = spec
        cache = cache_dir or default_cache_dir()
        self.cache_dir = cache
        try:
            fmt = get_format(spec.format)
        except KeyError as exc:  # a SourceSpec made in code, not read from a recipe
            raise DataError(f"source '{spec.name}': {exc.args[0]}") from None
        if not fmt.remote and any(is_remote(p) for p in spec.paths):
            remote = [f.name for f in registered_formats() if f.remote]
            raise DataError(
                f"source '{spec.name}': format '{spec.format}' reads local files only; "
                f"remote sources need format {one_of(remote)}"
            )
        storage = spec.storage_options
        files = [open_object(p, storage, cache) for p in spec.paths]
        self.parts: list[SourcePart] = list(fmt.open_parts(spec, files, cache))
        counts = [len(p) for p in self.parts]
        self.part_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_docs = int(self.part_starts[-1])
        if self.num_docs == 0:
            raise DataError(
                f"source '{spec.name}': no documents in {', '.join(spec.paths)} (empty source)"
            )

    def remote_versions(self) -> dict[str, str]:
        """URL -> ETag (or size and mtime) of every remote file: for the fingerprint."""
        return {o.url: str(o.identity()[1]) for o in self.content_files() if is_remote(o.url)}

    def content_files(self) -> list[ByteObject]:
        """Every file whose bytes define the source's documents, part by part, in order
        (a token array's offsets file after it; a saved dataset's Arrow files)."""
        return [f for part in self.parts for f in part.content_files()]

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
        return self.parts[p].read_docs((docs - self.part_starts[p]).tolist())
