"""Parquet files, read one row group at a time (never the whole file).

Text columns become Python strings. Sources with images (`image_field`, or
`texts_field` and `images_field`) read those columns and give each row as a
MultimodalDoc (multimodal.py). Token-id columns (`token_field`, a list
of integers) stay in Arrow's layout: the list offsets and the flat values as
numpy arrays, and each document is a numpy view of its slice, so there is no
Python work per token. Remote files are opened through fsspec and pyarrow
reads only the footer and the row groups it needs (range reads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.schema.recipe import SourceSpec
from zephon.sources.formats import SourceFormat, register_format
from zephon.sources.multimodal import TableRecords
from zephon.sources.part import SourcePart
from zephon.sources.spans import spans
from zephon.sources.storage import ByteObject, is_remote
from zephon.sources.values import check_value
from zephon.stage_profile import PARSE, current


class _OpenFile(threading.local):
    """One thread's open file and its most recently read row groups."""

    def __init__(self) -> None:
        self.file: Any = None
        self.groups: OrderedDict[int, Any] = OrderedDict()


class ParquetFile(SourcePart):
    _CACHE_GROUPS = 2

    def __init__(self, obj: ByteObject, spec: SourceSpec):
        import pyarrow as pa

        self.obj, self.path, self.spec = obj, obj.url, spec
        self.field = spec.token_field or spec.text_field
        try:
            meta = self._open()
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise DataError(f"{self.path}: cannot open as Parquet: {exc}") from None
        rows = [meta.metadata.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self._local = _OpenFile()
        self.records = TableRecords(spec) if spec.multimodal else None
        if self.records is not None:
            self.records.check_schema(self.path, meta.schema_arrow)
            return
        names = meta.schema_arrow.names
        if self.field not in names:
            raise DataError(f"{self.path}: no column '{self.field}' (columns: {', '.join(names)})")
        kind = meta.schema_arrow.field(self.field).type
        if spec.pretokenized and not (
            (pa.types.is_list(kind) or pa.types.is_large_list(kind))
            and pa.types.is_integer(kind.value_type)
        ):
            raise DataError(
                f"{self.path}: column '{self.field}' must be a list of non-negative "
                f"token ids, got type {kind}"
            )

    def _open(self) -> Any:
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.obj.open() if is_remote(self.path) else self.path)

    def __len__(self) -> int:
        return int(self.group_starts[-1])

    def content_files(self) -> list[ByteObject]:
        return [self.obj]

    def _group(self, g: int) -> Any:
        loc = self._local
        if loc.file is None:
            loc.file = self._open()
        if g not in loc.groups:
            if self.records is not None:
                table = loc.file.read_row_group(g, columns=self.records.columns)
                loc.groups[g] = [table.column(c).to_pylist() for c in self.records.columns]
            else:
                col = loc.file.read_row_group(g, columns=[self.field]).column(0)
                first = int(self.group_starts[g])
                if self.spec.pretokenized:
                    loc.groups[g] = self._token_lists(col.combine_chunks(), first)
                else:
                    clock = current()
                    left = clock.switch(PARSE)
                    loc.groups[g] = col.to_pylist()
                    clock.switch(left)
            while len(loc.groups) > self._CACHE_GROUPS:
                loc.groups.popitem(last=False)
        return loc.groups[g]

    def _token_lists(self, arr: Any, first: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, values) of a list<int> column chunk, checked without per-token Python."""
        where = f"{self.path}: row"
        if arr.null_count:
            row = first + int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(
                f"{where} {row}: field '{self.field}' must be a list of non-negative "
                "token ids, got None"
            )
        offsets = arr.offsets.to_numpy().astype(np.int64)
        values_arr = arr.values
        if values_arr.null_count:
            raise DataError(
                f"{self.path}: column '{self.field}' holds null token ids "
                f"(rows {first} to {first + len(arr) - 1})"
            )
        values = values_arr.to_numpy()
        lo, hi = int(offsets[0]), int(offsets[-1])
        if values.dtype.kind == "i" and len(values):
            bad = np.flatnonzero(values[lo:hi] < 0)
            if len(bad):
                at = lo + int(bad[0])
                k = int(np.searchsorted(offsets, at, side="right")) - 1
                raise DataError(
                    f"{where} {first + k}: field '{self.field}' must be a list of non-negative "
                    f"token ids, got {int(values[at])} at index {at - int(offsets[k])}"
                )
        return offsets, values

    def read(self, a: int, b: int) -> list[Any]:
        out: list[Any] = []
        for g, g_start, lo, take in spans(self.group_starts, a, b):
            group = self._group(g)
            if self.records is not None:
                for i in range(lo - g_start, take - g_start):
                    where = f"{self.path}: row {g_start + i}"
                    out.append(self.records.doc([col[i] for col in group], where))
            elif self.spec.pretokenized:
                offsets, values = group
                out.extend(
                    values[offsets[i] : offsets[i + 1]] for i in range(lo - g_start, take - g_start)
                )
            else:
                for k, v in enumerate(group[lo - g_start : take - g_start]):
                    out.append(check_value(v, self.spec, f"{self.path}: row {lo + k}"))
        return out


def open_parquet(spec: SourceSpec, files: list[ByteObject], cache_dir: str) -> list[ParquetFile]:
    return [ParquetFile(obj, spec) for obj in files]


register_format(SourceFormat("parquet", open_parquet, suffixes=(".parquet",), images=True))
