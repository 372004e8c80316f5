"""`python -m zephon validate | preview | hash | inspect` on a real recipe.

Each command runs as a subprocess, all started at once (each pays for
importing torch); their output is checked against the library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.loader import close, make_ranks, step_digests

from zephon import ZephonLoader, load_tokenizer, merge_rank_states
from zephon.tools.cli import main

SEQ_LEN, GLOBAL_BATCH, STEPS = 32, 16, 4


def start(argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "zephon", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> list[str]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, (proc.args, out, err)
    assert "Traceback" not in err
    return out.splitlines()


def check_validate(out: list[str], recipe: Path, tokenizer_path: str) -> None:
    tok = load_tokenizer(tokenizer_path)
    assert out[0].startswith(f"recipe    {recipe}  (sha256 "), out[0]
    assert out[1] == (
        f"tokenizer {tokenizer_path}  (vocab {tok.vocab_size}, eos {tok.eos_id}, pad {tok.pad_id})"
    )
    assert out[2] == (
        "layout    lanes=8 dp=2 global_batch=16 rows/lane/step=2 rows/rank=8 "
        "micro_batch=4 micro_steps=2 idle=0.0% seq_len=32"
    )
    assert out[3:5] == ["  rank 0: lanes 0..3, 8 rows", "  rank 1: lanes 4..7, 8 rows"]
    assert out[5] == "mixture   unit=tokens"
    # block_size 16; 300 and 200 documents -> 19 and 13 blocks
    assert out[6] == (
        "  prose: jsonl, 1 file(s), 300 docs, text 'text', weight 0.700, "
        "on_exhausted=repeat, 19 blocks of 16"
    )
    assert out[7] == (
        "  code: jsonl, 1 file(s), 200 docs, text 'text', weight 0.300, "
        "on_exhausted=repeat, 13 blocks of 16"
    )
    assert out[8] == "packing   concat flush_interval=8 rows"
    assert out[-1] == "ok" and len(out) == 10


def check_preview(out: list[str], recipe: Path, tokenizer_path: str, lane: int) -> None:
    """Segments match the documents of the lane's rows, as the library makes them."""
    loader = ZephonLoader(recipe, tokenizer_path, SEQ_LEN, 8, 1, dp_rank=lane, dp_size=8)
    rows = [loader.next_batch() for _ in range(2)]
    loader.close()
    i = 0
    for r, batch in enumerate(rows):
        pos = batch.positions[0].tolist()
        starts = [t for t in range(SEQ_LEN) if pos[t] == 0] + [SEQ_LEN]
        lengths = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        ignored = int((batch.labels[0] == -100).sum())
        assert (
            out[i]
            == f"--- lane {lane} row {r}: {len(lengths)} segment(s), {ignored} ignored labels"
        )
        segs = out[i + 1 : i + 1 + len(lengths)]
        assert [int(s.split("[")[1].split(" tok]")[0]) for s in segs] == lengths, segs
        assert all(s.startswith("  [") and "'" in s for s in segs)
        i += 1 + len(lengths)
    assert i == len(out)
    assert "'doc" in out[1]  # decoded text of a synthetic document


def check_inspect(out: list[str], path: Path, state: dict[str, Any]) -> None:
    size = path.stat().st_size
    assert out[0] == f"{path}: zephon.loader_state v3, step 3"
    assert out[1] == f"size {size} bytes, {size / 8:.0f} bytes per lane"
    assert out[2] == "fingerprint " + json.dumps(state["fingerprint"], sort_keys=True)
    assert len(out) == 3 + 8
    for k in range(8):
        entry = state["lanes"][str(k)]
        flush = entry["flush"]
        srcs = " ".join(
            f"{n}:e{v['epoch']}/{v['pos']}{'(retired)' if v['retired'] else ''}"
            for n, v in flush["sources"].items()
        )
        assert out[3 + k] == (
            f"  lane {k}: flush row {flush['row']} +{entry['rows_since_flush']} rows, "
            f"skip {flush['skip_tokens']} tok, {srcs}"
        )
        assert flush["row"] + entry["rows_since_flush"] == 3 * GLOBAL_BATCH // 8


