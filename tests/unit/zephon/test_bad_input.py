"""Bad input fails loudly and precisely.

Every failure is a ZephonError subclass whose message names the file, the
key / field / line at fault and what was expected; errors raised on worker
threads reach the trainer with the same message; a failing load never
modifies the input; the CLI prints one `error:` line and no traceback.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.corpus import synthetic_docs, write_jsonl
from tokenizers import Tokenizer

from zephon import (
    DataError,
    LayoutError,
    RecipeError,
    StateError,
    TokenizerInfo,
    ZephonError,
    ZephonLoader,
    load_recipe,
    load_tokenizer,
    merge_rank_states,
    resolve_layout,
)
from zephon.state.checkpoint_state import load_file

HEADER = """\
[recipe]
name = "bad"
seed = 3
lanes = 2

[shuffle]
block_size = 4

[execution]
workers = 0
prefetch = 0
cache_dir = "cache"
"""
SOURCE_A = '[[source]]\nname = "a"\npath = "a.jsonl"\n'
DELETE = object()
# (worker threads, prefetch steps): inline, errors on worker threads, and on the prefetch thread
MODES = ((0, 0), (2, 0), (2, 2))


def snapshot(*paths: Path) -> dict[Path, tuple[bytes, int]]:
    """Content and mtime: a failing load must leave its input untouched."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


