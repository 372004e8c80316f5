"""Hugging Face datasets: saved with `save_to_disk` (`format = "hf_disk"`), or
local files loaded through `datasets.load_dataset` (`format = "hf"`). Both are
Arrow-backed, so a range of rows is a slice. Sources with images read their
columns as Arrow (an `Image` feature stays undecoded: its `{bytes, path}`
struct) and give each row as a MultimodalDoc (multimodal.py)."""

from __future__ import annotations

import os
from typing import Any

from zephon.errors import DataError
from zephon.schema.recipe import SourceSpec
from zephon.sources.formats import SourceFormat, register_format
from zephon.sources.multimodal import TableRecords
from zephon.sources.part import SourcePart
from zephon.sources.storage import ByteObject, LocalObject
from zephon.sources.values import check_value


class HFDataset(SourcePart):
    """A saved dataset (`path`: its folder), or all files of a source loaded as one
    (`path` None)."""

    def __init__(self, spec: SourceSpec, path: str | None, cache_dir: str):
        import datasets

        self.spec, self.path = spec, path
        self.field = spec.token_field or spec.text_field
        label = path if path else ", ".join(spec.paths)
        self.label = label
        try:
            if path is not None:
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
        self.records = TableRecords(spec) if spec.multimodal else None
        if self.records is not None:
            self.records.check_schema(label, ds.data.schema)
            self.ds = ds.select_columns(self.records.columns).with_format("arrow")
            return
        if self.field not in ds.column_names:
            raise DataError(
                f"{label}: no column '{self.field}' (columns: {', '.join(ds.column_names)})"
            )
        self.ds = ds.select_columns([self.field])

    def __len__(self) -> int:
        return len(self.ds)

    def content_files(self) -> list[ByteObject]:
        """A saved dataset's Arrow files; the files a loaded dataset was loaded from."""
        if self.path is not None:
            return [LocalObject(f) for f in _arrow_files(self.path)]
        return [LocalObject(p) for p in self.spec.paths]

    def read(self, a: int, b: int) -> list[Any]:
        if self.records is not None:
            table = self.ds[a:b]
            columns = [table.column(c).to_pylist() for c in self.records.columns]
            return [
                self.records.doc([col[k] for col in columns], f"{self.label}: row {a + k}")
                for k in range(len(table))
            ]
        values = self.ds[a:b][self.field]
        return [
            check_value(v, self.spec, f"{self.label}: row {a + k}") for k, v in enumerate(values)
        ]


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


def open_saved(spec: SourceSpec, files: list[ByteObject], cache_dir: str) -> list[HFDataset]:
    """`format = "hf_disk"`: one part per folder saved with `save_to_disk`."""
    return [HFDataset(spec, folder.url, cache_dir) for folder in files]


def open_loaded(spec: SourceSpec, files: list[ByteObject], cache_dir: str) -> list[HFDataset]:
    """`format = "hf"`: the source's files loaded as one dataset by `hf_builder`."""
    return [HFDataset(spec, None, cache_dir)]


register_format(SourceFormat("hf_disk", open_saved, folders=True, images=True, remote=False))
register_format(SourceFormat("hf", open_loaded, images=True, remote=False))
