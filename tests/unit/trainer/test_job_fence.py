"""The job fence (torchtitan/components/job_fence.py): which replica group may still
write the job's history, from the dump folder's `job/` files alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchtitan.components.checkpoint import CheckpointError
from torchtitan.components.job_fence import FENCE_FOLDER, GENERATION_FILE, JobFence


def test_a_start_without_a_peer_begins_a_generation_and_ends_the_older_ones(tmp_path: Path):
    first = JobFence(str(tmp_path), "replica group 0")
    assert first.verdict(1, 8) is None  # nothing written yet: nobody is stale
    assert first.begin_generation(0) == 1
    for step in range(1, 4):
        assert first.verdict(step, 8) is None
        first.committed(step)
    # The whole job is started again from a checkpoint at step 2 (every group lost).
    again = JobFence(str(tmp_path), "replica group 1")
    assert again.begin_generation(2) == 2
    assert again.verdict(3, 8) is None  # its own generation: steps 3.. are its to write
    leave = first.verdict(4, 8)  # the old group wakes up
    assert leave is not None and not leave.finished
    assert "replica group 0: stale, its generation 1 is not the job's (2" in leave.line


def test_a_group_behind_the_committed_step_is_stale_and_one_that_copied_is_not(tmp_path: Path):
    writer = JobFence(str(tmp_path), "replica group 1")
    writer.begin_generation(0)
    for step in range(1, 7):
        writer.committed(step)
    paused = JobFence(str(tmp_path), "replica group 0")
    paused.adopt(1)  # same generation, but it stopped at step 3
    leave = paused.verdict(4, 8)
    assert leave is not None and not leave.finished
    assert "committed step 6 while this group was at step 3" in leave.line
    healed = JobFence(str(tmp_path), "replica group 0")
    healed.adopt(1)  # copied the peer's state: it is at step 6 now
    assert healed.verdict(7, 8) is None


def test_a_group_that_comes_back_after_the_end_leaves_and_a_longer_run_goes_on(tmp_path: Path):
    writer = JobFence(str(tmp_path), "replica group 0")
    writer.begin_generation(0)
    writer.committed(8)
    writer.finish(8)
    late = JobFence(str(tmp_path), "replica group 1")
    late.adopt(1)
    leave = late.verdict(4, 8)
    assert leave is not None and leave.finished
    assert "the job finished at step 8 while this group was away (it was at step 3)" in leave.line
    # The same job asked to train on to step 12: not finished for it.
    longer = JobFence(str(tmp_path), "replica group 0")
    assert longer.verdict(9, 12) is None
    longer.begin_generation(8)
    assert longer.finished_at() is None and late.verdict(9, 8) is not None


def test_a_group_paused_between_its_two_reads_while_the_job_ended_is_told_it_finished(
    tmp_path: Path,
):
    """The pause (SIGSTOP) comes between the verdict's two reads; meanwhile the writer
    commits the last step and marks the job finished. The group reads the marker
    after the generation, so it leaves as finished (exit 0), not as stale."""
    writer = JobFence(str(tmp_path), "replica group 0")
    writer.begin_generation(0)
    writer.committed(1)
    paused = JobFence(str(tmp_path), "replica group 1")
    paused.adopt(1)
    first_read = paused.state

    def state_then_the_job_ends():  # the first read, then the pause
        seen = first_read()
        for step in range(2, 9):
            writer.committed(step)
        writer.finish(8)
        return seen

    paused.state = state_then_the_job_ends  # type: ignore[method-assign]
    leave = paused.verdict(2, 8)
    assert leave is not None and leave.finished, leave
    assert "the job finished at step 8 while this group was away (it was at step 1)" in leave.line


def test_a_damaged_fence_file_is_named(tmp_path: Path):
    fence = JobFence(str(tmp_path), "replica group 0")
    folder = tmp_path / FENCE_FOLDER
    folder.mkdir()
    (folder / GENERATION_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=f"{GENERATION_FILE}: unreadable"):
        fence.verdict(1, 8)
    (folder / GENERATION_FILE).write_text(json.dumps({"generation": "x", "step": 1}))
    with pytest.raises(CheckpointError, match="expected integer 'generation' and 'step'"):
        fence.state()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("shared", [True, False])
def test_replica_groups_never_write_a_complete_checkpoint_again(
    tmp_path: Path, one_process_group: None, shared: bool
) -> None:
    """With replica groups (`shared`) a complete step folder is the job's history: a
    second save of that step writes nothing. A job alone replaces it (a resume from
    an older step the user chose trains and saves that step again)."""
    from torchtitan.components.checkpoint.manager import CheckpointManager
    from torchtitan.config.job_config import Checkpoint

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt = CheckpointManager(Checkpoint(), str(tmp_path / "dump"), model, opt, sched, shared=shared)
    assert ckpt.save(3, lambda: {"step": 3})
    first = _files(Path(ckpt.step_dir(3)))
    with torch.no_grad():
        model.weight.add_(1.0)  # a stale group's parameters
    again = ckpt.save(3, lambda: {"step": 3})
    assert again is not shared
    assert ckpt.complete_steps() == [3]
    assert (_files(Path(ckpt.step_dir(3))) == first) is shared
