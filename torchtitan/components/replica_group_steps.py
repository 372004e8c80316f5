"""The step driver of replica groups (live recovery, docs/fault_tolerance.md, design
§16): the groups of each step's quorum train it together. The lanes are dealt
over them at every step, every lane's state is gathered before each commit so
any group can take any lane next, a step that does not commit is made again
from that state with the same bytes, and the first group's rank 0 writes the
job's records and checkpoints. One line per recovery (recovery_log.py).

A job alone uses `OneJob` (step_driver.py) instead, which does none of this."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from torchtitan.components.agreement import StepAgreement
from torchtitan.components.job_fence import JobFence, Leave
from torchtitan.components.recovery_log import RecoveryLog
from torchtitan.components.step_driver import BuildLoader
from torchtitan.config.job_config import ConfigError, JobConfig
from torchtitan.datasets.dataloader import TrainDataLoader
from torchtitan.distributed.replica_groups import LighthouseLost, Membership, replica_groups

logger = logging.getLogger("torchtitan")


class ReplicaGroupSteps:
    """The replica groups of each step (a `StepDriver`)."""

    stop_saves = False  # a stopped group leaves; the others go on and save
    loss_before_commit = True

    def __init__(
        self,
        cfg: JobConfig,
        rank: int,
        world: int,
        dp: int,
        device: torch.device,
        build: BuildLoader,
        own_state: Callable[[], dict[str, Any]],
        load_own_state: Callable[[dict[str, Any]], None],
        start: int,
    ):
        """`dp`: this group's data-parallel size; `build(dp_rank, dp_size)`: this
        rank's training loader at those coordinates; `own_state` / `load_own_state`:
        what a joining group copies from a live peer besides every lane's state."""
        self.cfg, self.rank, self.dp = cfg, rank, dp
        self._build, self._own_state, self._load_own_state = build, own_state, load_own_state
        self.groups = replica_groups(
            cfg.fault_tolerance, rank, world, device, self._state_for_peer,
            self._load_from_peer, start,
        )  # fmt: skip
        self.membership = Membership(1, 0)
        """The membership the current loader was dealt for."""
        self.start_doc: dict[str, Any] | None = None
        """Every lane's merged state at the start of the coming step."""
        self.next_doc: dict[str, Any] | None = None
        """Every lane's state after the step in flight (gathered before its commit)."""
        self.log = RecoveryLog(self.groups.replica_id)
        self._dp_rank = 0
        self._mismatch: str | None = None
        """Set when the peer this group copied from has other settings."""
        self._lost: Leave | None = None
        """Set when the lighthouse did not come back in time."""
        self._ids_due = False
        """Whether the groups agreed to gather their ids at the next commit."""
        self.fence = JobFence(cfg.job.dump_folder, f"replica group {self.groups.replica_id}")
        """The job's generation (job_fence.py): read and written by this group's rank 0."""

    def _state_for_peer(self) -> dict[str, Any]:
        """What a joining group copies from this one (at a step start)."""
        return {
            **self._own_state(),
            "data": self.start_doc,
            "generation": self.fence.generation,
            "settings": _settings(self.cfg),
        }

    def _load_from_peer(self, state: dict[str, Any]) -> None:
        """A peer's state was copied in: its lanes' state and generation; the loader is
        dealt again."""
        if state.get("settings") is not None and state["settings"] != _settings(self.cfg):
            # Copy nothing (the shapes may differ): `begin` refuses, naming them.
            self._mismatch = _differences(
                self.groups.replica_id, _settings(self.cfg), state["settings"], True
            )
            return
        self._load_own_state(state)
        self.start_doc = state["data"]
        if state.get("generation") is not None:
            self.fence.adopt(int(state["generation"]))
        self.membership = Membership(0, 0)

    def loader(self, dp_rank: int) -> TrainDataLoader:
        """This rank's loader at its coordinates under the current membership."""
        self._dp_rank = dp_rank
        return self._build(*self.membership.data_parallel(dp_rank, self.dp))

    def resumed(self, doc: dict[str, Any]) -> None:
        self.start_doc = doc

    def begin(self, data: TrainDataLoader, redo: bool) -> TrainDataLoader:
        """Join the step's quorum (this may copy the whole state from a peer); the
        loader is `data` when the membership gives this group the coordinates it
        was built for; else (or when the step is made again after a failed one) a
        new one, restored from every lane's state at the step start."""
        try:
            membership = self.groups.begin_step()
        except LighthouseLost as exc:
            self._lost = Leave("lighthouse lost", str(exc))  # `leave` says it: nothing more written
            return data
        if self._mismatch is not None:
            raise ConfigError(self._mismatch)
        if self._agree_on_changes(membership):
            self._check_settings()
        if membership == self.membership and not redo:
            return data
        data.close()
        self.membership = membership
        data = self.loader(self._dp_rank)
        if self.start_doc is not None:
            data.restore(self.start_doc)
        return data

    def _agree_on_changes(self, membership: Membership) -> bool:
        """Collective over the quorum's groups, at every step: whether any group sees a
        new membership (then every group checks the settings) or a quorum its records
        do not know yet (then every group gathers the ids at the commit). The groups
        decide together: each decides from its own history, which differs after a
        lighthouse started again (it numbers quorums from 1), and a collective that
        only some groups make pairs with another one in the others. The sum also
        checks the communicator: as many groups as the quorum has, all in this quorum;
        else the step fails and is made again."""
        tag = float(membership.quorum * 64 + membership.groups)  # exact: under 2**38
        mine = [
            1.0,
            float(membership != self.membership),
            float(membership.quorum != self.log.quorum),
            tag,
        ]
        got = self.groups.sum_values(mine)
        if got is None:  # a group failed: the step will not commit
            return False
        count, changed, unknown, tags = got
        if count != membership.groups or tags != membership.groups * tag:
            self.groups.fail(
                f"replica group {self.groups.replica_id}: the quorum's communicator joined "
                f"{count:g} groups for {membership.groups} (quorum {membership.quorum})"
            )
            return False
        self._ids_due = self._ids_due or unknown > 0
        return changed > 0

    def _check_settings(self) -> None:
        """Collective over the quorum's groups, when it changed: every group's settings
        against those of the groups already training (at the job's start, the first
        group's). A group that differs refuses, naming each setting: the others go on
        without it (its next collective fails; the step is made again)."""
        mine = {**_settings(self.cfg), "_training": self.log.quorum is not None}
        got = self.groups.gather_bytes(json.dumps(mine, sort_keys=True).encode())
        if got is None:
            return  # a group failed as the quorum formed: the step is made again
        docs = [json.loads(b) for b in got]
        ref_index = next((i for i, d in enumerate(docs) if d["_training"]), 0)
        ref = docs[ref_index]
        training = bool(ref.pop("_training"))
        mine.pop("_training")
        if mine != ref:
            raise ConfigError(_differences(self.groups.replica_id, mine, ref, training))

    def leave(self, next_step: int, last_step: int) -> Leave | None:
        """Collective over this group, after the step's quorum: whether it must stop
        writing and leave (job_fence.py). The first group of the job's first quorum
        (nobody to copy from) begins a generation; the group's rank 0 decides for all
        its ranks."""
        if self._lost is not None:
            return self._lost
        verdict: Leave | None = None
        if self.rank == 0:
            verdict = self.fence.verdict(next_step, last_step)
            first = self.fence.generation is None and not self.groups.healed
            if verdict is None and first and self.membership.index == 0:
                self.fence.begin_generation(next_step - 1)
        shared: list[Any] = [verdict]
        if dist.get_world_size() > 1:
            dist.broadcast_object_list(shared, src=0)
        return shared[0]

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

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        self.groups.sum_tensors(tensors)

    def conclude(self, data: TrainDataLoader) -> bool:
        """Collective over every group: every lane's state after this step (so any
        group can take any lane next), then the commit vote."""
        self.next_doc = data.gather_state()
        return self.groups.commit()

    def failed(self, step: int, t0: float) -> None:
        self.log.failed(step, t0)

    def committed(self, step: int, t0: float) -> tuple[bool, int | None]:
        """Note the step and log a recovery (collective over the groups when the
        quorum changed); then `records(step)`."""
        self.start_doc = self.next_doc
        m = self.membership
        if self._ids_due:  # (decided by every group together: `_agree_on_changes`)
            ids = self.groups.gather_bytes(str(self.groups.replica_id).encode())
            if ids is not None:  # (a group lost just after the commit: ask next step)
                self.log.joined_quorum(m.quorum, [int(b) for b in ids])
                self._ids_due = False
        line = self.log.committed(step, t0, self.groups.healed)
        if line and self.rank == 0:
            logger.warning(line)
        writes, trim_after = self.records(step)
        if self.rank == 0:
            if self.fence.generation is None:  # started beside the first group: its
                state = self.fence.state()  # generation was written before this step
                if state is not None:
                    self.fence.adopt(state.generation)
            if writes:
                if self.fence.generation is None:  # nobody began one: this writer does
                    self.fence.begin_generation(step - 1)
                self.fence.committed(step)
        return writes, trim_after

    def records(self, step: int) -> tuple[bool, int | None]:
        """The first group's rank 0 writes each committed step's records. A group
        that started the job (it copied nothing from a peer) trains the steps after
        its start again, so their old records go; one that healed keeps them."""
        if self.log.quorum is None:  # before the first commit: nobody knows yet
            return False, None
        writes = self.rank == 0 and self.membership.index == 0
        return writes, step - 1 if self.log.started_the_job else None

    def writes_checkpoints(self) -> bool:
        """The first group alone writes: the state is one."""
        return self.membership.index == 0

    def loader_state(self, data: TrainDataLoader) -> dict[str, Any] | None:
        return self.start_doc

    def step_fields(self, lanes: int) -> tuple[list[int] | None, list[int] | None]:
        """(replica ids, lanes each group held) of the latest step: the layout's rule
        (design §2) over the groups' ranks."""
        return self.log.ids, lanes_per_group(lanes, self.membership.groups, self.dp)

    def finish(self, model: nn.Module, step: int) -> None:
        """Collective over this group: log SHA-256 of every rank's parameter shards in
        rank order. Every group has the same mesh, so two groups hold the same
        parameters exactly when their digests agree."""
        h = hashlib.sha256()
        for name, p in model.state_dict().items():
            local = p.to_local() if isinstance(p, DTensor) else p
            h.update(name.encode())
            h.update(local.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, h.hexdigest())
        digest = hashlib.sha256("".join(parts).encode()).hexdigest()
        if self.rank == 0 and self.membership.index == 0:
            self.fence.finish(step)  # after its last checkpoint: the job is done
        if self.rank == 0:
            logger.warning(
                f"replica group {self.groups.replica_id} parameters at step {step}: {digest}"
            )

    def close(self) -> None:
        self.groups.close()


