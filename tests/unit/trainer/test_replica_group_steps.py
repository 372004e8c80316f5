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
from torchtitan.distributed.replica_groups import Membership


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


class _Scripted:
    """One group's side of the cross-group collectives; what the other group adds to
    each sum is scripted. Records the collectives this group makes, in order."""

    replica_id = 0
    may_change = True
    healed = False

    def __init__(self, membership: Membership, theirs: list[float]):
        self.membership, self.theirs, self.calls = membership, theirs, []

    def begin_step(self) -> Membership:
        return self.membership

    def sum_values(self, values: list[float]) -> list[float]:
        self.calls.append("sum")
        return [a + b for a, b in zip(values, self.theirs, strict=True)]

    def gather_bytes(self, payload: bytes) -> list[bytes]:
        self.calls.append("gather")
        return [payload, payload]  # the other group has the same settings

    def fail(self, reason: str) -> None:
        self.calls.append(f"fail: {reason}")


def _tag(m: Membership) -> float:
    return float(m.quorum * 64 + m.groups)


def test_groups_decide_together_which_collectives_a_step_makes(one_process_group, tmp_path):
    """After a lighthouse started again, quorum ids begin at 1 again: a group can find
    the same id it had (nothing changed, by its own history) while the other, which
    passed through a quorum of its own meanwhile, sees a new membership. Both must
    then check the settings (a gather only one of them made would pair with the
    other's next collective: bytes read as numbers). A communicator that joined
    fewer groups than the quorum has fails the step."""
    ensure_sample_data()
    cfg = load_job_config([*BASE_ARGS, "--job.dump_folder", str(tmp_path / "dump")])
    steps = ReplicaGroupSteps(
        cfg, 0, 1, 1, torch.device("cpu"), lambda r, n: None, dict, lambda s: None, start=0
    )  # type: ignore[arg-type]
    same = Membership(2, 0, quorum=2)
    steps.membership, steps.log.quorum = same, 2  # this group's own history: quorum 2

    def step(theirs: list[float]) -> list[str]:
        steps.groups = scripted = _Scripted(same, theirs)  # type: ignore[assignment]
        data = object()
        assert steps.begin(data, redo=False) is data  # (its lanes did not change)
        steps._ids_due = False
        return scripted.calls

    assert step([1.0, 1.0, 0.0, _tag(same)]) == ["sum", "gather"]  # the other saw a change
    assert step([1.0, 0.0, 0.0, _tag(same)]) == ["sum"]  # nobody did: one sum a step
    assert not steps._ids_due
    steps.groups = _Scripted(same, [1.0, 0.0, 1.0, _tag(same)])  # type: ignore[assignment]
    steps.begin(object(), redo=False)
    assert steps._ids_due  # the other's records lack this quorum: both gather ids
    broken = step([0.0, 1.0, 0.0, 0.0])  # only this group on the communicator
    assert broken[0] == "sum" and broken[1].startswith(
        "fail: replica group 0: the quorum's communicator joined 1 groups for 2"
    )
    assert len(broken) == 2  # no settings gather on a communicator that is not the quorum's
    assert step([1.0, 0.0, 0.0, _tag(Membership(2, 0, quorum=1))])[1].startswith("fail")
