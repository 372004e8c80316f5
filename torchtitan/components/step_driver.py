"""Who trains a step, and whether it counts: the step driver.

The training loop (train.py) is one story: take the step's batch, agree on its
counts, forward and backward, apply the update, log, save. What differs between
a job alone and replica groups under a quorum (live recovery,
docs/fault_tolerance.md) is asked of a `StepDriver`, chosen once at start:

- `begin`: who trains this step and which lanes each rank takes (the quorum;
  the loader, dealt again when the membership changed or the step is redone);
- `leave`: whether this process must write nothing more and leave (a replica
  group that came back after the job went on without it: job_fence.py);
- `agree` and `sum_`: the step's counts and sums over everyone who trains it;
- `conclude`: whether the step commits; a step that does not is made again,
  with the same bytes;
- `committed` and `records`: whether this rank writes the job's records of the
  step (the trainer owns the metrics writer; the driver only says whose turn
  it is), and `writes_checkpoints`: whether this process writes the job's
  checkpoints.

`OneJob` is the plain driver: the membership never changes, every step
commits, rank 0 writes the records. The replica-group driver is
replica_group_steps.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn as nn

from torchtitan.components.agreement import StepAgreement
from torchtitan.components.job_fence import Leave
from torchtitan.config.job_config import FaultTolerance
from torchtitan.datasets.dataloader import TrainDataLoader
from torchtitan.distributed.replica_groups import OneGroup, ReplicaGroups

# (data-parallel rank, data-parallel size) -> this rank's training loader there
BuildLoader = Callable[[int, int], TrainDataLoader]


class StepDriver(Protocol):
    groups: ReplicaGroups
    """The cross-group collectives the loader and the metrics run over (a job alone:
    `OneGroup`, which crosses nothing)."""
    stop_saves: bool
    """Whether a stop request saves the step and ends the job (a job alone), or lets
    this process leave while the others go on (replica groups)."""
    loss_before_commit: bool
    """Whether the step's global loss is reduced before `conclude` (replica groups:
    after a failed commit the peers are gone)."""

    def loader(self, dp_rank: int) -> TrainDataLoader:
        """This rank's first loader (at its data-parallel coordinate `dp_rank`)."""
        ...

    def resumed(self, doc: dict[str, Any]) -> None:
        """The run resumed from a checkpoint whose loader state is `doc`."""
        ...

    def begin(self, data: TrainDataLoader, redo: bool) -> TrainDataLoader:
        """Who trains the coming step and the loader it reads (`data`, or one dealt
        again); `redo`: the previous step did not commit and is made again."""
        ...

    def leave(self, next_step: int, last_step: int) -> Leave | None:
        """After `begin`: whether this process must write nothing more and leave the
        job (a stale replica group, or one whose job finished while it was away)."""
        ...

    def agree(self, mine: StepAgreement) -> StepAgreement:
        """This process's agreement summed over everyone who trains the step."""
        ...

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        """Sum tensors (gradients, a loss) in place over everyone else who trains it."""
        ...

    def conclude(self, data: TrainDataLoader) -> bool:
        """Collective: whether the step commits (else it is made again)."""
        ...

    def failed(self, step: int, t0: float) -> None:
        """Step `step`, begun at `t0`, did not commit."""
        ...

    def committed(self, step: int, t0: float) -> tuple[bool, int | None]:
        """Step `step` committed: `records(step)` for it (collective for replica groups)."""
        ...

    def records(self, step: int) -> tuple[bool, int | None]:
        """(whether this rank writes the job's records of `step`; the step after which
        earlier records are dropped when it starts writing, as steps trained again)."""
        ...

    def writes_checkpoints(self) -> bool:
        """Whether this process takes part in writing the job's checkpoints now."""
        ...

    def loader_state(self, data: TrainDataLoader) -> dict[str, Any] | None:
        """Collective: every lane's state after the current step (a checkpoint's)."""
        ...

    def step_fields(self, lanes: int) -> tuple[list[int] | None, list[int] | None]:
        """(replica ids, lanes each held) of the latest step; (None, None) alone."""
        ...

    def finish(self, model: nn.Module, step: int) -> None:
        """After the last step (collective for replica groups)."""
        ...

    def close(self) -> None: ...


class OneJob:
    """A job alone: the membership never changes, every step commits, nothing crosses
    replica groups, rank 0 writes the records and every rank saves."""

    stop_saves = True
    loss_before_commit = False

    def __init__(self, rank: int, dp: int, build: BuildLoader):
        self.rank, self.dp, self._build = rank, dp, build
        self.groups: ReplicaGroups = OneGroup()

    def loader(self, dp_rank: int) -> TrainDataLoader:
        return self._build(dp_rank, self.dp)

    def resumed(self, doc: dict[str, Any]) -> None:
        pass

    def begin(self, data: TrainDataLoader, redo: bool) -> TrainDataLoader:
        return data

    def leave(self, next_step: int, last_step: int) -> Leave | None:
        return None  # the dump-folder lock keeps any other job out

    def agree(self, mine: StepAgreement) -> StepAgreement:
        return mine

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        pass

    def conclude(self, data: TrainDataLoader) -> bool:
        return True

    def failed(self, step: int, t0: float) -> None:
        raise AssertionError("a job alone commits every step")

    def committed(self, step: int, t0: float) -> tuple[bool, int | None]:
        return self.records(step)

    def records(self, step: int) -> tuple[bool, int | None]:
        return self.rank == 0, step

    def writes_checkpoints(self) -> bool:
        return True

    def loader_state(self, data: TrainDataLoader) -> dict[str, Any] | None:
        return data.gather_state()

    def step_fields(self, lanes: int) -> tuple[list[int] | None, list[int] | None]:
        return None, None

    def finish(self, model: nn.Module, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def data_parallel_sizes(ft: FaultTolerance, dp: int) -> list[int]:
    """The data-parallel sizes a job may train at, smallest first: its own, or with
    replica groups every count of live groups times its own."""
    return [k * dp for k in range(1, (ft.group_count if ft.enable else 1) + 1)]
