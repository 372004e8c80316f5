"""Corpus loading for the hf baseline: every recipe source read with Hugging Face
`datasets`, reduced to one document column, mixed and shuffled once, the way a
typical trainer prepares a corpus before splitting it by rank."""

from __future__ import annotations

import os
from typing import Any

from zephon import DataError, Recipe, SourceSpec
from zephon.sources import default_cache_dir as zephon_cache_dir


def default_cache_dir() -> str:
    """Where Hugging Face `datasets` keeps its arrow cache for this loader."""
    return os.path.join(zephon_cache_dir(), "hf_baseline")


def _load_source(spec: SourceSpec, cache_dir: str) -> Any:
    import datasets

    where = f"source '{spec.name}' ({', '.join(spec.paths)})"
    if spec.multimodal:
        raise DataError(
            f"{where}: holds images; the hf baseline loader reads text only "
            "(use --data.loader zephon)"
        )
    try:
        if spec.format == "jsonl":
            ds = datasets.load_dataset(
                "json", data_files=list(spec.paths), split="train", cache_dir=cache_dir
            )
        elif spec.format == "parquet":
            ds = datasets.load_dataset(
                "parquet", data_files=list(spec.paths), split="train", cache_dir=cache_dir
            )
        elif spec.format == "hf":
            ds = datasets.load_dataset(
                spec.hf_builder, data_files=list(spec.paths), split="train", cache_dir=cache_dir
            )
        elif spec.format == "hf_disk":
            if len(spec.paths) != 1:
                raise DataError(f"{where}: format 'hf_disk' expects exactly one folder")
            ds = datasets.load_from_disk(spec.paths[0])
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise DataError(
                        f"{where}: the saved DatasetDict has no 'train' split "
                        f"(splits: {', '.join(ds)})"
                    )
                ds = ds["train"]
        else:
            raise DataError(f"{where}: format {spec.format!r} is not supported by the hf loader")
    except DataError:
        raise
    except Exception as exc:  # datasets raises many types; report them with the source
        raise DataError(f"{where}: cannot be read as {spec.format!r}: {exc}") from exc
    return ds


def _normalise_source(ds: Any, spec: SourceSpec, index: int) -> Any:
    """Keep only the document column, renamed to a common name, plus the source index."""
    import datasets

    column = spec.token_field or spec.text_field
    if column not in ds.column_names:
        kind = "token_field" if spec.token_field else "text_field"
        raise DataError(
            f"source '{spec.name}' ({', '.join(spec.paths)}): {kind} {column!r} not found; "
            f"columns are: {', '.join(ds.column_names)}"
        )
    ds = ds.select_columns([column])
    target = "tokens" if spec.pretokenized else "text"
    if column != target:
        ds = ds.rename_column(column, target)
    feature = (
        datasets.Sequence(datasets.Value("int64"))
        if spec.pretokenized
        else datasets.Value("string")
    )
    try:
        if ds.features[target] != feature:
            ds = ds.cast(datasets.Features({target: feature}))
    except Exception as exc:
        raise DataError(
            f"source '{spec.name}': field {column!r} must hold "
            f"{'lists of token ids' if spec.pretokenized else 'strings'}: {exc}"
        ) from exc
    return ds.add_column("source", [index] * len(ds))


def load_mixed_corpus(recipe: Recipe, cache_dir: str | None = None) -> Any:
    """All sources of the recipe as one shuffled map-style `datasets.Dataset`.

    Columns: "text" (or "tokens" for pretokenized sources) and "source" (the
    index of the source in the recipe).
    """
    import datasets

    kinds = {s.pretokenized for s in recipe.sources}
    if len(kinds) > 1:
        raise DataError(
            f"{recipe.path}: the hf loader cannot mix pretokenized sources (token_field) "
            "with text sources (text_field)"
        )
    cache = cache_dir or default_cache_dir()
    parts = [
        _normalise_source(_load_source(spec, cache), spec, i)
        for i, spec in enumerate(recipe.sources)
    ]
    if len(parts) == 1:
        mixed = parts[0]
    else:
        total = sum(s.weight for s in recipe.sources)
        mixed = datasets.interleave_datasets(
            parts,
            probabilities=[s.weight / total for s in recipe.sources],
            seed=recipe.seed,
            stopping_strategy="all_exhausted",
        )
    return mixed.shuffle(seed=recipe.seed)
