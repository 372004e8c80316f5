"""Replica groups: the outermost data-parallel dimension, when it may change at any
step (live recovery, docs/fault_tolerance.md, design §16).

A replica group is one ordinary job (FSDP, TP inside); `TorchftGroups` joins it to
the others through torchft: a lighthouse forms a quorum of the live groups at every
step, the cross-group collectives run over the quorum, and a step commits only if
every group finished it. `OneGroup` is the same seam for a job without fault
tolerance, so the training loop has one shape and costs nothing extra.

What a step sees is its `Membership`: how many groups take part and this group's
place among them. Times the ranks inside a group, that gives the step's
data-parallel ranks, over which the lanes are dealt (design §2).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from torchtitan.config.job_config import ConfigError, FaultTolerance

logger = logging.getLogger("torchtitan")


class LighthouseLost(RuntimeError):
    """The lighthouse did not come back within the quorum timeout: this group stops
    like a preemption (its committed steps are the job's; a relaunch rejoins)."""


@dataclass(frozen=True)
class Membership:
    """The replica groups of one step, as this group sees them. Two memberships are
    equal when they give this group the same data-parallel coordinates."""

    groups: int
    """Replica groups taking part in the step."""
    index: int
    """This group's place among them (its participating rank), in [0, groups)."""
    quorum: int = field(default=0, compare=False)
    """The quorum, as a number every member computes alike (`quorum_key`): another one
    after every membership change."""

    def data_parallel(self, rank_in_group: int, ranks_per_group: int) -> tuple[int, int]:
        """(data-parallel rank, data-parallel size) of a group's data-parallel rank for
        this step: the groups in their order, each contributing its own ranks."""
        return self.index * ranks_per_group + rank_in_group, self.groups * ranks_per_group


class ReplicaGroups(Protocol):
    """The cross-group side of a step, in the order the training loop calls it:
    `begin_step`, then any number of `sum_` / `gather_bytes`, then `commit`."""

    replica_id: int
    may_change: bool
    """Whether the membership may change between steps: then every step gathers the
    state of every lane, so that any group can take over any lane."""

    def begin_step(self) -> Membership:
        """Join the step's quorum (this may copy state from a peer first)."""
        ...

    def sum_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` in place over the step's groups. After a peer fails the
        result is undefined and the step will not commit."""
        ...

    def sum_values(self, values: list[float]) -> list[float] | None:
        """`values` summed over the step's groups (float64: exact for counts); None
        when a peer failed (the step will not commit)."""
        ...

    def sum_tensors(self, tensors: list[torch.Tensor]) -> None:
        """`sum_` of each tensor, in as few collectives as their dtypes allow."""
        ...

    def gather_bytes(self, payload: bytes) -> list[bytes] | None:
        """Every group's payload, in membership order; None when a peer failed."""
        ...

    def commit(self) -> bool:
        """Whether every group finished the step: only then may it be applied."""
        ...

    def fail(self, reason: str) -> None:
        """Mark the step failed: it will not commit (a check of its collectives failed)."""
        ...

    @property
    def healed(self) -> bool:
        """Whether the latest `begin_step` copied this group's state from a peer."""
        ...

    def close(self) -> None: ...


class OneGroup:
    """No fault tolerance: one group, every step commits, nothing crosses groups."""

    healed = False
    replica_id = 0
    may_change = False

    def begin_step(self) -> Membership:
        return Membership(1, 0)

    def sum_(self, tensor: torch.Tensor) -> None:
        pass

    def sum_values(self, values: list[float]) -> list[float] | None:
        return values

    def sum_tensors(self, tensors: list[torch.Tensor]) -> None:
        pass

    def gather_bytes(self, payload: bytes) -> list[bytes] | None:
        return [payload]

    def commit(self) -> bool:
        return True

    def fail(self, reason: str) -> None:
        raise RuntimeError(reason)

    def close(self) -> None:
        pass


class TorchftGroups:
    """This group's torchft Manager, one per process: each rank of a group reduces
    with the same rank of the other groups (their shards match: every group has the
    same mesh), and the group's rank 0 speaks to the lighthouse for all of them.

    `save` / `load` are the state a joining group copies from a live peer at its
    first quorum (model, optimizer, schedule, step, loader state: all of it)."""

    may_change = True

    def __init__(
        self,
        ft: FaultTolerance,
        rank_in_group: int,
        group_size: int,
        device: torch.device,
        save: Callable[[], dict[str, Any]],
        load: Callable[[dict[str, Any]], None],
        step: int,
    ):
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

        self.device = device
        self.rank_in_group = rank_in_group
        self._healed = False
        self._load = load
        self.replica_id = ft.replica_id
        step_timeout = timedelta(seconds=ft.step_timeout_s)
        self._seen = _QuorumSeen()
        base = ProcessGroupNCCL if device.type == "cuda" else ProcessGroupGloo
        pg = _fresh_prefix(base, self._seen)(timeout=step_timeout)
        self._pg, self._dropped = pg, False
        try:
            self.manager = Manager(
                pg=pg,
                load_state_dict=None,
                state_dict=None,
                min_replica_size=ft.min_replicas,
                # Healing happens inside begin_step, before the step's batch is made,
                # so a group that joins has the step's state and takes lanes at once.
                use_async_quorum=False,
                timeout=step_timeout,
                quorum_timeout=timedelta(seconds=ft.quorum_timeout_s),
                connect_timeout=timedelta(seconds=ft.connect_timeout_s),
                rank=rank_in_group,
                world_size=group_size,
                store_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                store_port=int(os.environ["MASTER_PORT"]),
                lighthouse_addr=_url(ft.lighthouse),
                # Zero-padded so that the lighthouse's order of ids is their numeric order.
                replica_id=f"{ft.replica_id:05d}",
                # Every group builds the same initial model from the same seed (or
                # loads the same checkpoint): no copy at step 0.
                init_sync=False,
                # The lighthouse may restart: torchft's manager server asks it again
                # about once a second (a new connection each time) until the quorum
                # timeout, so a lighthouse back within it costs no committed step.
                quorum_retries=max(1, int(ft.quorum_timeout_s)),
            )
        except Exception as exc:
            raise ConfigError(_unreachable(ft, exc)) from exc
        self._seen.client = self.manager._client
        self.manager._client = self._seen  # what each quorum said: _fresh_prefix reads it
        _quiet_access_log(self.manager)
        self._had_quorum = False
        self._lost_since: float | None = None  # when the lighthouse stopped answering
        self._ft = ft
        self.manager.register_state_dict_fn("trainer", self._on_load, save)
        self.manager.load_state_dict({"step": step, "batches_committed": 0})

    def _answers(self) -> BaseException | None:
        """None if the lighthouse accepts a connection (well under a millisecond when
        it is there), else why not."""
        host, _, port = self._ft.lighthouse.rpartition("://")[2].rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=2.0).close()
        except (OSError, ValueError) as exc:
            return exc
        return None

    def _watch_lighthouse(self, waiting: threading.Event) -> None:
        """While this group waits for a quorum: one line as soon as the lighthouse
        stops answering (torchft's manager asks it again meanwhile)."""
        while not waiting.wait(1.0):
            if self._lost_since is not None:
                return
            why = self._answers()
            if why is not None:
                self._lost_since = time.monotonic()
                # The lighthouse that answers next numbers its quorums afresh: build the
                # communicator again whatever id comes (every group that saw it go does).
                self.manager._quorum_id = -1
                if self.rank_in_group == 0:
                    logger.warning(
                        f"replica group {self.replica_id}: the lighthouse {self._ft.lighthouse} "
                        f"does not answer ({type(why).__name__}); this group keeps its state and "
                        f"waits for it up to fault_tolerance.quorum_timeout_s = "
                        f"{self._ft.quorum_timeout_s:g} s"
                    )
                return

    def _quorum(self) -> None:
        """torchft's quorum, watched (after the first) for a lighthouse that went away."""
        if not self._had_quorum:
            self.manager.start_quorum()
            return
        done = threading.Event()
        watcher = threading.Thread(target=self._watch_lighthouse, args=(done,), daemon=True)
        watcher.start()
        try:
            self.manager.start_quorum()
        finally:
            done.set()
            watcher.join()

    def _lost(self, exc: BaseException) -> str:
        waited = time.monotonic() - self._lost_since if self._lost_since is not None else None
        since = f" for {waited:.0f} s" if waited is not None else ""
        first = _first_line(exc)
        return (
            f"replica group {self.replica_id}: no quorum from the lighthouse "
            f"{self._ft.lighthouse}{since} ({type(exc).__name__}{': ' + first if first else ''}); "
            "its committed steps are the job's: start the lighthouse again, then this group"
        )

    def _on_load(self, state: dict[str, Any]) -> None:
        self._healed = True
        self._load(state)

    @property
    def healed(self) -> bool:
        return self._healed

    def begin_step(self) -> Membership:
        """The step's quorum, once every rank of this group has it whole: a quorum
        during which a peer failed (its communicator, or the copy of the state from
        it) is asked again. A copy that reached only some of this group's ranks is
        undone by asking for it again: every rank's step goes back to the one before,
        so the next quorum copies to all of them."""
        self._healed, self._dropped = False, False
        half_copied = False
        while True:
            before = self.manager.current_step()
            try:
                self._quorum()
            except Exception as exc:
                if self._had_quorum:
                    raise LighthouseLost(self._lost(exc)) from None
                if "connect" in str(exc).lower() or "lighthouse" in str(exc).lower():
                    raise ConfigError(_unreachable(self._ft, exc)) from exc
                raise
            self._had_quorum = True
            if self._lost_since is not None and self.rank_in_group == 0:
                logger.warning(
                    f"replica group {self.replica_id}: the lighthouse {self._ft.lighthouse} "
                    f"answers again after {time.monotonic() - self._lost_since:.1f} s; "
                    "training on"
                )
            self._lost_since = None
            ok, copied = self.manager.errored() is None, self._healed
            # Over this group's ranks: all whole? all copied? any copy earlier (-1)?
            flags = torch.tensor(
                [float(ok), float(copied), -float(half_copied)], device=self.device
            )
            dist.all_reduce(flags, op=dist.ReduceOp.MIN)
            all_ok, all_copied, any_earlier = flags.tolist()
            if all_ok == 1:
                if any_earlier == -1 and all_copied == 0:
                    raise RuntimeError(
                        f"replica group {self.replica_id}: a copy from a peer reached only "
                        "some of its ranks and no peer is left to copy from again"
                    )
                break
            half_copied = half_copied or self._healed
            self._healed = False
            self.manager.load_state_dict(
                {"step": before, "batches_committed": self.manager.batches_committed()}
            )
            why = _first_line(self.manager.errored()) or "on another rank of this group"
            logger.warning(
                f"replica group {self.replica_id}: the quorum broke as it formed ({why}); "
                "asking again"
            )
        if self._seen.last is None:  # another torchft: its quorums went past us
            raise RuntimeError(
                "torchft's manager formed a quorum without its client's _quorum: this "
                "torchft version is not supported (see pyproject.toml's ft extra)"
            )
        rank = self.manager.participating_rank()
        if rank is None:  # not taking part (a spare above min_replicas): never here
            raise RuntimeError(f"replica group {self.replica_id} is not in the quorum")
        return Membership(self.manager.num_participants(), rank, quorum_key(self._seen.last))

    def sum_(self, tensor: torch.Tensor) -> None:
        from torch.distributed import ReduceOp

        self.manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()
        self._drop_if_broken()

    def fail(self, reason: str) -> None:
        """This step's cross-group collectives cannot be trusted (`reason`): the step
        will not commit, and the next quorum builds the communicator again."""
        self.manager.report_error(RuntimeError(reason))
        self._drop_if_broken()

    def _drop_if_broken(self) -> None:
        """After a failed cross-group collective, drop this rank's communicator at once:
        its peers then see the connection close instead of waiting out the timeout for
        a message that will not come (gloo's ring: one lost group stalls the others).
        The next quorum builds a new one."""
        if self.manager.errored() is not None and not self._dropped:
            self._dropped = True
            try:
                self._pg.abort()
            except Exception as exc:  # already gone: nothing to drop
                logger.debug(f"abort after a failed collective: {exc}")
            # Whatever the next quorum's id, build the communicator again (torchft
            # rebuilds it only when the id changes).
            self.manager._quorum_id = -1

    def sum_values(self, values: list[float]) -> list[float] | None:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        self.sum_(t)
        return None if self.manager.errored() is not None else t.tolist()

    @torch.no_grad()
    def sum_tensors(self, tensors: list[torch.Tensor]) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for same in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in same])
            self.sum_(flat)
            offset = 0
            for t in same:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def gather_bytes(self, payload: bytes) -> list[bytes] | None:

        groups, index = self.manager.num_participants(), self.manager.participating_rank()
        if index is None or self.manager.errored() is not None:
            return None
        lengths = torch.zeros(groups, dtype=torch.int64, device=self.device)
        lengths[index] = len(payload)
        self.sum_(lengths)
        if self.manager.errored() is not None:
            return None
        sizes = [int(n) for n in lengths.tolist()]
        table = torch.zeros((groups, max(sizes)), dtype=torch.uint8)
        if payload:
            table[index, : len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        table = table.to(self.device)
        self.sum_(table)
        if self.manager.errored() is not None:
            return None
        rows = table.cpu().numpy()
        return [rows[g, : sizes[g]].tobytes() for g in range(groups)]

    def commit(self) -> bool:
        return bool(self.manager.should_commit())

    def close(self) -> None:
        self.manager.shutdown(wait=False)


class _QuorumSeen:
    """torchft's manager client, keeping the latest quorum it returned."""

    def __init__(self) -> None:
        self.client: Any = None
        self.last: Any = None

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        self.last = self.client._quorum(*args, **kwargs)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def quorum_key(quorum: Any) -> int:
    """A quorum as a 32-bit number: its id and its members (one uuid per process). A
    lighthouse started again numbers its quorums from 1, so the id alone may name an
    old quorum with other members."""
    if quorum is None:
        return 0
    members = ",".join(sorted(quorum.replica_ids))
    return zlib.crc32(f"{quorum.quorum_id}:{members}".encode())


def store_prefix(store_addr: str, quorum: Any) -> str:
    """The store address a quorum's communicator rendezvouses under: torchft's
    (`host:port/torchft/<quorum id>/<rank>`) with the quorum's step and members
    (their ids carry one uuid per process) before the rank. A lighthouse started
    again numbers its quorums from 1: without them, a new quorum would meet the
    keys an old one with its id left in the store, and connect to a communicator
    that is still in use."""
    if quorum is None:
        return store_addr
    members = zlib.crc32(",".join(sorted(quorum.replica_ids)).encode())
    head, _, rank = store_addr.rpartition("/")
    return f"{head}/{quorum.max_step}-{members:08x}/{rank}"


def _fresh_prefix(base: type, seen: _QuorumSeen) -> type:
    """torchft's reconfigurable process group whose communicators rendezvous under
    `store_prefix`."""

    class FreshPrefix(base):  # type: ignore[misc, valid-type]
        def configure(self, store_addr: str, *args: Any, **kwargs: Any) -> None:
            super().configure(store_prefix(store_addr, seen.last), *args, **kwargs)

    FreshPrefix.__name__ = base.__name__
    return FreshPrefix


def _quiet_access_log(manager: Any) -> None:
    """torchft's checkpoint server (a peer copies this group's state from it) writes
    http.server's access line to stderr for every request: here it goes to torchft's
    logger, shown with TORCHTITAN_FT_DEBUG=1 like the rest of its chatter."""
    server = getattr(getattr(manager, "_checkpoint_transport", None), "_server", None)
    handler = getattr(server, "RequestHandlerClass", None)
    if handler is None:
        return
    access = logging.getLogger("torchft.checkpoint_server")

    def log_message(self: Any, fmt: str, *args: Any) -> None:
        access.info(f"{self.address_string()} {fmt % args}")

    handler.log_message = log_message


def _first_line(error: object) -> str:
    """The first line of an error (torchft's carry the traceback), at most 200 chars."""
    text = str(error).strip() if error is not None else ""
    return text.splitlines()[0][:200] if text else ""


def _url(address: str) -> str:
    return address if "://" in address else f"http://{address}"


def _unreachable(ft: FaultTolerance, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
    return (
        f"[fault_tolerance] lighthouse = {ft.lighthouse!r}: not reachable within "
        f"connect_timeout_s = {ft.connect_timeout_s:g} s ({first}); start it first "
        "(python -m torchtitan.runtime.lighthouse) or fix the address"
    )


def replica_groups(
    ft: FaultTolerance,
    rank_in_group: int,
    group_size: int,
    device: torch.device,
    save: Callable[[], dict[str, Any]],
    load: Callable[[dict[str, Any]], None],
    step: int,
) -> ReplicaGroups:
    """The job's replica groups: torchft's when fault tolerance is on, else one."""
    if not ft.enable:
        return OneGroup()
    return TorchftGroups(ft, rank_in_group, group_size, device, save, load, step)
