"""Hugging Face datasets: saved with `save_to_disk` (`format = "hf_disk"`), or
local files loaded through `datasets.load_dataset` (`format = "hf"`). Both are
Arrow-backed, so a range of rows is a slice. Sources with images read their
columns as Arrow (an `Image` feature stays undecoded: its `{bytes, path}`
struct) and give each row as a MultimodalDoc (multimodal.py)."""

from __future__ import annotations

import os
from typing import Any

from zephon.errors import DataError
from zephon.recipe.spec import SourceSpec
from zephon.sources.multimodal import TableRecords
from zephon.sources.values import check_value


class HFDataset:
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