def test_cli_commands(
    make_recipe: Any, tokenizer_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = make_recipe()
    # a state file written by two simulated ranks after 3 steps
    ranks = make_ranks(recipe, tokenizer_path, 2, seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH)
    step_digests(ranks, 3)
    state = merge_rank_states([r.state_dict() for r in ranks])
    close(ranks)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(state))

    tok = ["--tokenizer", tokenizer_path]
    shape = ["--seq-len", str(SEQ_LEN), "--global-batch", str(GLOBAL_BATCH)]
    hash_args = ["hash", str(recipe), *tok, *shape, "--steps", str(STEPS)]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    procs = {
        "validate": start(["validate", str(recipe), *tok, *shape, "--dp", "2", "--micro-batch", "4"], cwd),
        "preview": start(["preview", str(recipe), *tok, "--seq-len", str(SEQ_LEN), "--lane", "3", "--chars", "40"], cwd),
        "hash": start([*hash_args, "--dp", "4", "--workers", "2", "--prefetch", "3"], cwd),
        "inspect": start(["inspect", str(state_file)], cwd),
    }  # fmt: skip

    # Meanwhile, in this process: the library's digests, and `hash` at --dp 1 and 4
    # through main() (each extra subprocess would cost seconds of importing torch).
    ranks = make_ranks(recipe, tokenizer_path, 1, seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH)
    expected = [f"step {s} {d}" for s, d in enumerate(step_digests(ranks, STEPS))]
    close(ranks)
    assert len(set(expected)) == STEPS
    for dp in ("1", "4", "3"):  # 3 ranks own 2, 3 and 3 of the 8 lanes
        assert main([*hash_args, "--dp", dp]) == 0
        assert capsys.readouterr().out.splitlines() == expected, dp

    out = {name: finish(proc) for name, proc in procs.items()}
    assert out["hash"] == expected  # --dp 4 --workers 2 --prefetch 3
    check_validate(out["validate"], recipe, tokenizer_path)
    check_preview(out["preview"], recipe, tokenizer_path, lane=3)
    check_inspect(out["inspect"], state_file, state)


def test_validate_reports_an_uneven_layout(
    make_recipe: Any, tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = make_recipe()
    argv = ["validate", str(recipe), "--tokenizer", tokenizer_path, "--global-batch", "16"]
    assert main([*argv, "--dp", "3", "--micro-batch", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[3:6] == [
        "  rank 0: lanes 0..1, 4 rows + 2 padding",
        "  rank 1: lanes 2..4, 6 rows",
        "  rank 2: lanes 5..7, 6 rows",
    ]
    assert out[6] == (
        "imbalance padded layout: 8 lanes over 3 data-parallel ranks, rows per rank 4 on "
        "1 rank, 6 on 2 ranks; every rank runs 6 rows (3 micro-batches of 2), so 2 of the "
        "18 rows run per step are padding: 11.1% of the compute idles"
    )
    assert main([*argv, "--dp", "3", "--micro-batch", "2", "--max-idle-share", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "more than the allowed 10.0%" in err and "without padding: 1, 2, 4, 8" in err


def test_preview_shows_padding_as_one_segment(
    make_recipe: Any, tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = make_recipe(algorithm="best_fit", lanes=2, flush_interval=2)
    argv = ["preview", str(recipe), "--tokenizer", tokenizer_path, "--seq-len", "64"]
    assert main([*argv, "--rows", "6", "--lane", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    headers = [k for k, line in enumerate(out) if line.startswith("--- lane 1 row ")]
    assert len(headers) == 6
    padded = 0
    for h, end in zip(headers, [*headers[1:], len(out)], strict=True):
        segs = out[h + 1 : end]
        sizes = [int(s.split("[")[1].split(" tok]")[0]) for s in segs]
        assert sum(sizes) == 64, segs
        ignored = int(out[h].split(", ")[1].split(" ignored")[0])
        docs = int(out[h].split(": ")[1].split(" segment")[0])
        pads = [s for s in segs if s.endswith("(padding)")]
        assert len(pads) <= 1 and (not pads or segs[-1] == pads[0])
        assert docs == len(segs) - len(pads)
        if pads:
            padded += 1
            # padding tokens are all ignored as labels, plus the label before them
            assert ignored == sizes[-1] + 1
    assert padded > 0, "best_fit with flush_interval 2 should pad some rows"
