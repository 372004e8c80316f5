"""The replica-group step driver (components/replica_group_steps.py): a step that did
not commit is made again from every lane's state at its start, with the same
bytes, also when the membership did not change (a group failed inside the step
and came back before the next quorum, or a commit vote failed). Run here with the
groups of a job without torchft (one group), whose quorum never changes."""

from __future__ import annotations

import time

import torch
from helpers.train import BASE_ARGS, ensure_sample_data

from torchtitan.components.replica_group_steps import ReplicaGroupSteps
from torchtitan.config.job_config import load_job_config
from torchtitan.datasets.dataloader import TrainDataLoader


def test_a_redo_without_a_membership_change_makes_the_same_batch_again(one_process_group, tmp_path):
    ensure_sample_data()
    cfg = load_job_config([*BASE_ARGS, "--job.dump_folder", str(tmp_path / "dump")])
    built: list[TrainDataLoader] = []

    def build(dp_rank: int, dp_size: int) -> TrainDataLoader:
        built.append(TrainDataLoader.from_config(cfg, dp_rank, dp_size))
        return built[-1]

    steps = ReplicaGroupSteps(
        cfg, 0, 1, 1, torch.device("cpu"), build, dict, lambda state: None, start=0
    )
    data = steps.loader(0)
    try:
        data = steps.begin(data, redo=False)
        data.global_digest(data.next_batch())  # step 1
        assert steps.conclude(data)
        steps.committed(1, time.perf_counter())  # every lane at step 2's start kept
        data = steps.begin(data, redo=False)
        failed = data.global_digest(data.next_batch())  # step 2 ...
        assert steps.conclude(data)
        steps.failed(2, time.perf_counter())  # ... whose commit was refused elsewhere
        again = steps.begin(data, redo=True)
        assert again is not data and len(built) == 2  # a new loader, from the state
        assert again.global_digest(again.next_batch()) == failed
        # a step that counted, with the same membership, keeps its loader
        assert steps.conclude(again)
        steps.committed(2, time.perf_counter())
        assert steps.begin(again, redo=False) is again
        assert again.global_digest(again.next_batch()) != failed
    finally:
        for loader in built:
            loader.close()