@pytest.fixture(scope="module")
def tok(tokenizer_path: str) -> TokenizerInfo:
    return load_tokenizer(tokenizer_path)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder holding one good source `a.jsonl` (20 short documents)."""
    root = tmp_path.resolve()
    write_jsonl(root / "a.jsonl", synthetic_docs(20, seed=1, max_words=20))
    return root


# -- recipes ---------------------------------------------------------------------

RECIPE_CASES: dict[str, tuple[str, list[str]]] = {
    "unknown-table": (
        HEADER + SOURCE_A + '[packign]\nalgorithm = "concat"\n',
        [
            "[recipe file] has unknown key(s): packign",
            "expected only: execution, image, mixture, packing, phase, recipe, shuffle, source, "
            "storage",
        ],
    ),
    "unknown-packing-key": (
        HEADER + '[packing]\nalgoritm = "best_fit"\n' + SOURCE_A,
        [
            "[packing] has unknown key(s): algoritm",
            "expected only: algorithm, flush_interval, open_bins",
        ],
    ),
    "unknown-source-key": (
        HEADER + SOURCE_A + "wieght = 2.0\n",
        ["[source 'a'] has unknown key(s): wieght", "expected only:", "weight"],
    ),
    "lanes-string": (
        HEADER.replace("lanes = 2", 'lanes = "2"') + SOURCE_A,
        ["recipe.lanes: expected int, got '2' (str)"],
    ),
    "lanes-zero": (
        HEADER.replace("lanes = 2", "lanes = 0") + SOURCE_A,
        ["recipe.lanes: expected an integer >= 1, got 0"],
    ),
    "name-int": (
        HEADER + '[[source]]\nname = 5\npath = "a.jsonl"\n',
        ["source[0].name: expected str, got 5 (int)"],
    ),
    "weight-bool": (
        HEADER + SOURCE_A + "weight = true\n",
        ["source 'a'.weight: expected float, got True (bool)"],
    ),
    "algorithm-zigzag": (
        HEADER + '[packing]\nalgorithm = "zigzag"\n' + SOURCE_A,
        ["packing.algorithm: expected one of concat, best_fit; got 'zigzag'"],
    ),
    "duplicate-names": (
        HEADER + SOURCE_A + SOURCE_A,
        ["duplicate source name(s): a", "unique name"],
    ),
    "weight-zero": (
        HEADER + SOURCE_A + "weight = 0\n",
        ["source 'a'.weight: expected a positive number, got 0.0"],
    ),
    "weight-negative": (
        HEADER + SOURCE_A + "weight = -1.5\n",
        ["source 'a'.weight: expected a positive number, got -1.5"],
    ),
    "weight-nan": (
        HEADER + SOURCE_A + "weight = nan\n",
        ["source 'a'.weight: expected a positive number, got nan"],
    ),
    "weight-inf": (
        HEADER + SOURCE_A + "weight = inf\n",
        ["source 'a'.weight: expected a positive number, got inf"],
    ),
    "missing-path": (
        HEADER + '[[source]]\nname = "a"\npath = "data/missing-*.jsonl"\n',
        [
            "source 'a'.path: 'data/missing-*.jsonl' matches nothing",
            "resolved against the recipe folder to {dir}/data/missing-*.jsonl",
        ],
    ),
    "path-list-with-missing": (
        HEADER + '[[source]]\nname = "a"\npath = ["a.jsonl", "b.jsonl"]\n',
        ["source 'a'.path: 'b.jsonl' matches nothing", "{dir}/b.jsonl"],
    ),
    "no-sources": (HEADER, ["no [[source]] tables", "at least one source"]),
    "toml-syntax": (
        HEADER.replace("seed = 3", "seed = = 3") + SOURCE_A,
        ["not valid TOML", "line 3"],
    ),
    "bad-format": (
        HEADER + SOURCE_A + 'format = "csvx"\n',
        [
            "source 'a'.format: expected one of auto, jsonl, parquet, hf_disk, hf, tokens, webdataset; got 'csvx'"
        ],
    ),
    "unguessable-format": (
        HEADER + '[[source]]\nname = "a"\npath = "recipe.toml"\n',
        [
            "source 'a'.format: cannot guess the format of {dir}/recipe.toml",
            "set format = one of jsonl, parquet, hf_disk, hf, tokens",
        ],
    ),
    "folder-for-jsonl": (
        HEADER + '[[source]]\nname = "a"\npath = "."\nformat = "jsonl"\n',
        ["source 'a'.path: {dir} is a folder; format 'jsonl' expects files"],
    ),
    "bad-exhaustion": (
        HEADER + SOURCE_A + 'on_exhausted = "loop"\n',
        ["source 'a'.on_exhausted: expected one of repeat, stop; got 'loop'"],
    ),
    "source-not-a-table-array": (
        'source = "a.jsonl"\n' + HEADER,
        ["recipe file.source: expected list, got 'a.jsonl' (str)"],
    ),
}


@pytest.mark.parametrize("case", sorted(RECIPE_CASES))
def test_bad_recipe_names_file_key_and_expectation(folder: Path, case: str) -> None:
    text, expected = RECIPE_CASES[case]
    path = folder / "recipe.toml"
    path.write_text(text)
    before = snapshot(path, folder / "a.jsonl")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    msg = str(info.value)
    assert isinstance(info.value, ZephonError)
    assert re.match(rf"{re.escape(str(path))}(:\d+)?: ", msg), msg  # the file, its line
    for part in expected:
        assert part.format(dir=folder) in msg, f"{part!r} not in {msg!r}"
    assert snapshot(path, folder / "a.jsonl") == before


def test_recipe_that_is_not_utf8_or_not_a_file(folder: Path) -> None:
    path = folder / "latin1.toml"
    path.write_bytes(HEADER.replace('"bad"', '"caf\xe9"').encode("latin-1") + SOURCE_A.encode())
    with pytest.raises(RecipeError, match="not valid TOML: not UTF-8") as info:
        load_recipe(path)
    assert str(path) in str(info.value)
    with pytest.raises(RecipeError, match="recipe file is a folder, expected a TOML file") as info:
        load_recipe(folder)  # a folder, not a file: no IsADirectoryError traceback
    assert str(folder) in str(info.value)
    with pytest.raises(RecipeError, match="recipe file not found") as info:
        load_recipe(folder / "nope.toml")
    assert str(folder / "nope.toml") in str(info.value)


def test_relative_paths_resolve_against_the_recipe_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tok: TokenizerInfo
) -> None:
    proj, elsewhere = tmp_path.resolve() / "proj", tmp_path.resolve() / "elsewhere"
    (proj / "data").mkdir(parents=True)
    (elsewhere / "data").mkdir(parents=True)
    write_jsonl(proj / "data" / "a.jsonl", synthetic_docs(20, seed=1))
    write_jsonl(elsewhere / "data" / "decoy.jsonl", synthetic_docs(20, seed=2))
    (proj / "recipe.toml").write_text(HEADER + '[[source]]\nname = "a"\npath = "data/*.jsonl"\n')
    monkeypatch.chdir(elsewhere)

    recipe = load_recipe("../proj/recipe.toml")
    assert recipe.path == str(proj / "recipe.toml")
    assert recipe.sources[0].paths == (str(proj / "data" / "a.jsonl"),)
    assert recipe.execution.cache_dir == str(proj / "cache")
    loader = ZephonLoader("../proj/recipe.toml", tok, seq_len=16, global_batch_size=2)
    loader.next_batch()
    loader.close()
    assert (proj / "cache" / "index").is_dir()
    assert not (elsewhere / "cache").exists()

    (proj / "r2.toml").write_text(HEADER + '[[source]]\nname = "a"\npath = "nope.jsonl"\n')
    with pytest.raises(RecipeError) as info:
        load_recipe("../proj/r2.toml")
    msg = str(info.value)
    assert "'nope.jsonl' matches nothing" in msg
    assert f"resolved against the recipe folder to {proj / 'nope.jsonl'}" in msg


# -- data --------------------------------------------------------------------------


def good_lines(n: int, seed: int = 5) -> list[bytes]:
    docs = synthetic_docs(n, seed, max_words=20)
    return [json.dumps({"id": i, "text": t}).encode() for i, t in enumerate(docs)]


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def id_lines(tok: TokenizerInfo, n: int) -> list[bytes]:
    docs = synthetic_docs(n, seed=6, max_words=20)
    ids = [e.ids for e in tok.tokenizer.encode_batch(docs, add_special_tokens=False)]
    return [json.dumps({"ids": x}).encode() for x in ids]


# Each builder writes a bad source into the folder and returns
# (extra keys of the [[source]] table, data file, error type, parts of the message).
Case = tuple[str, Path, type[ZephonError], list[str]]


def case_malformed_json(d: Path, tok: TokenizerInfo) -> Case:
    good = good_lines(20)
    bad = b'{"id": 99, "text": "unterminated'
    path = write_lines(d / "bad.jsonl", good[:4] + [b"", b"   ", bad] + good[4:])
    return "", path, DataError, [f"{path}:7: not valid JSON"]


def case_not_utf8(d: Path, tok: TokenizerInfo) -> Case:
    good = good_lines(20)
    bad = '{"id": 9, "text": "caf\xe9"}'.encode("latin-1")
    path = write_lines(d / "bad.jsonl", good[:2] + [b""] + [bad] + good[2:])
    return "", path, DataError, [f"{path}:4: not valid UTF-8"]


def case_utf16_lookalike(d: Path, tok: TokenizerInfo) -> Case:
    # b"\xff\xfe" looks like a UTF-16 byte order mark: still a UTF-8 error on line 3.
    good = good_lines(20)
    path = write_lines(d / "bad.jsonl", good[:2] + [b'\xff\xfe{"text": "x"}'] + good[2:])
    return "", path, DataError, [f"{path}:3: not valid UTF-8", "at byte 0"]


def case_missing_field(d: Path, tok: TokenizerInfo) -> Case:
    good = good_lines(20)
    bad = b'{"id": 7, "title": "y", "body": "x"}'
    path = write_lines(d / "bad.jsonl", good[:5] + [bad] + good[5:])
    return "", path, DataError, [f"{path}:6: no field 'text'", "(record has: body, id, title)"]


def case_not_an_object(d: Path, tok: TokenizerInfo) -> Case:
    good = good_lines(20)
    path = write_lines(d / "bad.jsonl", good[:9] + [b'["a", "list"]'] + good[9:])
    return "", path, DataError, [f"{path}:10: no field 'text'", "(record has: list)"]


def case_text_not_string(d: Path, tok: TokenizerInfo) -> Case:
    good = good_lines(20)
    path = write_lines(d / "bad.jsonl", good[:2] + [b'{"id": 2, "text": 42}'] + good[2:])
    return "", path, DataError, [f"{path}:3: field 'text' must be a string, got int"]


def case_custom_text_field(d: Path, tok: TokenizerInfo) -> Case:
    path = write_lines(d / "bad.jsonl", good_lines(20))
    expected = [f"{path}:1: no field 'content'", "(record has: id, text)"]
    return 'text_field = "content"\n', path, DataError, expected


def case_empty_file(d: Path, tok: TokenizerInfo) -> Case:
    path = d / "bad.jsonl"
    path.write_bytes(b"")
    return "", path, DataError, [f"source 'a': no documents in {path} (empty source)"]


def case_only_blank_lines(d: Path, tok: TokenizerInfo) -> Case:
    path = write_lines(d / "bad.jsonl", [b"", b"   ", b"\t", b" " * 40])
    return "", path, DataError, [f"source 'a': no documents in {path} (empty source)"]


def case_corrupt_gzip(d: Path, tok: TokenizerInfo) -> Case:
    path = d / "bad.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n".join(good_lines(20)))[:60])
    return "", path, DataError, [f"{path}: cannot decompress gzip file"]


def case_token_out_of_vocab(d: Path, tok: TokenizerInfo) -> Case:
    lines = id_lines(tok, 20)
    lines[5] = json.dumps({"ids": [1, 2, tok.vocab_size + 7]}).encode()
    path = write_lines(d / "bad.jsonl", lines)
    expected = [
        f"source 'a' ({path}) document 5: token id {tok.vocab_size + 7}",
        f"outside the tokenizer's vocabulary ({tok.vocab_size})",
    ]
    return 'token_field = "ids"\n', path, DataError, expected


def case_negative_token_id(d: Path, tok: TokenizerInfo) -> Case:
    lines = id_lines(tok, 20)
    lines[3] = b'{"ids": [3, -1, 4]}'
    path = write_lines(d / "bad.jsonl", lines)
    expected = [
        f"{path}:4: field 'ids' must be a list of non-negative token ids",
        "got -1 at index 1",
    ]
    return 'token_field = "ids"\n', path, DataError, expected


def case_parquet_without_text(d: Path, tok: TokenizerInfo) -> Case:
    path = d / "bad.parquet"
    docs = synthetic_docs(20, seed=1)
    pq.write_table(pa.table({"id": list(range(20)), "body": docs}), path, row_group_size=7)
    return "", path, DataError, [f"{path}: no column 'text' (columns: id, body)"]


def case_parquet_text_not_string(d: Path, tok: TokenizerInfo) -> Case:
    path = d / "bad.parquet"
    pq.write_table(pa.table({"text": list(range(20))}), path, row_group_size=7)
    return "", path, DataError, [f"{path}: row 0: field 'text' must be a string, got int"]


def case_not_parquet(d: Path, tok: TokenizerInfo) -> Case:
    path = write_lines(d / "bad.parquet", good_lines(20))
    return "", path, DataError, [f"{path}: cannot open as Parquet"]


DATA_CASES: dict[str, Callable[[Path, TokenizerInfo], Case]] = {
    f.__name__.removeprefix("case_"): f
    for f in (
        case_malformed_json,
        case_not_utf8,
        case_utf16_lookalike,
        case_missing_field,
        case_not_an_object,
        case_text_not_string,
        case_custom_text_field,
        case_empty_file,
        case_only_blank_lines,
        case_corrupt_gzip,
        case_token_out_of_vocab,
        case_negative_token_id,
        case_parquet_without_text,
        case_parquet_text_not_string,
        case_not_parquet,
    )
}


def drain(recipe: Path, tok: TokenizerInfo, workers: int, prefetch: int, steps: int = 200) -> None:
    """Build a loader and take steps until the bad input is reached (the source repeats)."""
    loader = None
    try:
        loader = ZephonLoader(
            recipe, tok, seq_len=16, global_batch_size=2, num_workers=workers, prefetch=prefetch
        )
        for _ in range(steps):
            loader.next_batch()
    finally:
        if loader is not None:
            loader.close()


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_bad_data_names_file_and_line_on_every_thread(
    tmp_path: Path, tok: TokenizerInfo, case: str
) -> None:
    d = tmp_path.resolve()
    extra, path, kind, expected = DATA_CASES[case](d, tok)
    recipe = d / "recipe.toml"
    recipe.write_text(HEADER + f'[[source]]\nname = "a"\npath = "{path.name}"\n{extra}')
    before = snapshot(recipe, path)
    messages = []
    for workers, prefetch in MODES:
        with pytest.raises(kind) as info:
            drain(recipe, tok, workers, prefetch)
        assert type(info.value) is kind, (workers, prefetch)
        messages.append(str(info.value))
    msg = messages[0]
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"
    assert messages == [msg] * len(MODES), "worker/prefetch threads changed the message"
    assert snapshot(recipe, path) == before
    leftovers = [p for p in (d / "cache").rglob("*") if p.name.startswith(".tmp-")]
    assert leftovers == [], "a failed load left a half-written cache entry"


def test_huge_token_id_is_a_data_error(tmp_path: Path, tok: TokenizerInfo) -> None:
    lines = id_lines(tok, 20)
    lines[0] = json.dumps({"ids": [1, 2**40]}).encode()
    write_lines(tmp_path / "a.jsonl", lines)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(HEADER + SOURCE_A + 'token_field = "ids"\n')
    with pytest.raises(DataError, match="outside the tokenizer's vocabulary"):
        drain(recipe, tok, 0, 0)


# -- layout ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            (8, 3, 24, 3, 0.0),
            [
                "rows per rank 6 on 1 rank, 9 on 2 ranks",
                "every rank runs 9 rows (3 micro-batches of 3)",
                "11.1% of the compute idles, more than the allowed 0.0%",
                "data-parallel sizes without padding: 1, 2, 4, 8",
            ],
            id="uneven-lanes-above-max_idle_share",
        ),
        pytest.param(
            (8, 2, 20, 2),
            [
                "global batch size 20 is not divisible by the lane count 8",
                "use e.g. 16 or 24",
            ],
            id="G%L",
        ),
        pytest.param(
            (4, 8, 32, 4),
            [
                "data-parallel size 8 exceeds the lane count 4",
                "raise [recipe] lanes to a multiple of 8",
            ],
            id="D>L",
        ),
        pytest.param(
            (8, 2, 16, 3, 0.05),
            [
                "rows per rank 8 on 2 ranks",
                "every rank runs 9 rows (3 micro-batches of 3)",
                "more than the allowed 5.0%",
                "micro-batch sizes without padding: 1, 2, 4, 8",
            ],
            id="micro-padding-above-max_idle_share",
        ),
        pytest.param((8, 2, 16, -1), ["micro-batch size (-1) must be >= 1"], id="micro<1"),
        pytest.param((8, 2, 16, 2, 1.5), ["max_idle_share 1.5", "[0, 1]"], id="share>1"),
        pytest.param(
            (8, 0, 16, 1),
            ["data-parallel size (0)", "must all be >= 1"],
            id="zero",
        ),
    ],
)
def test_layout_errors_give_numbers_and_a_fix(args: tuple[float, ...], expected: list[str]) -> None:
    with pytest.raises(LayoutError) as info:
        resolve_layout(*args)
    for part in expected:
        assert part in str(info.value), f"{part!r} not in {info.value}"


def test_uneven_sizes_are_reported_not_refused_by_default() -> None:
    """What the refusals above turn into without max_idle_share: a plan and a report."""
    layout = resolve_layout(8, 3, 24, 3)
    assert [layout.padded_rows(r) for r in range(3)] == [3, 0, 0]
    assert "rows per rank 6 on 1 rank, 9 on 2 ranks" in (layout.imbalance() or "")
    assert resolve_layout(8, 2, 16, 3).micro_steps == 3


def test_loader_checks_layout_before_reading(make_recipe: Any, tok: TokenizerInfo) -> None:
    recipe = make_recipe(lanes=8)
    with pytest.raises(LayoutError, match="global batch size 12 is not divisible by the lane"):
        ZephonLoader(recipe, tok, seq_len=16, global_batch_size=12)


# -- checkpoint state -----------------------------------------------------------------


@pytest.fixture
def saved(make_recipe: Any, tok: TokenizerInfo) -> tuple[Path, dict[str, Any]]:
    """A recipe (8 lanes, seed 1234, weights 0.7/0.3) and a state after 2 steps."""
    recipe = make_recipe()
    loader = ZephonLoader(recipe, tok, seq_len=16, global_batch_size=16)
    for _ in range(2):
        loader.next_batch()
    state = json.loads(json.dumps(merge_rank_states([loader.state_dict()])))
    loader.close()
    return recipe, state


def variant(recipe: Path, old: str, new: str) -> Path:
    text = recipe.read_text()
    assert old in text
    out = recipe.with_name(f"variant-{new.split()[0]}.toml")
    out.write_text(text.replace(old, new))
    return out


def other_tokenizer(path: str, tmp: Path) -> str:
    t = Tokenizer.from_file(path)
    t.add_special_tokens(["<|extra|>"])
    out = tmp / "other-tokenizer.json"
    t.save(str(out))
    return str(out)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("seq_len", "seq_len: checkpoint has 16, this run has 32"),
        ("global_batch_size", "global_batch_size: checkpoint has 16, this run has 32"),
        ("lanes", "lanes: checkpoint has 8, this run has 4"),
        ("seed", "seed: checkpoint has 1234, this run has 99"),
        ("tokenizer", "tokenizer: checkpoint has "),
        ("recipe", "recipe: checkpoint has "),
    ],
)
def test_resume_with_changed_setting_names_the_field(
    saved: tuple[Path, dict[str, Any]],
    tok: TokenizerInfo,
    tokenizer_path: str,
    tmp_path: Path,
    change: str,
    field: str,
) -> None:
    recipe, state = saved
    kw: dict[str, Any] = {"seq_len": 16, "global_batch_size": 16}
    tokenizer: Any = tok
    if change in ("seq_len", "global_batch_size"):
        kw[change] = 32
    elif change == "lanes":
        recipe = variant(recipe, "lanes = 8", "lanes = 4")
    elif change == "seed":
        recipe = variant(recipe, "seed = 1234", "seed = 99")
    elif change == "recipe":
        recipe = variant(recipe, "weight = 0.7", "weight = 0.6")
    else:
        tokenizer = other_tokenizer(tokenizer_path, tmp_path)
    loader = ZephonLoader(recipe, tokenizer, **kw)
    try:
        with pytest.raises(StateError) as info:
            loader.load_state_dict(state)
    finally:
        loader.close()
    msg = str(info.value)
    assert msg.startswith("cannot resume: settings that define the data changed"), msg
    first_change = msg.splitlines()[1].strip()
    assert first_change.startswith(field), msg  # the most specific field comes first
    assert "Restore the original values" in msg
    if change in ("seq_len", "global_batch_size", "tokenizer", "recipe"):
        assert len(msg.splitlines()) == 3, f"only {change} changed: {msg}"


def test_resume_after_the_data_changed_names_sources(
    saved: tuple[Path, dict[str, Any]], tok: TokenizerInfo
) -> None:
    recipe, state = saved
    data = recipe.parent / "code.jsonl"
    with open(data, "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "one more document"}) + "\n")
    loader = ZephonLoader(recipe, tok, seq_len=16, global_batch_size=16)
    try:
        with pytest.raises(StateError) as info:
            loader.load_state_dict(state)
    finally:
        loader.close()
    assert "sources: checkpoint has {'prose': 300, 'code': 200}" in str(info.value)
    assert "this run has {'prose': 300, 'code': 201}" in str(info.value)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"format": "torch.pickle"}, "not a Zephon loader state (expected format"),
        ({"version": 4}, "state version 4; this Zephon reads versions 1, 2, 3"),
        ({"version": None}, "state version None; this Zephon reads versions 1, 2, 3"),
        ({"lanes": DELETE}, "missing field 'lanes'"),
    ],
)
def test_state_with_wrong_header(
    saved: tuple[Path, dict[str, Any]], tok: TokenizerInfo, edit: dict[str, Any], expected: str
) -> None:
    recipe, state = saved
    bad = {k: v for k, v in {**state, **edit}.items() if v is not DELETE}
    loader = ZephonLoader(recipe, tok, seq_len=16, global_batch_size=16)
    try:
        with pytest.raises(StateError, match="loader state: ") as info:
            loader.load_state_dict(bad)
    finally:
        loader.close()
    assert expected in str(info.value)


def test_load_file_names_the_file(tmp_path: Path, saved: tuple[Path, dict[str, Any]]) -> None:
    _, state = saved
    not_json = tmp_path / "state.json"
    not_json.write_text("step: 3\nlanes: 8\n")
    binary = tmp_path / "state.bin"
    binary.write_bytes(b"\x80\x04\x95 a pickle, not JSON")
    wrong = tmp_path / "other.json"
    wrong.write_text(json.dumps({**state, "format": "something else"}))
    before = snapshot(not_json, binary, wrong)
    for path in (not_json, binary):
        with pytest.raises(StateError) as info:
            load_file(str(path))
        assert str(info.value).startswith(f"{path}: not valid JSON"), info.value
    with pytest.raises(StateError) as info:
        load_file(str(wrong))
    assert str(info.value).startswith(f"{wrong}: not a Zephon loader state")
    with pytest.raises(StateError, match="loader state file not found"):
        load_file(str(tmp_path / "missing.json"))
    assert snapshot(not_json, binary, wrong) == before
    good = tmp_path / "good.json"
    good.write_text(json.dumps(state))
    assert load_file(str(good)) == state


# -- command line ------------------------------------------------------------------------


def test_cli_prints_one_error_line_without_traceback(folder: Path) -> None:
    """`python -m zephon` for real: exit code 2, one `error:` line, no traceback."""
    bad_recipe = folder / "recipe.toml"
    bad_recipe.write_text(HEADER + SOURCE_A + "wieght = 2.0\n")
    before = snapshot(bad_recipe, folder / "a.jsonl")
    proc = subprocess.run(
        [sys.executable, "-m", "zephon", "validate", str(bad_recipe)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"zephon validate: error: {bad_recipe}:"), lines
    assert (
        "[source 'a'] has unknown key(s): wieght; did you mean 'weight'?; expected only: "
        in lines[0]
    )
    assert proc.stdout == ""
    assert snapshot(bad_recipe, folder / "a.jsonl") == before


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI in this process; return its single stderr line."""
    from zephon.tools.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse rejects the arguments
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert len([line for line in lines if "error: " in line]) == 1, err
    return lines[-1]


