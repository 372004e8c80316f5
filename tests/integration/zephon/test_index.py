"""The index and cache layer: the chunked JSONL line scan, one index build per
node under concurrent starts, gzip random access without a decompressed copy,
and token-array sources (layout errors, ids beyond the vocabulary)."""

from __future__ import annotations

import gzip
import io
import json
import multiprocessing
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.corpus import synthetic_docs, write_jsonl

from zephon import DataError, ZephonLoader, load_recipe, load_tokenizer
from zephon.sources import SourceReader
from zephon.sources.jsonl import scan_lines


def reference_lines(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of every line that is not only whitespace, the slow obvious way."""
    out, at = [], 0
    for line in data.split(b"\n"):
        if line.strip():
            out.append((at, at + len(line)))
        at += len(line) + 1
    return out


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
def test_scan_matches_a_line_split_for_any_chunk_size(chunk: int) -> None:
    rng = random.Random(chunk)
    pieces = [b"", b" ", b"\t \r", b"   " * 9, b'{"text": "x"}', b'  {"a": 1}', b"\r", b"\x0b\x0c"]
    lines = [
        rng.choice(pieces) + (b"y" * rng.randint(0, 30) if rng.random() < 0.5 else b"")
        for _ in range(400)
    ]
    for ending in (b"", b"\n", b"  "):
        data = b"\n".join(lines) + ending
        out = io.BytesIO()
        chunks = (data[i : i + chunk] for i in range(0, len(data), chunk))
        n = scan_lines(chunks, out)
        rows = np.frombuffer(out.getvalue(), dtype="<i8").reshape(-1, 2)
        assert n == len(rows)
        assert [tuple(map(int, r)) for r in rows] == reference_lines(data)


def _build(recipe: str, cache: str, log: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    from zephon.sources import jsonl

    original = jsonl._Index._build

    def counted(self: jsonl._Index) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {os.path.basename(self.obj.url)}\n")
        time.sleep(0.5)  # a slow build: the others must wait for it, or index another file
        original(self)

    jsonl._Index._build = counted  # type: ignore[method-assign]
    spec = load_recipe(recipe).sources[0]
    barrier.wait()
    reader = SourceReader(spec, cache)
    assert reader.read_range(0, 3) == synthetic_docs(400, seed=2)[:3]


def test_concurrent_processes_build_each_index_once(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", synthetic_docs(400, seed=2))
    write_jsonl(tmp_path / "b.jsonl.gz", synthetic_docs(300, seed=3), gz=True)
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[source]]\nname = "s"\npath = ["a.jsonl", "b.jsonl.gz"]\n')
    log, cache = tmp_path / "builds.log", tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [
        ctx.Process(target=_build, args=(str(recipe), str(cache), str(log), barrier))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    builds = [line.split() for line in log.read_text().splitlines()]  # (pid, file), each build
    per_file = Counter(name for _, name in builds)
    assert per_file == {"a.jsonl": 1, "b.jsonl.gz": 1}, builds  # one build each; the others waited
    assert builds[0][0] != builds[1][0], builds  # built by two processes in parallel


def test_gzip_is_read_through_seek_points_not_a_copy(tmp_path: Path) -> None:
    docs = synthetic_docs(3000, seed=4, max_words=400)
    lines = [json.dumps({"text": d}).encode() + b"\n" for d in docs]
    blob = b"".join(lines)
    # Two gzip members (as `cat a.gz b.gz` or bgzip make): the trailer holds only the last size.
    half = len(blob) // 2
    (tmp_path / "m.jsonl.gz").write_bytes(gzip.compress(blob[:half]) + gzip.compress(blob[half:]))
    write_jsonl(tmp_path / "s.jsonl.gz", docs, gz=True)
    for name in ("m", "s"):
        recipe = tmp_path / f"{name}.toml"
        recipe.write_text(f'[[source]]\nname = "{name}"\npath = "{name}.jsonl.gz"\n')
        cache = tmp_path / f"cache-{name}"
        reader = SourceReader(load_recipe(recipe).sources[0], str(cache))
        assert reader.num_docs == len(docs)
        for a, b in [(2990, 3000), (0, 5), (1500, 1700), (1, 2), (0, 3000)]:
            assert reader.read_range(a, b) == docs[a:b], (name, a, b)
        cached = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
        assert cached < len(blob) / 4, "the cache holds a decompressed copy"


def test_truncated_gzip_member_is_an_error(tmp_path: Path) -> None:
    docs = synthetic_docs(2000, seed=5, max_words=300)
    blob = b"".join(json.dumps({"text": d}).encode() + b"\n" for d in docs)
    packed = gzip.compress(blob)
    (tmp_path / "t.jsonl.gz").write_bytes(packed[: len(packed) * 2 // 3])
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[source]]\nname = "t"\npath = "t.jsonl.gz"\n')
    with pytest.raises(DataError, match=r"t\.jsonl\.gz: cannot decompress gzip file"):
        SourceReader(load_recipe(recipe).sources[0], str(tmp_path / "cache"))


def write_tokens(folder: Path, name: str, docs: list[list[int]], dtype: str = "uint16") -> None:
    np.save(folder / f"{name}.tokens.npy", np.array([t for d in docs for t in d], dtype=dtype))
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    np.save(folder / f"{name}.offsets.npy", offsets)


def test_token_array_layout_errors_name_the_file(tmp_path: Path, tokenizer_path: str) -> None:
    tok = load_tokenizer(tokenizer_path)
    docs = [[5, 6, 7], [8], [], [9, 10]] * 10
    write_tokens(tmp_path, "good", docs)
    recipe = tmp_path / "r.toml"

    def reader(path: str) -> SourceReader:
        recipe.write_text(f'[[source]]\nname = "t"\npath = "{path}"\nformat = "tokens"\n')
        return SourceReader(load_recipe(recipe).sources[0], str(tmp_path / "cache"))

    r = reader("good.tokens.npy")
    assert r.num_docs == 40 and [list(x) for x in r.read_range(0, 4)] == docs[:4]
    np.save(tmp_path / "lone.tokens.npy", np.arange(5, dtype=np.uint16))
    with pytest.raises(DataError, match=r"lone\.offsets\.npy is missing"):
        reader("lone.tokens.npy")
    np.save(tmp_path / "short.tokens.npy", np.arange(5, dtype=np.uint16))
    np.save(tmp_path / "short.offsets.npy", np.array([0, 2, 4]))
    with pytest.raises(
        DataError, match=r"short\.offsets\.npy: expected n \+ 1 offsets from 0 to 5"
    ):
        reader("short.tokens.npy")
    np.save(tmp_path / "flt.tokens.npy", np.zeros(4, dtype=np.float32))
    with pytest.raises(DataError, match=r"flt\.tokens\.npy: expected a 1-D integer array"):
        reader("flt.tokens.npy")
    (tmp_path / "other.npy").write_bytes(b"")
    with pytest.raises(DataError, match=r"format 'tokens' expects files named NAME\.tokens\.npy"):
        reader("other.npy")
    # ids beyond the vocabulary are a data error naming the source and document
    write_tokens(tmp_path, "big", [[1, 2]] * 10 + [[3, tok.vocab_size + 1]], dtype="uint32")
    recipe.write_text(
        "[recipe]\nlanes = 2\n[execution]\nworkers = 0\nprefetch = 0\n"
        '[[source]]\nname = "t"\npath = "big.tokens.npy"\n'
    )
    loader = ZephonLoader(recipe, tok, seq_len=8, global_batch_size=2, cache_dir=str(tmp_path))
    with pytest.raises(DataError, match=rf"document 10: token id {tok.vocab_size + 1} is outside"):
        for _ in range(20):
            loader.next_batch()
    loader.close()


def test_parquet_token_lists_are_checked_without_per_token_python(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [[1, 2, 3], [4], [], [5, 6]] * 5
    recipe = tmp_path / "r.toml"

    def first_error(values: list[Any], name: str) -> str:
        pq.write_table(
            pa.table({"ids": pa.array(values, type=pa.list_(pa.int64()))}),
            tmp_path / f"{name}.parquet",
            row_group_size=6,
        )
        recipe.write_text(f'[[source]]\nname = "p"\npath = "{name}.parquet"\ntoken_field = "ids"\n')
        reader = SourceReader(load_recipe(recipe).sources[0], str(tmp_path / "cache"))
        with pytest.raises(DataError) as info:
            reader.read_range(0, reader.num_docs)
        return str(info.value)

    negative = [list(r) for r in rows]
    negative[13] = [7, -2]
    msg = first_error(negative, "neg")
    assert "neg.parquet: row 13: field 'ids' must be a list of non-negative token ids" in msg
    assert "got -2 at index 1" in msg
    nulls = [list(r) for r in rows]
    nulls[8] = None
    assert "null.parquet: row 8: field 'ids'" in first_error(nulls, "null")
    pq.write_table(pa.table({"ids": ["a", "b"]}), tmp_path / "text.parquet")
    recipe.write_text('[[source]]\nname = "p"\npath = "text.parquet"\ntoken_field = "ids"\n')
    with pytest.raises(DataError, match=r"column 'ids' must be a list of non-negative token ids"):
        SourceReader(load_recipe(recipe).sources[0], str(tmp_path / "cache"))