# Sections whose settings every replica group must share (the rest: where and how
# each group logs, saves and finds the lighthouse).
SHARED_SECTIONS = ("model", "training", "parallelism", "optimizer", "lr_scheduler", "data", "moe")


def _settings(cfg: JobConfig) -> dict[str, str]:
    """The settings replica groups must share, flat (`section.field`), with the
    recipe file's content digest (one path may name different files on two nodes)."""
    doc = cfg.to_dict()
    out = {
        f"{section}.{field}": str(value)
        for section in SHARED_SECTIONS
        for field, value in sorted(doc.get(section, {}).items())
    }
    for key in ("group_count", "min_replicas"):
        out[f"fault_tolerance.{key}"] = str(doc["fault_tolerance"][key])
    try:
        with open(cfg.data.recipe, "rb") as f:
            out["data.recipe (content)"] = hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError:
        pass  # (the loader says it; a group without it stops at start anyway)
    return out


def _differences(group: int, mine: dict[str, str], ref: dict[str, str], training: bool) -> str:
    """One line: each setting where this group differs from the reference group."""
    diff = sorted(k for k in set(mine) | set(ref) if mine.get(k) != ref.get(k))
    theirs = "the groups training" if training else "the first group"
    return (
        f"replica group {group} has other settings than {theirs}: "
        + "; ".join(f"{k} = {mine.get(k)} here, {ref.get(k)} there" for k in diff)
        + " (every replica group needs the same job config and recipe)"
    )


def lanes_per_group(lanes: int, groups: int, dp: int) -> list[int]:
    """How many lanes each of `groups` groups of `dp` ranks holds: rank r of the
    `groups * dp` owns lanes [floor(r L / D), floor((r + 1) L / D)) (design §2)."""
    size = groups * dp
    return [(g + 1) * dp * lanes // size - g * dp * lanes // size for g in range(groups)]