def test_cli_errors_in_process(
    folder: Path, tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """More failures through cli.main: each is one `error:` line naming what is wrong."""
    good = folder / "recipe.toml"
    good.write_text(HEADER + SOURCE_A)
    write_lines(folder / "bad.jsonl", good_lines(6) + [b"{oops"] + good_lines(6))
    (folder / "badline.toml").write_text(HEADER + '[[source]]\nname = "a"\npath = "bad.jsonl"\n')
    not_json = folder / "not-json.json"
    not_json.write_text("{not json")
    state = folder / "state.json"
    header = {"format": "zephon.loader_state", "version": 1, "fingerprint": {}, "step": 1}
    state.write_text(json.dumps({**header, "lanes": {"0": {"rows_since_flush": 0}}}))
    tok = ["--tokenizer", tokenizer_path]
    shape = ["--seq-len", "16", "--global-batch", "2"]
    cases = [
        (["validate", str(folder)], f"{folder}: recipe file is a folder, expected a TOML file"),
        (["validate", str(good), "--dp", "3", *tok], "exceeds the lane count 2"),
        (["validate", str(good), "--global-batch", "3", *tok], "not divisible by the lane"),
        (["validate", str(good), "--tokenizer", str(folder / "none.json")], "none.json"),
        (["preview", str(good), "--lane", "5", *tok], "--lane 5 is outside [0, 2)"),
        (["hash", str(good), "--seq-len", "0", *tok], "--seq-len: expected an integer >= 1"),
        (
            [
                "hash",
                str(folder / "badline.toml"),
                *shape,
                "--workers",
                "2",
                "--prefetch",
                "2",
                *tok,
            ],
            f"{folder / 'bad.jsonl'}:7: not valid JSON",
        ),
        (["inspect", str(not_json)], f"{not_json}: not valid JSON"),
        (["inspect", str(state)], f"{state}: malformed loader state"),
    ]
    for argv, expected in cases:
        line = cli_error(argv, capsys)
        assert expected in line, (argv, line)
