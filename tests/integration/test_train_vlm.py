"""End-to-end: the vision-language debug model trained on the sample image-text
recipe (`train_configs/vlm_debugmodel.toml`) on 2 processes, resumed from its
checkpoint on 1: the same global batches (digests, pixels included) and nearly
the same losses after the checkpoint."""

from __future__ import annotations

import pytest
from helpers import REPO
from helpers.train import copy_checkpoint, ensure_sample_data, metrics, ok, torchrun_train

K, STEPS = 2, 3
# As in test_train_elastic.py: another process count reduces in another order,
# which moves the loss by ~1e-6 relative; another batch moves it by > 1e-2.
LOSS_RTOL = 1e-4
ARGS = [
    "--job.config_file", str(REPO / "train_configs" / "vlm_debugmodel.toml"),
    "--training.seq_len", "128",  # image blocks are at most 66 tokens here
    "--training.global_batch_size", "8",
    "--training.local_batch_size", "2",
    "--training.steps", str(STEPS),
    "--checkpoint.interval", str(K),
    "--lr_scheduler.warmup_steps", "1",
]  # fmt: skip


def test_vlm_resumes_on_another_process_count_with_the_same_batches(tmp_path):
    ensure_sample_data()
    ref_dump, dump = tmp_path / "ref", tmp_path / "resume"
    ok(torchrun_train(2, ref_dump, ARGS, timeout=600))
    ref = metrics(ref_dump)
    assert sorted(ref) == list(range(1, STEPS + 1))
    # the batches held images: every step drew from both image sources
    for step in ref.values():
        assert step["source_tokens"]["captions"] > 0 and step["source_tokens"]["interleaved"] > 0
    copy_checkpoint(ref_dump, K, dump)
    proc = ok(torchrun_train(1, dump, ARGS, timeout=600))
    assert f"resumed from step {K} on 1 data-parallel rank(s)" in proc.stdout
    got = metrics(dump)
    assert sorted(got) == list(range(K + 1, STEPS + 1))
    for step in range(K + 1, STEPS + 1):
        assert got[step]["digest"] == ref[step]["digest"], step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
