"""`zephon validate --scan`: read every record of every source and list all bad ones.

The documents are split into chunks that worker processes read in parallel
(decoding JSON holds the GIL, so threads would not help); a chunk that reads
cleanly costs one `read_range`, one that fails is re-read record by record to
name every bad record by file and line. Pretokenized ids are also checked
against the tokenizer's vocabulary.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from zephon.errors import DataError
from zephon.recipe import Recipe, SourceSpec
from zephon.sources import SourceReader

CHUNK = 2048

_readers: dict[tuple[SourceSpec, str | None], SourceReader] = {}


@dataclass(frozen=True)
class BadRecord:
    source: str
    index: int  # document index within the source
    message: str  # names the file and line (or row)


def _reader(spec: SourceSpec, cache: str | None) -> SourceReader:
    key = (spec, cache)
    if key not in _readers:
        _readers[key] = SourceReader(spec, cache)
    return _readers[key]


def _check_ids(spec: SourceSpec, values: list[Any], start: int, vocab: int) -> list[BadRecord]:
    bad = []
    for k, ids in enumerate(values):
        top = max(ids, default=0)
        if top >= vocab:
            bad.append(
                BadRecord(
                    spec.name,
                    start + k,
                    f"source '{spec.name}' document {start + k}: token id {top} is outside "
                    f"the tokenizer's vocabulary ({vocab})",
                )
            )
    return bad


def scan_chunk(
    spec: SourceSpec, cache: str | None, start: int, end: int, vocab: int
) -> tuple[int, list[BadRecord]]:
    """(records read, bad records) of documents [start, end) of one source."""
    reader = _reader(spec, cache)
    try:
        values = reader.read_range(start, end)
    except DataError:
        bad, values_ok = [], []
        for i in range(start, end):
            try:
                v = reader.read_range(i, i + 1)
            except DataError as exc:
                bad.append(BadRecord(spec.name, i, str(exc)))
                continue
            if spec.pretokenized:
                bad.extend(_check_ids(spec, v, i, vocab))
            values_ok.append(i)
        return end - start, bad
    return end - start, (_check_ids(spec, values, start, vocab) if spec.pretokenized else [])


def scan_recipe(
    recipe: Recipe, vocab_size: int, workers: int | None = None, progress: bool = True
) -> tuple[int, list[BadRecord]]:
    """Read every record of every source; returns (records read, all bad records)."""
    from tqdm import tqdm

    cache = recipe.execution.cache_dir or None
    tasks = []
    for spec in recipe.sources:
        n = SourceReader(spec, cache).num_docs  # builds the indexes once, here
        tasks += [(spec, cache, a, min(a + CHUNK, n), vocab_size) for a in range(0, n, CHUNK)]
    total = sum(t[3] - t[2] for t in tasks)
    workers = workers or min(len(tasks), os.cpu_count() or 1)
    bad: list[BadRecord] = []
    read = 0
    with tqdm(total=total, unit="rec", desc="scan", disable=not progress) as bar:
        if workers <= 1:
            results = (scan_chunk(*t) for t in tasks)
            for n, b in results:
                read += n
                bad += b
                bar.update(n)
        else:
            with ProcessPoolExecutor(workers) as pool:
                futures = [pool.submit(scan_chunk, *t) for t in tasks]
                for f in futures:
                    n, b = f.result()
                    read += n
                    bad += b
                    bar.update(n)
    order = {s.name: k for k, s in enumerate(recipe.sources)}
    bad.sort(key=lambda r: (order[r.source], r.index))
    return read, bad
