"""`zephon validate --scan`: read every record of every source and list all bad ones.

The documents are split into chunks that worker processes read in parallel
(decoding JSON holds the GIL, so threads would not help); a chunk that reads
cleanly costs one `read_range`, one that fails is re-read record by record
(tolerant.read_or_recover, as `bad_records = "drop"` does) to name every bad
record by file and line. Pretokenized ids are also checked against the
tokenizer's vocabulary, with the loader's own check (tokenize.token_id_error),
and every image of a source with images is decoded as training would decode
it (images/work.py `bad_images`), each bad one named by shard and key.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from zephon.errors import DataError
from zephon.schema.recipe import ImageSpec, Recipe, SourceSpec
from zephon.sources import SourceReader
from zephon.sources.bad_records import read_or_recover
from zephon.tokenize.tokenizer import token_id_error

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


def scan_chunk(
    spec: SourceSpec,
    cache: str | None,
    start: int,
    end: int,
    vocab: int,
    image: ImageSpec | None = None,
) -> tuple[int, list[BadRecord]]:
    """(records read, bad records) of documents [start, end) of one source; `image`:
    the recipe's pixel settings, to decode the images of a source with images."""
    bad: list[BadRecord] = []

    def unreadable(i: int, exc: DataError) -> None:
        bad.append(BadRecord(spec.name, i, str(exc)))

    values = read_or_recover(_reader(spec, cache), start, end, unreadable)
    if spec.pretokenized:
        for i, ids in enumerate(values, start):
            problem = None if ids is None else token_id_error(spec, i, ids, vocab)
            if problem is not None:
                bad.append(BadRecord(spec.name, i, problem))
    if spec.multimodal and image is not None:
        from zephon.images.work import bad_images

        for i, value in enumerate(values, start):
            bad += [BadRecord(spec.name, i, why) for why in bad_images(value, image)]
    # Listed by index, as if each record were read and checked in turn.
    bad.sort(key=lambda r: r.index)
    return end - start, bad


def scan_recipe(
    recipe: Recipe, vocab_size: int, workers: int | None = None, progress: bool = True
) -> tuple[int, list[BadRecord]]:
    """Read every record of every source; returns (records read, all bad records)."""
    from tqdm import tqdm

    cache = recipe.execution.cache_dir or None
    tasks = []
    for spec in recipe.sources:
        n = SourceReader(spec, cache).num_docs  # builds the indexes once, here
        image = recipe.image if spec.multimodal else None
        tasks += [
            (spec, cache, a, min(a + CHUNK, n), vocab_size, image) for a in range(0, n, CHUNK)
        ]
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
