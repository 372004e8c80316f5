"""End-to-end: the trainer resumed at another process count sees the same
global batches (digests) as the uninterrupted run, and nearly the same losses."""

from __future__ import annotations

import json
import re

import pytest
from helpers.train import (
    STEPS,
    K,
    copy_checkpoint,
    ensure_sample_data,
    logged_steps,
    metrics,
    ok,
    torchrun,
)

# Across process counts the same data is reduced in a different order (gradient
# reduce-scatter over D ranks, D-dependent micro-batch grouping of fp32 sums).
# That perturbs the last bits of each update; after 3 Adam steps on this model
# the loss moves by ~1e-6 relative. 1e-4 leaves room while still catching any
# change of data (a different batch moves the loss by > 1e-2).
LOSS_RTOL = 1e-4


# One process: the cheapest other size (4 -> 1: DCP reshards to one rank, one
# loader takes all 8 lanes). Other sizes are covered without a trainer per size:
# 4 -> 2 in test_train_mesh.py, every size of the loader itself in unit/zephon/test_resume.py.
@pytest.mark.parametrize("nproc", [1])
def test_resume_on_other_process_count_matches_reference(zephon_reference, tmp_path, nproc):
    ref_dump, ref = zephon_reference
    copy_checkpoint(ref_dump, K, tmp_path)
    proc = ok(torchrun(nproc, tmp_path))
    assert f"resumed from step {K} on {nproc} data-parallel rank(s)" in proc.stdout
    got = metrics(tmp_path)
    assert sorted(got) == list(range(K + 1, STEPS + 1))
    for step in range(K + 1, STEPS + 1):
        assert got[step]["digest"] == ref[step]["digest"], step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
        # Per-source counts are summed over the data-parallel ranks: the same
        # global figures at every size, and they cover every token of the rows
        # (concat packing: no padding, 16 rows x 65 tokens).
        assert got[step]["source_tokens"] == ref[step]["source_tokens"], step
        assert got[step]["source_docs"] == ref[step]["source_docs"], step
        assert set(got[step]["source_tokens"]) == {"prose", "code"}
        assert sum(got[step]["source_tokens"].values()) == 16 * 65


def test_resume_on_same_process_count_is_bitwise_identical(zephon_reference, tmp_path):
    """Same process count, same threads: every reduction happens in the same
    order, so on CPU the losses are equal to the last bit (compared as the
    float64 values written to metrics.jsonl), not just close."""
    ref_dump, ref = zephon_reference
    copy_checkpoint(ref_dump, K, tmp_path)
    proc = ok(torchrun(4, tmp_path))
    # A run that missed the checkpoint would start at step 0 and, with the same
    # weights and data, match the reference bit for bit too: prove the resume.
    assert f"resumed from step {K} on 4 data-parallel rank(s)" in proc.stdout
    assert f"training steps {K + 1}..{STEPS} " in proc.stdout
    assert logged_steps(tmp_path) == list(range(K + 1, STEPS + 1))
    got = metrics(tmp_path)
    for step in range(K + 1, STEPS + 1):
        assert got[step]["digest"] == ref[step]["digest"]
        assert got[step]["loss"] == ref[step]["loss"]
        assert got[step]["grad_norm"] == ref[step]["grad_norm"]


def test_initial_weights_do_not_depend_on_process_count(tmp_path):
    ensure_sample_data()
    digests = set()
    for nproc in (1, 4):  # unsharded, and sharded (as 2 would be, on more ranks)
        proc = ok(
            torchrun(
                nproc,
                tmp_path / f"init{nproc}",
                "--training.steps",
                "0",
                "--training.log_init_digest",
                "true",
                "--checkpoint.enable",
                "false",
            )
        )
        found = re.findall(r"initial weights sha256 ([0-9a-f]{64})", proc.stdout)
        assert found, proc.stdout[-2000:]
        digests.add(found[0])
    assert len(digests) == 1


def test_interrupted_checkpoint_is_never_the_resume_point(tmp_path):
    ensure_sample_data()
    crash_at = "TORCHTITAN_FAULT_CRASH_BEFORE_LOADER_STATE"
    # A crash inside the first save leaves no resume point: the next run starts
    # at step 0, and the records the crashed run logged (steps 1-3) are not kept
    # beside the new ones.
    first = torchrun(2, tmp_path, env={crash_at: "3"})
    assert first.returncode != 0 and logged_steps(tmp_path) == [1, 2, 3]
    crash = torchrun(2, tmp_path, env={crash_at: "6"})
    assert crash.returncode != 0
    assert "resumed from" not in crash.stdout and "training steps 1..6 " in crash.stdout
    assert logged_steps(tmp_path) == list(range(1, 7))
    step6 = tmp_path / "checkpoint" / "step-6"
    assert any(step6.glob("*.distcp"))  # the model files were written...
    assert not (step6 / "dataloader.json").exists()  # ...the loader state was not
    assert not (step6 / "COMPLETE.json").exists()
    proc = ok(torchrun(2, tmp_path, "--training.steps", "7"))
    assert "resumed from step 3 on 2" in proc.stdout
    assert (step6 / "COMPLETE.json").exists()  # redone properly this time
    # Steps 4-6 of the crashed run were dropped from the log and trained again.
    assert logged_steps(tmp_path) == list(range(1, 8))


def test_a_plain_run_accounts_for_every_second(zephon_reference):
    """goodput.json of the reference run (goodput.py): its 6 steps kept once, nothing
    redone, the causes adding up to the job's time with under 5% unexplained, and the
    steps' time equal to what the step records measured themselves."""
    dump, ref = zephon_reference
    doc = json.loads((dump / "goodput.json").read_text())
    assert (doc["attempts"], doc["steps_committed"], doc["steps_redone"]) == (1, STEPS, 0)
    assert doc["running"] is False and doc["notes"] == []
    bad = doc["badput_seconds"]
    assert bad["between_attempts"] == bad["steps_redone"] == bad["checkpoint_restore"] == 0
    assert bad["startup"] > 0 and bad["checkpoint_save"] > 0
    assert doc["productive_seconds"] + sum(bad.values()) == pytest.approx(
        doc["job_seconds"], abs=0.01
    )
    assert bad["other"] < 0.05 * doc["job_seconds"], doc
    # A step's record times it from its quorum to its log line; the ledger's three
    # parts end after that line.
    logged = sum(r["step_time_s"] for r in ref.values())
    ledger = doc["productive_seconds"] + bad["data_wait"] + bad["recovery"]
    assert logged <= ledger + 0.01 and ledger <= logged * 1.05 + 0.05 * STEPS, (logged, doc)
