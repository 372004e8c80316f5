"""The training loop's side of replica groups (live recovery, docs/fault_tolerance.md,
design §16): deal the lanes over each step's groups, keep every lane's state at the
step start, and say what happened (which groups trained a step, how many lanes each
held, one line per recovery, and which group writes the metrics).

Without fault tolerance (`OneGroup`) the membership never changes, so the loader is
built once, nothing is gathered per step and rank 0 writes the metrics: the loop
is the same and costs nothing extra."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchtitan.components.metrics import MetricsLogger, trim_logs_to_start
from torchtitan.config.job_config import FaultTolerance, JobConfig
from torchtitan.datasets.dataloader import TrainDataLoader
from torchtitan.distributed.replica_groups import Membership, ReplicaGroups
from torchtitan.runtime.agreement import StepAgreement
from torchtitan.runtime.recovery_log import RecoveryLog

logger = logging.getLogger("torchtitan")


class GroupSteps:
    def __init__(
        self,
        groups: ReplicaGroups,
        cfg: JobConfig,
        rank: int,
        dp: int,
        build: Callable[[int, int], TrainDataLoader],
    ):
        """`dp`: this group's data-parallel size; `build(dp_rank, dp_size)`: this
        rank's training loader at those coordinates."""
        self.groups, self.cfg, self.rank, self.dp = groups, cfg, rank, dp
        self._build = build
        self.membership = Membership(1, 0)
        """The membership the current loader was dealt for."""
        self.start_doc: dict[str, Any] | None = None
        """Every lane's merged state at the start of the coming step."""
        self.next_doc: dict[str, Any] | None = None
        """Every lane's state after the step in flight (gathered before its commit)."""
        self.log = RecoveryLog(groups.replica_id)

    def loader(self, dp_rank_in_group: int) -> TrainDataLoader:
        """This rank's loader at its coordinates under the current membership."""
        return self._build(*self.membership.data_parallel(dp_rank_in_group, self.dp))

    def follow(
        self, membership: Membership, redo: bool, data: TrainDataLoader, dp_rank_in_group: int
    ) -> TrainDataLoader:
        """The loader for this step: `data` when the membership gives this group the
        coordinates it was built for; else (or when the step is made again after a
        failed one) a new one, restored from every lane's state at the step start."""
        if membership == self.membership and not redo:
            return data
        data.close()
        self.membership = membership
        data = self.loader(dp_rank_in_group)
        if self.start_doc is not None:
            data.restore(self.start_doc)
        return data

    def moved_in(self, start_doc: dict[str, Any] | None) -> None:
        """A peer's state was copied in: its lanes' state; the loader is dealt again."""
        self.start_doc = start_doc
        self.membership = Membership(0, 0)

    def agree(self, mine: StepAgreement) -> StepAgreement:
        """This group's agreement summed over the step's groups (the batch is all of
        theirs). A stop request stays with its group: it leaves, the others go on."""
        total = self.groups.sum_values([float(mine.have_all), float(mine.n_valid)])
        if total is None:
            # A group failed as the step began: it will not commit, so the batch is
            # run through to the vote (any count will do) and made again.
            return StepAgreement(True, max(mine.n_valid, 1), mine.stop)
        have, n_valid = total
        return StepAgreement(int(have) == self.membership.groups, int(n_valid), mine.stop)

    def gather(self, data: TrainDataLoader) -> None:
        """Collective over every group, before the commit (replica groups only): every
        lane's state after this step, so any group can take any lane next."""
        if self.groups.may_change:
            self.next_doc = data.gather_state()

    def loader_state(self, data: TrainDataLoader) -> dict[str, Any] | None:
        """Collective: every lane's state after the current step (a checkpoint's)."""
        return self.start_doc if self.groups.may_change else data.gather_state()

    def committed(
        self, step: int, t0: float, metrics: MetricsLogger | None
    ) -> MetricsLogger | None:
        """After a committed step (replica groups only): note it, log a recovery, and
        return the metrics logger this rank writes with (None: another group's rank 0
        writes this step). Collective over the groups when the quorum changed."""
        if not self.groups.may_change:
            return metrics
        self.start_doc = self.next_doc
        m = self.membership
        if m.quorum != self.log.quorum:
            ids = self.groups.gather_bytes(str(self.groups.replica_id).encode())
            if ids is not None:  # (a group lost just after the commit: ask next step)
                self.log.joined_quorum(m.quorum, [int(b) for b in ids])
        line = self.log.committed(step, t0, self.groups.healed)
        if self.rank != 0:
            return None
        if line:
            logger.warning(line)
        if m.index != 0:  # the first group's rank 0 writes each step's record
            if metrics is not None:
                metrics.close()
            return None
        if metrics is None:
            cfg = self.cfg
            if self.log.started_the_job:
                # This group started the job (it copied nothing from a peer): steps
                # after its start are trained again, so their old records go.
                trim_logs_to_start(cfg.metrics, cfg.job.dump_folder, step - 1)
            metrics = MetricsLogger.from_config(cfg.metrics, cfg.job.dump_folder, cfg.to_dict())
        return metrics

    def report_parameters(self, model: torch.nn.Module, step: int) -> None:
        """Collective over this group (replica groups only): log SHA-256 of every
        rank's parameter shards in rank order. Every group has the same mesh, so two
        groups hold the same parameters exactly when their digests agree."""
        if not self.groups.may_change:
            return
        h = hashlib.sha256()
        for name, p in model.state_dict().items():
            local = p.to_local() if isinstance(p, DTensor) else p
            h.update(name.encode())
            h.update(local.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, h.hexdigest())
        digest = hashlib.sha256("".join(parts).encode()).hexdigest()
        if self.rank == 0:
            logger.warning(
                f"replica group {self.groups.replica_id} parameters at step {step}: {digest}"
            )

    def held(self, lanes: int) -> tuple[list[int], list[int]] | tuple[None, None]:
        """(replica ids, lanes each group held) of the latest step: the layout's rule
        (design §2) over the groups' ranks; (None, None) without replica groups."""
        if not self.groups.may_change:
            return None, None
        return self.log.ids, lanes_per_group(lanes, self.membership.groups, self.dp)


def data_parallel_sizes(ft: FaultTolerance, dp: int) -> list[int]:
    """The data-parallel sizes a job may train at, smallest first: its own, or with
    replica groups every count of live groups times its own."""
    return [k * dp for k in range(1, (ft.group_count if ft.enable else 1) + 1)]


def lanes_per_group(lanes: int, groups: int, dp: int) -> list[int]:
    """How many lanes each of `groups` groups of `dp` ranks holds: rank r of the
    `groups * dp` owns lanes [floor(r L / D), floor((r + 1) L / D)) (design §2)."""
    size = groups * dp
    return [(g + 1) * dp * lanes // size - g * dp * lanes // size for g in range(groups)]
