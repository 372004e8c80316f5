"""Remote sources against a real S3 API (moto's server on 127.0.0.1): an s3://
recipe gives the local recipe's batches at D = 1, 2, 4, resumes, catches a
changed object on resume, names the URL when an object is missing, keeps its
piece cache under its limit, and survives a server that fails a share of
requests with nothing lost or repeated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.corpus import COMMITTED_TOKENIZER, synthetic_docs, write_jsonl
from helpers.loader import close, make_ranks, save, step_digests
from helpers.s3_server import FaultyProxy

from zephon import DataError, StateError, load_recipe
from zephon.sources import SourceReader, remote

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

BUCKET = "zephon-test"
STEPS = 6
TOK = str(COMMITTED_TOKENIZER)
SOURCES = """
[[source]]
name = "prose"
path = "{root}prose/*.jsonl"
weight = 2.0

[[source]]
name = "code"
path = "{root}code/part.jsonl.gz"

[[source]]
name = "table"
path = "{root}table/*.parquet"
weight = 0.5

[[source]]
name = "ids"
path = "{root}ids/part.tokens.npy"
weight = 0.5
"""


def recipe_text(root: str, cache: Path, storage: str = "", workers: int = 0) -> str:
    return (
        f"[recipe]\nseed = 9\nlanes = 4\n[shuffle]\nblock_size = 8\n[packing]\nflush_interval = 4\n"
        f'[execution]\nworkers = {workers}\nprefetch = {min(workers, 1)}\ncache_dir = "{cache}"\n'
        + storage
        + SOURCES.format(root=root)
    )


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> dict[str, Any]:
    """The session's moto server with a small corpus in four formats uploaded."""
    import numpy as np
    import s3fs
    from tokenizers import Tokenizer

    endpoint = moto_endpoint
    root = tmp_path_factory.mktemp("s3corpus")
    for sub in ("prose", "code", "table", "ids"):
        (root / "corpus" / sub).mkdir(parents=True)
    write_jsonl(root / "corpus/prose/a.jsonl", synthetic_docs(90, seed=1))
    write_jsonl(root / "corpus/prose/b.jsonl", synthetic_docs(60, seed=2))
    write_jsonl(root / "corpus/code/part.jsonl.gz", synthetic_docs(80, seed=3), gz=True)
    table = pa.table({"text": synthetic_docs(50, seed=4)})
    pq.write_table(table, root / "corpus/table/t.parquet", row_group_size=9)
    tok = Tokenizer.from_file(TOK)
    ids = [e.ids for e in tok.encode_batch(synthetic_docs(40, seed=5), add_special_tokens=False)]
    np.save(root / "corpus/ids/part.tokens.npy", np.array(sum(ids, []), dtype=np.uint16))
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int64)
    np.save(root / "corpus/ids/part.offsets.npy", offsets)
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    fs.mkdir(BUCKET)
    fs.put(str(root / "corpus") + "/", f"{BUCKET}/corpus/", recursive=True)
    local = root / "local.toml"
    local.write_text(recipe_text(str(root / "corpus") + "/", root / "local-cache"))
    reference = step_digests(make_ranks(local, TOK, 1), STEPS)
    return {"endpoint": endpoint, "fs": fs, "root": root, "local": local, "reference": reference}


def s3_recipe(s3: dict[str, Any], tmp: Path, endpoint: str | None = None, **kw: Any) -> Path:
    storage = f'[storage]\nendpoint_url = "{endpoint or s3["endpoint"]}"\n'
    path = tmp / "remote.toml"
    path.write_text(recipe_text(f"s3://{BUCKET}/corpus/", tmp / "cache", storage, **kw))
    return path


def test_s3_recipe_gives_the_local_batches_at_every_dp(s3: dict[str, Any], tmp_path: Path) -> None:
    recipe = s3_recipe(s3, tmp_path)
    spec = load_recipe(recipe).sources[0]
    assert spec.paths == (
        f"s3://{BUCKET}/corpus/prose/a.jsonl",
        f"s3://{BUCKET}/corpus/prose/b.jsonl",
    )
    for dp in (1, 2, 4):
        ranks = make_ranks(recipe, TOK, dp)
        assert step_digests(ranks, STEPS) == s3["reference"], dp
        fingerprint = ranks[0].fingerprint
        close(ranks)
    # remote objects are identified by ETag in the fingerprint; local ones add no field
    assert sorted(fingerprint["remote"]) == sorted(
        f"s3://{BUCKET}/corpus/{p}"
        for p in (
            "prose/a.jsonl",
            "prose/b.jsonl",
            "code/part.jsonl.gz",
            "table/t.parquet",
            "ids/part.tokens.npy",
            "ids/part.offsets.npy",
        )
    )
    assert all(v.startswith("etag:") for v in fingerprint["remote"].values())
    local = make_ranks(s3["local"], TOK, 1)
    assert "remote" not in local[0].fingerprint
    close(local)
    # worker threads reading ranges concurrently change nothing
    threaded = s3_recipe(s3, tmp_path, workers=2)
    ranks = make_ranks(threaded, TOK, 2)
    assert step_digests(ranks, STEPS) == s3["reference"]
    close(ranks)
    # the cache holds indexes and pieces, not a decompressed gzip copy
    assert (tmp_path / "cache" / "gzindex").is_dir() and not (
        tmp_path / "cache" / "gunzip"
    ).exists()


