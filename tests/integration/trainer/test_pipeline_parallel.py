"""Pipeline parallelism on CPU processes (gloo), over the sample phases recipe
(global batch 8 x 64 tokens, then 16 x 128 from step 11): PP 2 x FSDP 2 (4
processes, 1F1B) and PP 2 x FSDP 1 (2 processes, Interleaved1F1B with 2 stages
per rank, 4 in all) train on the same global batches as FSDP 2 alone with the
same losses (1e-5 relative), the schedule rebuilt for the new shape at the phase
boundary, and the same validation loss at the end; and the boundary checkpoint
written under PP 2 x FSDP 2 resumes as PP 2 x FSDP 1 with the same batches and
losses after it. (Fewer processes where the degree allows: on 2 cores a
4-process run costs about twice a 2-process one.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO
from helpers.train import (
    copy_checkpoint,
    ensure_sample_data,
    metrics,
    ok,
    read_validation,
    run_train_sh,
    torchrun_train,
)

pytestmark = pytest.mark.slow

STEPS = 12  # the phase boundary is after step 10
ARGS = [
    "--job.config_file", str(REPO / "train_configs" / "llama3_debugmodel.toml"),
    "--data.recipe", str(REPO / "train_configs" / "data" / "sample_phases.toml"),
    "--data.tokenizer", str(REPO / "assets" / "tokenizer" / "tokenizer.json"),
    "--data.log_batch_digests", "true", "--metrics.log_freq", "1",
    "--training.seq_len", "64", "--training.global_batch_size", "8",
    "--training.local_batch_size", "2", "--training.steps", str(STEPS),
    "--checkpoint.interval", "100", "--lr_scheduler.warmup_steps", "2",
    "--validation.enable", "true", "--validation.freq", str(STEPS), "--validation.steps", "2",
    "--validation.recipe", str(REPO / "train_configs" / "data" / "sample_val.toml"),
]  # fmt: skip
PP2 = ["--parallelism.pipeline_parallel_degree", "2"]


def run(nproc: int, dump: Path, *extra: str) -> Path:
    out = ok(torchrun_train(nproc, dump, [*ARGS, *extra], timeout=600))
    assert f"training done at step {STEPS}" in out.stdout, out.stdout[-2000:]
    if extra:  # one loader per data-parallel coordinate: stage 0 loads, stage 1 receives
        half = nproc // 2
        assert f"data loading work: {half} loader(s) on {nproc} process(es)" in out.stdout
        assert f"batches broadcast to {half} receiving peer(s)" in out.stdout
    return dump


def same_training(got: Path, ref: Path, steps: range) -> None:
    """The same batches and losses at `steps`, and the same validation loss after."""
    mine, theirs = metrics(got), metrics(ref)
    assert sorted(mine) == list(steps)
    for step in steps:
        assert mine[step]["digest"] == theirs[step]["digest"], step
        assert mine[step]["loss"] == pytest.approx(theirs[step]["loss"], rel=1e-5), step
    val = read_validation(got)
    assert list(val) == [STEPS] and val[STEPS] == pytest.approx(
        read_validation(ref)[STEPS], rel=1e-5
    )


def test_pp2_trains_like_fsdp_across_a_phase_and_resumes_at_another_degree(tmp_path):
    ensure_sample_data()
    ref = run(2, tmp_path / "fsdp2")
    one_f_one_b = run(4, tmp_path / "pp_1f1b", *PP2)
    same_training(one_f_one_b, ref, range(1, STEPS + 1))
    interleaved = run(
        2, tmp_path / "pp_interleaved", *PP2,
        "--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
    )  # fmt: skip
    same_training(interleaved, ref, range(1, STEPS + 1))
    shapes = metrics(ref)
    assert shapes[11]["tokens"] == 2 * 2 * shapes[10]["tokens"]  # the shape did change

    copy_checkpoint(tmp_path / "pp_1f1b", 10, tmp_path / "pp2_fsdp1")
    out = ok(torchrun_train(2, tmp_path / "pp2_fsdp1", [*ARGS, *PP2], timeout=600))
    assert "resumed from step 10 on 1 data-parallel rank(s)" in out.stdout
    assert "mesh pp 2 x dp_replicate 1 x dp_shard 1" in out.stdout
    same_training(tmp_path / "pp2_fsdp1", ref, range(11, STEPS + 1))


def test_a_pipeline_that_does_not_fit_fails_before_training_with_one_line(tmp_path):
    """Exit 2 (the user's input), one line, no traceback, nothing trained."""
    ensure_sample_data()
    proc = run_train_sh(2, tmp_path, *PP2, "--parallelism.pipeline_parallel_microbatch_size", "3")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "per data-parallel rank do not split into micro-batches of 3 rows" in lines[0]
    assert not (tmp_path / "metrics.jsonl").exists()
