"""Data identity is the data's, not the paths' (docs/design.md §11).

A checkpoint checks what defines the batches: the sources' content (size and
sampled blocks of each file), their order and settings, and the phases. The
same files reached by another path resume; a changed file is refused by name.

`tests/golden/state_phased_v2.json` is a loader state of a five-phase recipe
written by the code before content fingerprints (state version 2, recipe
digests over paths relative to the recipe folder), with the digests of its
uninterrupted run in `digests_phased_v2.json`. Written once:
    PYTHONPATH=tests python tests/integration/zephon/test_data_identity.py --write
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import GOLDEN
from helpers.corpus import COMMITTED_TOKENIZER, synthetic_docs, write_jsonl
from helpers.loader import close, make_ranks, save, step_digests

from zephon import LayoutError, StateError, load_recipe
from zephon.recipe.phases import resolve_phases
from zephon.sources.content import BLOCK, block_difference, file_fingerprint, source_fingerprints
from zephon.sources.storage import LocalObject

TOK = str(COMMITTED_TOKENIZER)
STEPS = 12
STATE_STEP = 7  # after 'anneal' (a lane-count change) started
PHASES = """
[[phase]]
name = "warmup"
start_step = 0
global_batch_size = 8
seq_len = 32
weights = { prose = 0.7, code = 0.3 }

[[phase]]
name = "ramp"
start_step = 2
global_batch_size = 16

[[phase]]
name = "long"
start_step = 4
seq_len = 48

[[phase]]
name = "anneal"
start_step = 6
weights = { prose = 0.2, code = 0.3, math = 0.5 }
lanes = 8

