"""The loop's side of replica groups (components/group_steps.py): a step that did
not commit is made again from every lane's state at its start, with the same
bytes, also when the membership did not change (a group failed inside the step
and came back before the next quorum, or a commit vote failed)."""

from __future__ import annotations

from helpers.train import BASE_ARGS, ensure_sample_data

from torchtitan.components.group_steps import GroupSteps
from torchtitan.config.job_config import load_job_config
from torchtitan.datasets.dataloader import TrainDataLoader
from torchtitan.distributed.replica_groups import OneGroup


def test_a_redo_without_a_membership_change_makes_the_same_batch_again(one_process_group, tmp_path):
    ensure_sample_data()
    cfg = load_job_config([*BASE_ARGS, "--job.dump_folder", str(tmp_path / "dump")])
    built: list[TrainDataLoader] = []

    def build(dp_rank: int, dp_size: int) -> TrainDataLoader:
        built.append(TrainDataLoader.from_config(cfg, dp_rank, dp_size))
        return built[-1]

    steps = GroupSteps(OneGroup(), cfg, rank=0, dp=1, build=build)
    data = steps.loader(0)
    try:
        data.global_digest(data.next_batch())  # step 1, committed
        steps.start_doc = data.gather_state()  # every lane at step 2's start
        failed = data.global_digest(data.next_batch())  # step 2: not committed
        same = steps.membership
        again = steps.follow(same, True, data, 0)
        assert again is not data and len(built) == 2  # a new loader, from the state
        assert again.global_digest(again.next_batch()) == failed
        # a committed step with the same membership keeps its loader
        assert steps.follow(same, False, again, 0) is again
        third = again.global_digest(again.next_batch())
        assert third != failed
    finally:
        for loader in built:
            loader.close()