def test_s3_resume_and_a_changed_object(s3: dict[str, Any], tmp_path: Path) -> None:
    recipe = s3_recipe(s3, tmp_path)
    ranks = make_ranks(recipe, TOK, 2)
    step_digests(ranks, 3)
    state = json.loads(json.dumps(save(ranks)))
    close(ranks)
    resumed = make_ranks(recipe, TOK, 4)
    for loader in resumed:
        loader.load_state_dict(state)
    assert step_digests(resumed, STEPS - 3) == s3["reference"][3:]
    close(resumed)
    # A separate object that changes after the checkpoint: the resume is refused.
    fs = s3["fs"]
    fs.pipe(
        f"{BUCKET}/mutable/m.jsonl",
        b"".join(json.dumps({"text": t}).encode() + b"\n" for t in synthetic_docs(30, seed=8)),
    )
    one = tmp_path / "one.toml"
    one.write_text(
        f'[recipe]\nlanes = 2\n[execution]\nworkers = 0\nprefetch = 0\ncache_dir = "{tmp_path / "c1"}"\n'
        f'[storage]\nendpoint_url = "{s3["endpoint"]}"\n'
        f'[[source]]\nname = "m"\npath = "s3://{BUCKET}/mutable/m.jsonl"\n'
    )
    ranks = make_ranks(one, TOK, 1, global_batch_size=2)
    step_digests(ranks, 2)
    state = save(ranks)
    close(ranks)
    fs.pipe(
        f"{BUCKET}/mutable/m.jsonl",
        b"".join(json.dumps({"text": t}).encode() + b"\n" for t in synthetic_docs(30, seed=9)),
    )
    ranks = make_ranks(one, TOK, 1, global_batch_size=2)
    with pytest.raises(StateError, match=r"remote: checkpoint has .*mutable/m\.jsonl"):
        ranks[0].load_state_dict(state)
    close(ranks)


def test_missing_object_and_cache_limit(
    s3: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = s3_recipe(s3, tmp_path)
    spec = load_recipe(recipe).sources[0]
    fs = s3["fs"]
    fs.copy(f"{BUCKET}/corpus/prose/a.jsonl", f"{BUCKET}/gone/a.jsonl")
    gone = spec.__class__(**{**spec.__dict__, "paths": (f"s3://{BUCKET}/gone/a.jsonl",)})
    fs.rm(f"{BUCKET}/gone/a.jsonl")
    with pytest.raises(DataError, match=rf"s3://{BUCKET}/gone/a\.jsonl: reading metadata failed"):
        SourceReader(gone, str(tmp_path / "c2"))
    # A tiny piece size and cache limit: reads still right, the cache stays bounded.
    monkeypatch.setattr(remote, "CHUNK", 1024)
    limit = 4096
    small = spec.__class__(
        **{
            **spec.__dict__,
            "storage": json.dumps(
                {"endpoint_url": s3["endpoint"], "cache_limit_gb": limit / (1 << 30)}
            ),
        }
    )
    reader = SourceReader(small, str(tmp_path / "c3"))
    local = SourceReader(load_recipe(s3["local"]).sources[0], str(tmp_path / "c4"))
    assert reader.read_range(0, reader.num_docs) == local.read_range(0, local.num_docs)
    pieces = list((tmp_path / "c3" / "remote").rglob("*"))
    cached = sum(p.stat().st_size for p in pieces if p.is_file())
    assert 0 < cached <= limit


def test_faulty_server_is_survived_by_retries(
    s3: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    host, port = s3["endpoint"].removeprefix("http://").split(":")
    proxy = FaultyProxy((host, int(port)), rate=0.25, seed=3)
    try:
        recipe = s3_recipe(s3, tmp_path, endpoint=proxy.endpoint, workers=2)
        ranks = make_ranks(recipe, TOK, 2)
        assert step_digests(ranks, STEPS) == s3["reference"]
        close(ranks)
    finally:
        proxy.close()
    assert sum(proxy.faults.values()) >= 5, (proxy.requests, proxy.faults)
    assert all(proxy.faults.values()), proxy.faults  # every kind of fault happened


def test_a_server_that_keeps_failing_gives_one_error_naming_the_url(
    s3: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "ATTEMPTS", 2)
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    host, port = s3["endpoint"].removeprefix("http://").split(":")
    proxy = FaultyProxy((host, int(port)), rate=1.0, seed=1)
    try:
        spec = load_recipe(s3_recipe(s3, tmp_path)).sources[0]
        options = {
            "endpoint_url": proxy.endpoint,
            "config_kwargs": {"retries": {"max_attempts": 1}},
        }
        failing = spec.__class__(**{**spec.__dict__, "storage": json.dumps(options)})
        with pytest.raises(DataError) as info:
            SourceReader(failing, str(tmp_path / "cache"))
    finally:
        proxy.close()
    msg = str(info.value)
    assert msg.startswith(f"s3://{BUCKET}/corpus/prose/a.jsonl: ") and "after 2 attempts" in msg
