"""The trainer's side of the runtime checks, in one object: start the monitor,
take the dump-folder lock (global rank 0), publish phases, watch for stop
requests (preemption.py), report a failure.

`set_phase` and `stop_requests` are module-level so the training loop can use
them without carrying the guard around.
"""

from __future__ import annotations

import os
from typing import Any

from torchtitan.config.job_config import JobConfig
from torchtitan.runtime import failure, preemption
from torchtitan.runtime.dump_lock import DumpFolderLocked, DumpLock
from torchtitan.runtime.monitor import RankMonitor, connect_store
from torchtitan.runtime.preemption import StopRequests

_current: JobGuard | None = None


def set_phase(phase: str, step: int | None = None) -> None:
    """What this rank does now ("data", "collective", "save"...), for the heartbeat."""
    if _current is not None and _current.monitor is not None:
        _current.monitor.set_phase(phase, step)


def stop_requests() -> StopRequests | None:
    """This rank's stop requests (signals, its launcher's mark), once the guard exists."""
    return _current.stop if _current is not None else None


class JobGuard:
    def __init__(self, cfg: JobConfig, rank: int, world_size: int):
        global _current
        self.rank = rank
        self.lock = DumpLock(lock_folder(cfg)) if rank == 0 else None
        ft = cfg.fault_tolerance
        self.replica_id = ft.replica_id if ft.enable else None
        store = connect_store()
        on_tick = self.lock.renew if self.lock is not None else None
        on_exit = self.lock.release if self.lock is not None else None
        self.monitor: RankMonitor | None = RankMonitor(
            store, rank, world_size, cfg.job.heartbeat_timeout_s, on_tick, on_exit
        )
        self.stop = StopRequests(rank, on_exit, self._publish_stop)
        self.monitor.stop_requests = self.stop
        _current = self

    def _publish_stop(self, rec: dict[str, Any]) -> None:
        """Tell every rank that this one stopped at once (they report a stop, not a crash)."""
        if self.monitor is not None:
            self.monitor.publish_failure(
                failure.record(self.rank, preemption.STOPPED_KIND, rec["reason"])
            )

    def start(self) -> None:
        """Start heartbeats, then (rank 0) take the lock: may raise DumpFolderLocked."""
        assert self.monitor is not None
        self.monitor.start()
        if self.lock is not None:
            try:
                self.lock.acquire()
            except DumpFolderLocked as exc:
                if self.replica_id is None:
                    raise
                raise DumpFolderLocked(
                    f"[fault_tolerance] replica_id = {self.replica_id}: a replica group with "
                    f"this id already runs on this dump folder (every group needs an id of its "
                    f"own): {exc}"
                ) from None

    def fail(self, exc: BaseException) -> int:
        """Report why this rank stops; returns its exit code."""
        kind, message = failure.describe(exc)
        if kind == "crash" and self.monitor is not None:
            # A broken collective is most often a peer that failed first: its
            # report is the one to show, and this rank leaves quietly.
            peer = self.monitor.wait_peer_failure(3 * self.monitor.interval)
            if peer is not None and peer["kind"] == preemption.STOPPED_KIND:
                self.stop.stop_at_once(
                    f"rank {peer['rank']} stopped at once ({peer['message']})", follows=peer["rank"]
                )
            if peer is not None:
                if not failure.recorded_here(peer):  # another node's: tell this node's launcher
                    failure.write_record(peer, name="summary.json")
                return failure.KINDS.get(peer["kind"], failure.EXIT_CRASH)
        if kind == "crash" and self.stop.requested():
            # Peers that go away during a requested stop end it early: still a stop.
            self.stop.stop_at_once(
                f"{self.stop.reason()}, then the collective failed "
                f"({failure.raised_at(exc).split(' (raised at')[0][:160]})"
            )
        code = failure.report(self.rank, kind, message, self.monitor)
        if self.monitor is not None:
            # The store may live in this process (rank 0 hosts the workers' store):
            # stay long enough for every peer's monitor to read the report, so each
            # node's launcher prints the root cause rather than a lost peer.
            self.monitor.linger()
        return code

    def close(self, code: int) -> None:
        if code == 0 and self.monitor is not None:
            self.monitor.stop()
        if self.lock is not None:
            self.lock.release()


def lock_folder(cfg: JobConfig) -> str:
    """Where this job's dump-folder lock lives. Replica groups of a fault-tolerant run
    share the dump folder (one checkpoint series, one metrics file), so each group
    locks a folder of its own inside it: a second group started with the same
    replica id is refused like a second job on one folder."""
    ft = cfg.fault_tolerance
    if not ft.enable:
        return cfg.job.dump_folder
    return os.path.join(cfg.job.dump_folder, "replica_groups", str(ft.replica_id))


def fail_before_start(rank: int, exc: BaseException) -> int:
    """A failure before the process group and store exist (bad config): every
    rank has the same input, and every rank records it, since the launcher may stop
    the others as soon as the first one exits (it prints one record of the same
    message); without a launcher rank 0 alone prints it."""
    kind, message = failure.describe(exc)
    return failure.report(rank, kind, message, None, say_here=rank == 0)
