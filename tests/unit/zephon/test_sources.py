"""Source formats: the same documents stored as plain JSONL, gzip JSONL, Parquet
(several row groups), a saved Hugging Face dataset and `format = "hf"` read the
same, and the loader makes the same batches from any of them. Also: the
pretokenized path, the cached JSONL index, blank lines and glob order."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.corpus import synthetic_docs, write_jsonl

from zephon import TokenizerInfo, ZephonLoader, load_recipe, load_tokenizer
from zephon.errors import DataError
from zephon.sources import SourceReader

DOCS = synthetic_docs(60, seed=11)
SPLITS = (25, 20, 15)  # documents per file: ranges below cross file boundaries at 25 and 45
RANGES = [(0, 60), (0, 1), (6, 8), (5, 30), (24, 26), (44, 46), (13, 49), (20, 21), (59, 60)]
STEPS = 6

HEADER = """\
[recipe]
seed = 5
lanes = 2

[shuffle]
block_size = 4

[execution]
workers = 0
prefetch = 0
cache_dir = "cache"
"""


def parts(values: list[Any]) -> list[list[Any]]:
    out, at = [], 0
    for n in SPLITS:
        out.append(values[at : at + n])
        at += n
    return out


def write_recipe(root: Path, name: str, source: str) -> Path:
    path = root / f"{name}.toml"
    path.write_text(HEADER + '[[source]]\nname = "docs"\n' + source)
    return path


@pytest.fixture(scope="module")
def tok(tokenizer_path: str) -> TokenizerInfo:
    return load_tokenizer(tokenizer_path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tok: TokenizerInfo) -> dict[str, Path]:
    """One recipe per storage format, all over DOCS in three files; name -> recipe."""
    import datasets

    root = tmp_path_factory.mktemp("formats")
    for sub in ("jsonl", "gz", "parquet", "hf_disk", "ids", "ids_parquet", "tokens"):
        (root / sub).mkdir()
    ids = [e.ids for e in tok.tokenizer.encode_batch(DOCS, add_special_tokens=False)]
    for k, (chunk, id_chunk) in enumerate(zip(parts(DOCS), parts(ids), strict=True)):
        write_jsonl(root / "jsonl" / f"part-{k:02d}.jsonl", chunk)
        write_jsonl(root / "gz" / f"part-{k:02d}.jsonl.gz", chunk, gz=True)
        table = pa.table({"id": [f"{k}-{i}" for i in range(len(chunk))], "text": chunk})
        pq.write_table(table, root / "parquet" / f"part-{k:02d}.parquet", row_group_size=7)
        datasets.Dataset.from_dict({"text": chunk, "n": list(range(len(chunk)))}).save_to_disk(
            str(root / "hf_disk" / f"part-{k:02d}")
        )
        with open(root / "ids" / f"part-{k:02d}.jsonl", "w") as f:
            for x in id_chunk:
                f.write(json.dumps({"ids": x, "note": "pretokenized"}) + "\n")
        ids_table = pa.table({"ids": pa.array(id_chunk, type=pa.list_(pa.int32()))})
        pq.write_table(ids_table, root / "ids_parquet" / f"part-{k:02d}.parquet", row_group_size=7)
        # token arrays: uint16 for two files, uint32 for the third (both are accepted)
        flat = np.array([t for x in id_chunk for t in x], dtype=np.uint32 if k == 2 else np.uint16)
        np.save(root / "tokens" / f"part-{k:02d}.tokens.npy", flat)
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in id_chunk])]).astype(np.int64)
        np.save(root / "tokens" / f"part-{k:02d}.offsets.npy", offsets)
    return {
        "jsonl": write_recipe(root, "jsonl", 'path = "jsonl/*.jsonl"\n'),
        "gzip": write_recipe(root, "gzip", 'path = "gz/*.jsonl.gz"\n'),
        "parquet": write_recipe(root, "parquet", 'path = "parquet/*.parquet"\n'),
        "hf_disk": write_recipe(root, "hf_disk", 'path = "hf_disk/*"\nformat = "hf_disk"\n'),
        "hf_json": write_recipe(
            root, "hf_json", 'path = "jsonl/*.jsonl"\nformat = "hf"\nhf_builder = "json"\n'
        ),
        "hf_parquet": write_recipe(
            root,
            "hf_parquet",
            'path = "parquet/*.parquet"\nformat = "hf"\nhf_builder = "parquet"\n',
        ),
        "ids_jsonl": write_recipe(root, "ids_jsonl", 'path = "ids/*.jsonl"\ntoken_field = "ids"\n'),
        "ids_parquet": write_recipe(
            root, "ids_parquet", 'path = "ids_parquet/*.parquet"\ntoken_field = "ids"\n'
        ),
        "tokens": write_recipe(root, "tokens", 'path = "tokens/*.tokens.npy"\n'),
    }


TEXT_FORMATS = ("jsonl", "gzip", "parquet", "hf_disk", "hf_json", "hf_parquet")


def reader(recipe_path: Path) -> SourceReader:
    recipe = load_recipe(recipe_path)
    return SourceReader(recipe.sources[0], recipe.execution.cache_dir)


def digests(recipe: Path, tok: TokenizerInfo, **kw: Any) -> list[list[bytes]]:
    loader = ZephonLoader(recipe, tok, seq_len=24, global_batch_size=4, **kw)
    try:
        return [loader.next_batch().digests for _ in range(STEPS)]
    finally:
        loader.close()


def test_formats_are_detected(corpus: dict[str, Path]) -> None:
    expected = {
        "jsonl": "jsonl",
        "gzip": "jsonl",
        "parquet": "parquet",
        "hf_disk": "hf_disk",
        "hf_json": "hf",
        "hf_parquet": "hf",
    }
    for name, fmt in expected.items():
        spec = load_recipe(corpus[name]).sources[0]
        assert spec.format == fmt, name
        assert len(spec.paths) == 3, name


@pytest.mark.parametrize("fmt", TEXT_FORMATS)
def test_read_range_is_identical_in_every_format(corpus: dict[str, Path], fmt: str) -> None:
    r = reader(corpus[fmt])
    assert r.num_docs == len(DOCS)
    for a, b in RANGES:
        assert r.read_range(a, b) == DOCS[a:b], (fmt, a, b)
    # any order of reads (row-group caches, file switches) gives the same values
    for a, b in reversed(RANGES):
        assert r.read_range(a, b) == DOCS[a:b], (fmt, a, b)


@pytest.mark.parametrize("fmt", TEXT_FORMATS)
def test_read_docs_gives_each_documents_value_in_the_order_asked(
    corpus: dict[str, Path], fmt: str
) -> None:
    r = reader(corpus[fmt])
    # shuffled, across file boundaries, with repeats and far-apart lines
    docs = [int(i) for i in np.random.default_rng(3).permutation(len(DOCS))[:40]] + [7, 7, 59, 0]
    assert r.read_docs(docs) == [DOCS[i] for i in docs], fmt
    assert r.read_docs([]) == []


def test_read_docs_names_the_line_of_a_bad_record(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(6)]
    lines[4] = '{"text": "broken'
    (tmp_path / "data" / "a.jsonl").write_text("\n".join(lines) + "\n")
    r = reader(write_recipe(tmp_path, "bad", 'path = "data/*.jsonl"\n'))
    assert r.read_docs([5, 3, 0]) == ["doc 5", "doc 3", "doc 0"]
    with pytest.raises(DataError, match=r"a\.jsonl:5: not valid JSON"):
        r.read_docs([1, 4, 2])
    with pytest.raises(DataError, match=r"a\.jsonl:5: not valid JSON"):
        r.read_range(4, 5)


def test_loader_digests_are_identical_in_every_format(
    corpus: dict[str, Path], tok: TokenizerInfo
) -> None:
    reference = digests(corpus["jsonl"], tok)
    assert len({b"".join(d) for d in reference}) == STEPS  # steps really differ
    for fmt in TEXT_FORMATS[1:]:
        assert digests(corpus[fmt], tok) == reference, fmt
    # worker threads reading Parquet row groups concurrently change nothing
    assert digests(corpus["parquet"], tok, num_workers=2, prefetch=2) == reference


def test_pretokenized_source_gives_the_rows_of_its_text(
    corpus: dict[str, Path], tok: TokenizerInfo
) -> None:
    ids = [e.ids for e in tok.tokenizer.encode_batch(DOCS, add_special_tokens=False)]
    for name in ("ids_jsonl", "ids_parquet", "tokens"):
        spec = load_recipe(corpus[name]).sources[0]
        assert spec.pretokenized
        assert spec.format == "tokens" if name == "tokens" else spec.token_field == "ids"
        r = reader(corpus[name])
        for a, b in RANGES:
            got = r.read_range(a, b)
            assert [[int(t) for t in x] for x in got] == ids[a:b], (name, a, b)
            if name != "ids_jsonl":  # Arrow lists and token arrays stay numpy arrays
                assert all(isinstance(x, np.ndarray) for x in got)
    reference = digests(corpus["jsonl"], tok)
    assert digests(corpus["ids_jsonl"], tok) == reference
    assert digests(corpus["ids_parquet"], tok, num_workers=2) == reference
    assert digests(corpus["tokens"], tok) == reference
    assert digests(corpus["tokens"], tok, num_workers=2, prefetch=2) == reference


def test_jsonl_index_is_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    for k, chunk in enumerate(parts(DOCS)):
        write_jsonl(tmp_path / "data" / f"part-{k:02d}.jsonl", chunk)
        write_jsonl(tmp_path / "data" / f"part-{k:02d}.jsonl.gz", chunk, gz=True)
    cache = tmp_path / "cache"
    recipe = write_recipe(
        tmp_path,
        "r",
        'path = "data/*.jsonl"\n[[source]]\nname = "gz"\npath = "data/*.jsonl.gz"\n',
    )
    specs = load_recipe(recipe).sources
    assert [s.format for s in specs] == ["jsonl", "jsonl"]
    first = [SourceReader(s, str(cache)) for s in specs]
    index_files = sorted(os.listdir(cache / "index"))
    assert len(index_files) == 6 and all(f.endswith(".npy") for f in index_files)
    # gzip: seek points for random access, no decompressed copy
    assert len(os.listdir(cache / "gzindex")) == 3 and not (cache / "gunzip").exists()
    assert not [f for f in os.listdir(cache / "index") if f.startswith(".tmp-")]
    # the index is memory-mapped, not loaded
    assert all(isinstance(p.starts.base, np.memmap) for r in first for p in r.parts)

    def no_rescan(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the JSONL index was rebuilt instead of read from the cache")

    monkeypatch.setattr(np, "flatnonzero", no_rescan)
    second = [SourceReader(s, str(cache)) for s in specs]
    for r1, r2 in zip(first, second, strict=True):
        assert r2.num_docs == len(DOCS)
        for a, b in RANGES:
            assert r2.read_range(a, b) == r1.read_range(a, b) == DOCS[a:b]
    assert sorted(os.listdir(cache / "index")) == index_files

    # The cache is keyed by size and mtime: a changed file is indexed again.
    with open(tmp_path / "data" / "part-01.jsonl", "a") as f:
        f.write(json.dumps({"text": "appended"}) + "\n")
    with pytest.raises(AssertionError, match="rebuilt"):
        SourceReader(specs[0], str(cache))
    monkeypatch.undo()
    assert SourceReader(specs[0], str(cache)).read_range(44, 46) == [DOCS[44], "appended"]


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    docs = synthetic_docs(12, seed=3)
    lines = [json.dumps({"text": t}) for t in docs]
    blob = (
        "\ufeff"  # a byte order mark at the start of the file is allowed
        + lines[0]
        + "\n\n\n"
        + lines[1]
        + "\r\n"  # CRLF line ending
        + "   \n\t\n\r\n"
        + lines[2]
        + "\n"
        + " " * 40  # a long whitespace-only line is blank too
        + "\n"
        + "\n".join(lines[3:6])
        + "\n\t\t\t\t\t\t\t\t\t\t  \n"
        + "   "
        + lines[6]  # leading whitespace before a record is fine
        + "\n"
        + "\n".join(lines[7:])  # no newline at the end of the file
    )
    (tmp_path / "a.jsonl").write_bytes(blob.encode("utf-8"))
    recipe = write_recipe(tmp_path, "r", 'path = "a.jsonl"\n')
    r = reader(recipe)
    assert r.num_docs == len(docs)
    assert r.read_range(0, len(docs)) == docs
    assert [r.read_range(i, i + 1)[0] for i in range(len(docs))] == docs


def test_glob_orders_files_by_name(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    docs = {name: synthetic_docs(5, seed=k) for k, name in enumerate(("b", "c", "a", "a10"))}
    for name, chunk in docs.items():  # written out of order: mtimes don't decide
        write_jsonl(tmp_path / "shards" / f"{name}.jsonl", chunk)
    recipe = write_recipe(tmp_path, "r", 'path = "shards/*.jsonl"\n')
    spec = load_recipe(recipe).sources[0]
    names = [Path(p).name for p in spec.paths]
    assert names == ["a.jsonl", "a10.jsonl", "b.jsonl", "c.jsonl"]
    r = SourceReader(spec, str(tmp_path / "cache"))
    assert r.read_range(0, 20) == docs["a"] + docs["a10"] + docs["b"] + docs["c"]
    # an explicit list keeps the order written in the recipe
    recipe = write_recipe(tmp_path, "r2", 'path = ["shards/c.jsonl", "shards/a.jsonl"]\n')
    spec = load_recipe(recipe).sources[0]
    assert [Path(p).name for p in spec.paths] == ["c.jsonl", "a.jsonl"]
    assert SourceReader(spec, str(tmp_path / "cache")).read_range(3, 7) == (
        docs["c"][3:] + docs["a"][:2]
    )
