"""The trainer follows the recipe's data schedule (CPU/gloo, the debug model).

One uninterrupted run on 2 processes crosses every kind of boundary: a
batch-size ramp (8 -> 16 rows), a seq_len change (32 -> 64, micro-batches in
tokens so the rows per micro-batch halve), a new mixture with a source used for
the first time, and a lane-count change (4 -> 8 lanes, the ranks exchanging
their states first). Its boundary checkpoints survive `keep_latest_k = 1`. It
is resumed on 3 processes from the seq_len boundary checkpoint, and that run on
1 process from its own mid-phase checkpoint: every digest equals the
uninterrupted run's, losses within float reduction order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.train import (
    PHASE_NAMES,
    PHASE_SHAPES,
    PHASE_STEPS,
    REPO,
    copy_checkpoint,
    ensure_sample_data,
    logged_steps,
    metrics,
    ok,
    phase_recipe,
    torchrun_train,
)

LOSS_RTOL = 1e-5


def train(nproc: int, dump: Path, recipe: Path, *extra: str):
    """The debug model on the phase recipe; the job's shape agrees with the first phase."""
    args = [
        "--job.config_file", str(REPO / "train_configs" / "llama3_debugmodel.toml"),
        "--data.recipe", str(recipe), "--training.seq_len", "32",
        "--training.global_batch_size", "8", "--training.local_batch_tokens", "64",
        "--training.steps", str(PHASE_STEPS), "--checkpoint.interval", "5",
        "--lr_scheduler.warmup_steps", "2", "--lr_scheduler.decay_phase", "anneal",
        "--data.log_batch_digests", "true", *extra,
    ]  # fmt: skip
    return ok(torchrun_train(nproc, dump, args, timeout=300))


def assert_same_run(got: dict, ref: dict, steps: range) -> None:
    assert sorted(got) == list(steps)
    for s in steps:
        assert got[s]["digest"] == ref[s]["digest"], s
        assert got[s]["loss"] == pytest.approx(ref[s]["loss"], rel=LOSS_RTOL), s
        assert got[s]["phase"] == ref[s]["phase"] and got[s]["lr"] == ref[s]["lr"], s


def test_phase_schedule_trains_through_every_boundary_and_resumes_elsewhere(tmp_path):
    ensure_sample_data()
    recipe = phase_recipe(tmp_path)
    ref_dump = tmp_path / "dp2"
    proc = train(2, ref_dump, recipe, "--checkpoint.keep_latest_k", "1")
    ref = metrics(ref_dump)
    assert logged_steps(ref_dump) == list(range(1, PHASE_STEPS + 1))
    assert [ref[s]["phase"] for s in ref] == PHASE_NAMES
    assert len({ref[s]["digest"] for s in ref}) == PHASE_STEPS
    for s, (rows, seq_len) in zip(ref, PHASE_SHAPES, strict=True):
        # The step's shape is its phase's: tokens, and every row's tokens by source.
        assert ref[s]["tokens"] == rows * seq_len, s
        assert sum(ref[s]["source_tokens"].values()) == rows * (seq_len + 1), s
        assert (ref[s]["source_tokens"]["curated"] > 0) == (ref[s]["phase"] == "anneal"), s
    assert ref[PHASE_STEPS]["scheduled_shares"] == {"prose": 0.3, "code": 0.2, "curated": 0.5}
    # 64 tokens per micro-batch: 4 rows per rank in 2 micro-steps, then 8 in 4, then 8 in 8.
    for text in ("rows/rank=4 micro_batch=2 micro_steps=2", "rows/rank=8 micro_batch=2 "
                 "micro_steps=4", "rows/rank=8 micro_batch=1 micro_steps=8"):  # fmt: skip
        assert text in proc.stdout
    # The ranks exchanged their states once, before the anneal's first step, taking
    # the document the step-6 boundary checkpoint gathered (no second gather).
    handoff = "every rank took the merged loader state of 2 data-parallel ranks"
    assert proc.stdout.count(handoff) == 1
    at = proc.stdout.index(handoff)
    assert proc.stdout.index("step      6 |") < at < proc.stdout.index("step      7 |")
    assert f"{handoff} (the boundary checkpoint's)" in proc.stdout
    # The LR decays over the anneal (steps 7-8) only, to the floor at its last step.
    lrs = [ref[s]["lr"] for s in ref]
    assert lrs[2:6] == [1e-3] * 4 and lrs[6] < 1e-3 and lrs[7] == pytest.approx(1e-4)
    # Boundary checkpoints (2, 4, 6) survive keep_latest_k = 1; of the others the
    # newest (the last step) stays and step 5 is pruned.
    folder = ref_dump / "checkpoint"
    assert sorted(int(p.name[5:]) for p in folder.glob("step-*")) == [2, 4, 6, PHASE_STEPS]
    for b, name in ((2, "main"), (4, "long"), (6, "anneal")):
        state = json.loads((folder / f"step-{b}" / "dataloader.json").read_text())
        assert state["boundary_of"] == name and state["step"] == b

    # 3 processes from the seq_len boundary: uneven 4 lanes (1, 1, 2), then 8
    # lanes (2, 3, 3) after crossing the lane-count change on 3 ranks.
    dp3 = tmp_path / "dp3"
    copy_checkpoint(ref_dump, 4, dp3)
    proc = train(3, dp3, recipe)
    assert "resumed from step 4 on 3 data-parallel rank(s)" in proc.stdout
    assert f"training steps 5..{PHASE_STEPS}" in proc.stdout
    assert proc.stdout.count("merged loader state of 3 data-parallel ranks (the boundary") == 1
    assert_same_run(metrics(dp3), ref, range(5, PHASE_STEPS + 1))

    # 1 process from that run's mid-phase checkpoint (step 5, inside 'long').
    dp1 = tmp_path / "dp1"
    copy_checkpoint(dp3, 5, dp1)
    proc = train(1, dp1, recipe)
    assert "resumed from step 5 on 1 data-parallel rank(s)" in proc.stdout
    assert "every rank took the merged loader state" not in proc.stdout  # one rank: alone
    assert_same_run(metrics(dp1), ref, range(6, PHASE_STEPS + 1))