[[phase]]
name = "final"
start_step = 9
global_batch_size = 24
"""
SOURCES = (("prose", 120, 0.7), ("code", 90, 0.3), ("math", 60, 1.0))


def write_corpus(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for k, (name, n, _) in enumerate(SOURCES):
        write_jsonl(folder / f"{name}.jsonl", synthetic_docs(n, seed=700 + k))


def recipe_text(corpus: str, cache: Path) -> str:
    """The five-phase recipe; `corpus`: the folder of its sources as written in
    the recipe ("" for the recipe's own folder)."""
    parts = [
        '[recipe]\nname = "phased"\nseed = 77\nlanes = 4\n',
        "[shuffle]\nblock_size = 8\n[packing]\nflush_interval = 4\n",
        f'[execution]\nworkers = 0\nprefetch = 0\ncache_dir = "{cache}"\n',
    ]
    for name, _, weight in SOURCES:
        parts.append(
            f'[[source]]\nname = "{name}"\npath = "{corpus}{name}.jsonl"\nweight = {weight}\n'
        )
    return "\n".join(parts) + PHASES


def build_case(root: Path) -> Path:
    """The corpus beside its recipe, paths relative: as the golden state was written."""
    write_corpus(root)
    recipe = root / "recipe.toml"
    recipe.write_text(recipe_text("", root / "cache"))
    return recipe


def run(recipe: Path, dp: int, steps: int, state: dict[str, Any] | None = None) -> list[str]:
    loaders = make_ranks(recipe, TOK, dp)
    try:
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(state)
        return step_digests(loaders, steps)
    finally:
        close(loaders)


def golden_digests() -> list[str]:
    return json.loads((GOLDEN / "digests_phased_v2.json").read_text())


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The five-phase recipe with its sources by absolute path (as the reviewer's
    was), run on 2 ranks: the states after steps 4 and STATE_STEP, and the digests."""
    root = tmp_path_factory.mktemp("identity")
    write_corpus(root / "corpus")
    recipe = root / "recipe.toml"
    recipe.write_text(recipe_text(f"{root / 'corpus'}/", root / "cache"))
    loaders = make_ranks(recipe, TOK, 2)
    digests = step_digests(loaders, 4)
    states = {4: json.loads(json.dumps(save(loaders)))}
    digests += step_digests(loaders, STATE_STEP - 4)
    states[STATE_STEP] = json.loads(json.dumps(save(loaders)))
    close(loaders)
    return {"root": root, "recipe": recipe, "states": states, "digests": digests}


def test_a_copied_recipe_and_a_moved_corpus_resume(saved, tmp_path):
    """A byte-identical copy of the recipe in a subfolder (the reviewer's case), and
    the corpus moved to another folder with the recipe edited to the new path: the
    state resumes onto the uninterrupted run's digests, at another rank count."""
    root, state = saved["root"], saved["states"][STATE_STEP]
    assert saved["digests"] == golden_digests()[:STATE_STEP]  # the bytes never moved
    assert state["version"] == 3 and sorted(state["fingerprint"]["files"]) == [
        "code",
        "math",
        "prose",
    ]
    rest = golden_digests()[STATE_STEP:]
    copy = root / "experiments" / "anneal-b" / "recipe.toml"
    copy.parent.mkdir(parents=True)
    shutil.copy(saved["recipe"], copy)
    assert run(copy, 4, STEPS - STATE_STEP, state) == rest
    moved = tmp_path / "other-mount" / "data"
    shutil.copytree(root / "corpus", moved)
    edited = tmp_path / "recipe.toml"
    edited.write_text(recipe_text(f"{moved}/", tmp_path / "cache"))
    assert run(edited, 1, STEPS - STATE_STEP, state) == rest


@pytest.mark.parametrize("change", ["other-size", "same-size"])
def test_a_changed_file_is_refused_by_name(saved, tmp_path, change):
    """A source file replaced by content of another size, or by other bytes of the
    same size: refused, naming the source, the file and what differs."""
    corpus = tmp_path / "corpus"
    shutil.copytree(saved["root"] / "corpus", corpus)
    target = corpus / "code.jsonl"
    data = target.read_bytes()
    at = data.index(b"doc7 ") + 5  # inside a document's text: still valid JSONL
    edited = data[:at] + (b"x " if change == "other-size" else b"X") + data[at + 1 :]
    target.write_bytes(edited)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(recipe_text(f"{corpus}/", tmp_path / "cache"))
    loaders = make_ranks(recipe, TOK, 1)
    try:
        with pytest.raises(StateError) as info:
            loaders[0].load_state_dict(saved["states"][STATE_STEP])
    finally:
        close(loaders)
    msg = str(info.value)
    size = len(data)
    what = (
        f"size: checkpoint has {size} bytes, this run has {size + 1}"
        if change == "other-size"
        else f"content fingerprint of bytes 0..{size - 1} (same size, {size} bytes)"
    )
    assert f"source 'code': file 1 of 1, {target}: {what}" in msg, msg
    assert "prose" not in msg and "math" not in msg, msg  # only the changed file


def test_an_old_state_resumes_and_is_checked_by_its_paths(tmp_path):
    """The committed version 2 state of the five-phase recipe resumes onto its
    digests, past a lane-count change; it identifies the data by relative paths, so
    with the recipe copied elsewhere it is refused, and the message says why."""
    state = json.loads((GOLDEN / "state_phased_v2.json").read_text())
    assert state["version"] == 2 and "files" not in state["fingerprint"]
    recipe = build_case(tmp_path / "case")
    assert run(recipe, 4, STEPS - STATE_STEP, state) == golden_digests()[STATE_STEP:]
    copy = tmp_path / "case" / "sub" / "recipe.toml"
    copy.parent.mkdir()
    copy.write_text(recipe_text(f"{tmp_path / 'case'}/", tmp_path / "cache"))
    with pytest.raises(StateError) as info:
        run(copy, 1, 1, state)
    msg = str(info.value)
    assert "phase 'warmup': recipe: checkpoint has" in msg, msg
    assert "loader state version 2 or older" in msg and "prose: ../prose.jsonl" in msg, msg


def test_the_fingerprint_reads_three_blocks_whatever_the_size(tmp_path, monkeypatch):
    """Bytes read per file: the whole of a small file, three blocks of a large one
    (sparse files of 1 and 64 MiB), none once the node's cache holds them; a change
    in the middle block is named by its offsets."""
    read = []
    real = LocalObject.sample

    def counting(self, offset, n):
        data = real(self, offset, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(LocalObject, "sample", counting)
    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(10_000))
    sizes = {small: 10_000}
    for mib in (1, 64):
        big = tmp_path / f"big{mib}.bin"
        with open(big, "wb") as f:
            f.truncate(mib << 20)
        sizes[big] = mib << 20
    for path, size in sizes.items():
        read.clear()
        fp = file_fingerprint(LocalObject(str(path)))
        assert fp[0] == size and sum(read) == min(size, 3 * BLOCK), path
    objects = [LocalObject(str(p)) for p in sizes]
    read.clear()
    first = source_fingerprints(objects, str(tmp_path / "cache"))
    assert sum(read) == 10_000 + 6 * BLOCK
    read.clear()
    assert source_fingerprints(objects, str(tmp_path / "cache")) == first and read == []
    big = tmp_path / "big1.bin"
    with open(big, "r+b") as f:
        f.seek((1 << 19) + 5)
        f.write(b"!")
    middle = (1 << 20) - BLOCK
    assert block_difference(first[1], file_fingerprint(LocalObject(str(big)))) == (
        f"content fingerprint of bytes {middle // 2}..{middle // 2 + BLOCK - 1} "
        f"(same size, {1 << 20} bytes): checkpoint has {first[1][1][1]}, this run has "
        f"{file_fingerprint(LocalObject(str(big)))[1][1]}"
    )


def test_an_s3_corpus_and_its_local_mirror_are_the_same_data(
    saved, tmp_path, moto_endpoint, monkeypatch
):
    """The same bytes on S3 give the same fingerprints, read by three ranged requests
    of a block; the checkpoint of the local corpus resumes from its S3 mirror."""
    import s3fs

    from zephon.sources.remote import RemoteObject

    fs = s3fs.S3FileSystem(endpoint_url=moto_endpoint)
    fs.mkdir("zephon-identity")
    fs.put(f"{saved['root'] / 'corpus'}/", "zephon-identity/corpus/", recursive=True)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(5 * BLOCK + 7))
    fs.put(str(big), "zephon-identity/big.bin")
    fetched = []
    real = RemoteObject.fetch

    def counting(self, start, end):
        data = real(self, start, end)
        fetched.append(len(data))
        return data

    monkeypatch.setattr(RemoteObject, "fetch", counting)
    options = {"endpoint_url": moto_endpoint}
    remote = RemoteObject("s3://zephon-identity/big.bin", options, str(tmp_path / "c"))
    assert file_fingerprint(remote) == file_fingerprint(LocalObject(str(big)))
    assert fetched == [BLOCK] * 3
    recipe = tmp_path / "s3.toml"
    recipe.write_text(
        recipe_text("s3://zephon-identity/corpus/", tmp_path / "cache")
        + f'\n[storage]\nendpoint_url = "{moto_endpoint}"\n'
    )
    state = saved["states"][STATE_STEP]
    loaders = make_ranks(recipe, TOK, 1)
    assert loaders[0].fingerprint["files"] == state["fingerprint"]["files"]
    assert "remote" in loaders[0].fingerprint and "remote" not in state["fingerprint"]
    loaders[0].load_state_dict(state)
    assert step_digests(loaders, 2) == golden_digests()[STATE_STEP : STATE_STEP + 2]
    close(loaders)


# -- three messages that tell the truth ------------------------------------------


def _edited(saved: dict[str, Any], tmp_path: Path, old: str, new: str) -> Path:
    recipe = tmp_path / "recipe.toml"
    text = saved["recipe"].read_text()
    assert old in text
    recipe.write_text(text.replace(old, new))
    return recipe


def _refusal(recipe: Path, state: dict[str, Any]) -> str:
    loaders = make_ranks(recipe, TOK, 1)
    try:
        with pytest.raises(StateError) as info:
            loaders[0].check_resumable(state)
    finally:
        close(loaders)
    return str(info.value)


def test_a_moved_phase_boundary_is_named_as_moved(saved, tmp_path):
    """A phase that started after the checkpoint, moved before it, and a phase that
    had started, moved after it: each refusal says the phase exists and its start
    step moved (the checkpoint lists the phases still to come)."""
    early = saved["states"][4]
    assert early["later_phases"] == [["long", 4], ["anneal", 6], ["final", 9]]
    recipe = _edited(
        saved, tmp_path, 'name = "long"\nstart_step = 4', 'name = "long"\nstart_step = 3'
    )
    msg = _refusal(recipe, early)
    assert (
        "phase 'long' starts at step 3, before the checkpoint's step 4, but the checkpoint's "
        "run had it start at step 4: its start step moved from 4 to 3, which a resume past "
        "step 3 cannot accept"
    ) in msg, msg
    assert "no such phase" not in msg
    recipe = _edited(
        saved, tmp_path, 'name = "anneal"\nstart_step = 6', 'name = "anneal"\nstart_step = 8'
    )
    msg = _refusal(recipe, saved["states"][STATE_STEP])
    assert (
        "phase 'anneal' (from step 6) had started by the checkpoint's step 7; its start step "
        "moved from 6 to 8"
    ) in msg, msg


def test_a_phase_lane_count_below_dp_names_the_phase_setting(saved):
    """D above a phase's lane count: the hint names the [[phase]] `lanes` that sets
    it (or keeps it), not [recipe] lanes; the loader's and trainer's check too."""
    timeline = resolve_phases(load_recipe(saved["recipe"]), 32, 8)
    phases = {p.name: p for p in timeline.phases}
    hints = {}
    for name in ("warmup", "anneal", "final"):
        with pytest.raises(LayoutError) as info:
            timeline.layout_of(phases[name], 16)
        hints[name] = str(info.value).split("; ")[-1]
    assert hints == {
        "warmup": "raise [recipe] lanes to a multiple of 16",
        "anneal": "raise `lanes` of [[phase]] 'anneal' to a multiple of 16",
        "final": "raise `lanes` of [[phase]] 'anneal' (phase 'final' keeps its count) "
        "to a multiple of 16",
    }
    with pytest.raises(LayoutError, match=r"^phase 'anneal' \(from step 6\): data-parallel "):
        timeline.layouts(16, from_step=STATE_STEP)


IMAGE_RECIPE = """[recipe]
lanes = 2
bad_records = "{bad}"
[image]
patch_size = 8
merge = 2
max_pixels = 16384
[[source]]
name = "p"
path = "a.parquet"
image_field = "im"
text_field = "t"
[[phase]]
name = "warmup"
start_step = 0
seq_len = 128
[[phase]]
name = "short"
start_step = 3
seq_len = 32
[[phase]]
name = "exact"
start_step = 6
seq_len = 65
"""


def test_validate_checks_every_phase_row_against_the_largest_image(tmp_path, capsys):
    """max_pixels 16384 in 16 x 16 windows: 64 placeholder tokens + start and end =
    66 tokens, a row of seq_len 65 exactly. validate names the phase that is too
    short and fails (bad_records = "error"); with "drop" it says so and passes."""
    pytest.importorskip("PIL")
    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers.images import jpeg

    from zephon.tools.cli import main

    pq.write_table(pa.table({"im": [jpeg(8, 8)], "t": ["x"]}), tmp_path / "a.parquet")
    recipe = tmp_path / "img.toml"
    line = (
        "images    phase 'short' (from step 3): seq_len 32 is too short for the largest "
        "image [image] allows: 64 placeholder tokens (max_pixels 16384, one per 16 x 16 "
        "pixels) + start and end = 66 tokens, which need seq_len >= 65; raise the seq_len, "
        "or lower [image] max_pixels to at most 7936"
    )
    recipe.write_text(IMAGE_RECIPE.format(bad="error"))
    assert main(["validate", str(recipe), "--global-batch", "4"]) == 2
    out = capsys.readouterr()
    assert [s for s in out.out.splitlines() if s.startswith("images")] == [line]
    assert "1 phase(s) cannot hold the largest image" in out.err and out.out[-3:] != "ok\n"
    recipe.write_text(IMAGE_RECIPE.format(bad="drop"))
    assert main(["validate", str(recipe), "--global-batch", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [s for s in out if s.startswith("images")] == [
        line + '; bad_records = "drop": such images are left out'
    ]


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        loaders = make_ranks(build_case(Path(tmp)), TOK, 2)
        digests = step_digests(loaders, STATE_STEP)
        state = json.loads(json.dumps(save(loaders)))
        digests += step_digests(loaders, STEPS - STATE_STEP)
        close(loaders)
    (GOLDEN / "state_phased_v2.json").write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    (GOLDEN / "digests_phased_v2.json").write_text(json.dumps(digests, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
