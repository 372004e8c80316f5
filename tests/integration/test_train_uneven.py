"""End-to-end on CPU/gloo: 8 lanes on 3 processes (2, 3 and 3 lanes) train on the
same global batches as the even 4-process reference, with the smaller rank padded
to the same micro-steps (in training and validation); its checkpoint resumes on 2
processes with the same digests and validation loss. The larger cases (12 lanes at 4 -> 5 and 7, DP 3 x TP 2) are in
`scripts/experiments/uneven_resume.py`."""

from __future__ import annotations

import json

import pytest
from helpers.train import REPO, STEPS, K, copy_checkpoint, ensure_sample_data, metrics, ok, torchrun

from harness.train import read_validation

# Same data, another reduction order (see test_train_elastic): the last bits move.
LOSS_RTOL = 1e-5
# Validation at the end (8 lanes, 2 batches of 16 rows): at 3 ranks it pads too.
VALIDATION = [
    "--validation.enable", "true", "--validation.steps", "2",
    "--validation.recipe", str(REPO / "train_configs" / "data" / "sample_val.toml"),
]  # fmt: skip


def assert_matches(got: dict, ref: dict, steps: range) -> None:
    assert sorted(got) == list(steps)
    for step in steps:
        assert got[step]["digest"] == ref[step]["digest"], step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
        assert got[step]["grad_norm"] == pytest.approx(ref[step]["grad_norm"], rel=1e-4), step
        # Padding rows never enter the per-source counts (16 rows x 65 tokens).
        assert got[step]["source_tokens"] == ref[step]["source_tokens"], step
        assert sum(got[step]["source_tokens"].values()) == 16 * 65


def test_uneven_run_matches_the_even_one_and_resumes_even(zephon_reference, tmp_path):
    _, ref = zephon_reference
    ensure_sample_data()
    uneven = tmp_path / "dp3"
    proc = ok(torchrun(3, uneven, *VALIDATION))
    # 16 rows over ranks of 4, 6, 6 rows; micro-batch 2: every rank runs 3 micro-steps.
    assert "rows per rank 4 on 1 rank, 6 on 2 ranks" in proc.stdout
    assert "idle=11.1%" in proc.stdout
    assert_matches(metrics(uneven), ref, range(1, STEPS + 1))
    state = json.loads((uneven / "checkpoint" / f"step-{K}" / "dataloader.json").read_text())
    assert state["dp_size"] == 3 and sorted(map(int, state["lanes"])) == list(range(8))

    even = tmp_path / "dp2"
    copy_checkpoint(uneven, K, even)
    proc = ok(torchrun(2, even, *VALIDATION))
    assert f"resumed from step {K} on 2 data-parallel rank(s)" in proc.stdout
    assert_matches(metrics(even), ref, range(K + 1, STEPS + 1))
    # The same model on the same validation batches, padded at 3 ranks, not at 2.
    val3, val2 = read_validation(uneven), read_validation(even)
    assert list(val3) == list(val2) == [STEPS]
    assert val3[STEPS] == pytest.approx(val2[STEPS], rel=LOSS_RTOL)
