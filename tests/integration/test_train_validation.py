"""The trainer's startup validator end to end (a bad layout fails before training,
with one message; a changed fingerprint is refused before any step), and the hf
baseline's behaviour on resume. The validator's own checks are
tests/unit/trainer/test_startup_validation.py."""

from __future__ import annotations

import re

import pytest
from helpers.shared import once
from helpers.train import copy_checkpoint, ensure_sample_data, metrics, ok, run_train_sh, torchrun


def test_bad_layout_fails_before_training_with_one_message(tmp_path):
    """Both ranks hit the error; the console shows it once, as one line, with no
    traceback, and the job exits 2 (the user's input)."""
    ensure_sample_data()
    proc = run_train_sh(2, tmp_path, "--training.global_batch_size", "36")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert out.count("global batch size 36 is not divisible") == 1, out
    assert "Traceback" not in out and "ChildFailedError" not in out, out
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    # Both ranks fail alike; which one reports first depends on timing, so the
    # prefix may name it ("error (rank 1): ...") or not ("error: ...").
    assert re.match(
        r"error( \(rank \d\))?: global batch size 36 is not divisible by the lane count 8",
        lines[0],
    ), lines[0]
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory):
    ensure_sample_data()
    dump = once(tmp_path_factory, "hfref", lambda d: ok(torchrun(2, d, "--data.loader", "hf")))
    return dump, metrics(dump)


def test_changed_fingerprint_is_refused_before_any_step(zephon_reference, tmp_path):
    copy_checkpoint(zephon_reference[0], 3, tmp_path / "resume")
    proc = torchrun(1, tmp_path / "resume", "--training.seq_len", "32")
    assert proc.returncode != 0
    assert "seq_len: checkpoint has 64, this run has 32" in proc.stderr
    assert not (tmp_path / "resume" / "metrics.jsonl").exists()


def test_hf_loader_refuses_another_process_count_by_default(hf_reference, tmp_path):
    ref_dump, _ = hf_reference
    copy_checkpoint(ref_dump, 3, tmp_path)
    proc = torchrun(1, tmp_path, "--data.loader", "hf")  # (1: the cheapest other count)
    assert proc.returncode != 0
    assert "checkpoint written with 2 data-parallel ranks, this run has 1" in proc.stderr


def test_hf_loader_skip_mode_trains_on_different_batches(hf_reference, tmp_path):
    ref_dump, ref = hf_reference
    copy_checkpoint(ref_dump, 3, tmp_path)
    ok(torchrun(1, tmp_path, "--data.loader", "hf", "--data.hf_resume", "skip"))
    got = metrics(tmp_path)
    assert sorted(got) == [4, 5, 6]
    for step in (4, 5, 6):
        assert got[step]["digest"] != ref[step]["digest"]
