"""Heartbeats, the watchdog and failure propagation through the rendezvous store.

Every rank runs one daemon thread that, every `interval` seconds:
- bumps its heartbeat key with what the rank is doing (`set_phase`: data, a
  collective, a save...), so a peer can tell what everyone waits for;
- watches the next rank on a ring (r watches r+1): a heartbeat that does not
  change for `timeout_s` means that rank is frozen (stopped, stuck holding
  the GIL, swapped out). A rank that still beats but has waited for its data
  for `timeout_s` is stuck too (the others then wait for it in a collective).
  The watcher publishes a failure naming it and what the others were doing,
  and kills a frozen rank if it runs on the same host;
- looks for a failure published by any rank and, if there is one, ends this
  process at once (no rank is left waiting in a collective for a dead peer);
- checks that the launcher is still there (the parent process and the store):
  an orphan of a killed launcher exits instead of writing on.

The thread outlives its own errors: an `on_tick` that raises (a dump folder
made read-only under the lock's renewal) is logged once per distinct error and
retried at the next tick, and the heartbeats go on; a silent monitor would
make the peers kill a healthy rank as hung.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from torchtitan.runtime import failure, preemption

logger = logging.getLogger("torchtitan")

FAILURE_KEY = "failure"
FAILURE_COUNT = "failure_count"


def worker_group_id() -> str:
    """Collective at start-up: one id for this group of workers (an attempt, a
    rendezvous round), the same on every rank: rank 0's random token. Keys under it
    never meet an earlier attempt's (TORCHELASTIC_RESTART_COUNT differs between
    nodes after a membership change, so it cannot serve)."""
    token: list[str | None] = [uuid.uuid4().hex[:12] if dist.get_rank() == 0 else None]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(token, src=0)
    return str(token[0])


def connect_store(timeout_s: float = 30.0) -> dist.Store | None:
    """A client of the job's rendezvous store (torchrun's agent store, or the
    process group's store for a plain single-process run). Collective when the
    process group is up (see `worker_group_id`)."""
    try:
        group = worker_group_id() if dist.is_initialized() else "0"
    except Exception as exc:  # a peer gone at start-up: the first collective says so
        logger.warning(f"heartbeats off: the ranks could not agree on a group id: {exc}")
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        store = dist.TCPStore(
            host,
            int(port),
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except Exception as exc:  # no store: run without heartbeats rather than not at all
        logger.warning(f"heartbeats off: cannot reach the rendezvous store {host}:{port}: {exc}")
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    return dist.PrefixStore(f"torchtitan/{run}/{group}/", store)


class RankMonitor:
    def __init__(
        self,
        store: dist.Store | None,
        rank: int,
        world_size: int,
        timeout_s: float,
        on_tick: Callable[[], None] | None = None,
        on_exit: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store, self.rank, self.world = store, rank, world_size
        self.timeout_s = timeout_s
        # Seconds for phase ages and silences; a test drives it to check that the
        # watchdog fires at its timeout, not before.
        self._clock = clock
        self.interval = min(2.0, max(timeout_s / 5, 0.2)) if timeout_s > 0 else 2.0
        self.on_tick = on_tick  # e.g. renewing the dump-folder lock's lease
        self.on_exit = on_exit  # e.g. releasing that lock when a peer's failure ends us
        # This rank's stop requests: a peer's stop at once ends it as a stop (set by the guard).
        self.stop_requests: preemption.StopRequests | None = None
        self.phase, self.step = "startup", 0
        self._phase_since = clock()
        self.host, self.pid = socket.gethostname(), os.getpid()
        # Under torchrun the parent is the launcher; a new parent means it died.
        self.parent = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        self._beats = 0
        self._watched = (rank + 1) % world_size if world_size > 1 else None
        self._seen: tuple[str, float] | None = None
        self._store_ok = time.monotonic()  # the last time the store answered
        self._tick_error: str | None = None  # the last on_tick error reported
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchtitan-monitor", daemon=True)

    def start(self) -> RankMonitor:
        self._beat()
        self._thread.start()
        return self

    def set_phase(self, phase: str, step: int | None = None) -> None:
        """What this rank is doing now (cheap: the thread publishes it)."""
        if phase != self.phase:
            self._phase_since = self._clock()
        self.phase = phase
        if step is not None:
            self.step = step

    def stop(self) -> None:
        """Normal end: peers must not mistake the silence for a hang."""
        self.set_phase("done")
        self._done.set()
        if self.store is not None:
            try:
                self._beat()
            except Exception:
                pass

    # -- failures ---------------------------------------------------------------

    def publish_failure(self, rec: dict[str, Any]) -> bool:
        """Publish a failure for every rank to see; True if it is the job's first."""
        self._done.set()  # this rank is ending: its own thread must not exit first
        if self.store is None:
            return True
        try:
            first = self.store.add(FAILURE_COUNT, 1) == 1
            if first:
                self.store.set(FAILURE_KEY, json.dumps(rec))
            return first
        except Exception:
            return True

    def linger(self) -> None:
        """Rank 0 hosts the workers' store: before it ends on a failure, it waits two
        heartbeat intervals (at most 5 s) so that the ranks of other nodes read the
        report (they look at every tick) and their launchers print the root cause,
        not a lost peer. On one node the launcher has every report already."""
        nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
        if self.store is not None and self.rank == 0 and nodes > 1:
            time.sleep(min(2 * self.interval + 0.5, 5.0))

    def _peer_failure(self) -> dict[str, Any] | None:
        assert self.store is not None
        if not self.store.check([FAILURE_KEY]):
            return None
        return json.loads(self.store.get(FAILURE_KEY))

    def wait_peer_failure(self, timeout_s: float) -> dict[str, Any] | None:
        """A failure another rank published within `timeout_s`: when a collective
        breaks because a peer died, the peer's report is the root cause."""
        if self.store is None:
            return None
        end = time.monotonic() + timeout_s
        while True:
            try:
                rec = self._peer_failure()
            except Exception:
                return None
            if rec is not None and rec["rank"] != self.rank:
                return rec
            if time.monotonic() >= end:
                return None
            time.sleep(0.1)

    def _exit_for(self, rec: dict[str, Any]) -> None:
        """Another rank failed: end now. A failure of another node is summarised for
        this node's launcher, so every node's launcher prints the root cause."""
        if rec["kind"] == preemption.STOPPED_KIND and self.stop_requests is not None:
            self.stop_requests.stop_at_once(
                f"rank {rec['rank']} stopped at once ({rec['message']})", follows=rec["rank"]
            )
        if not failure.recorded_here(rec):  # a failure of another node: say it on this one too
            failure.write_record(rec, name="summary.json")
        self.linger()
        if self.on_exit is not None:
            self.on_exit()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(failure.KINDS.get(rec["kind"], failure.EXIT_CRASH))

    # -- the thread ---------------------------------------------------------------

    def _beat(self) -> None:
        assert self.store is not None
        self._beats += 1
        doc = {
            "beat": self._beats,
            "phase": self.phase,
            "phase_s": round(self._clock() - self._phase_since, 1),  # a duration: no clock skew
            "step": self.step,
            "host": self.host,
            "pid": self.pid,
        }
        self.store.set(f"hb/{self.rank}", json.dumps(doc))

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            if self.parent is not None and os.getppid() != self.parent:
                self._orphan("its launcher (parent process) is gone")
            if self.on_tick is not None:
                self._tick()
            if self.store is None:
                continue
            try:
                self._beat()
                rec = self._peer_failure()
                if rec is not None and not self._done.is_set():
                    self._exit_for(rec)
                if self.timeout_s > 0 and self._watched is not None:
                    self._watch()
                self._store_ok = time.monotonic()
            except Exception as exc:
                # Wall time, not a count of errors: a store that hangs fails slowly.
                if time.monotonic() - self._store_ok >= 10 and not self._done.is_set():
                    self._orphan(f"the rendezvous store stopped answering ({exc})")

    def _tick(self) -> None:
        """Run `on_tick`; report an error of it once (and its end), never die of it."""
        assert self.on_tick is not None
        try:
            self.on_tick()
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if text != self._tick_error:
                logger.warning(f"rank {self.rank}: monitor: {text}; retrying every tick")
                self._tick_error = text
            return
        if self._tick_error is not None:
            logger.warning(f"rank {self.rank}: monitor: recovered from '{self._tick_error}'")
            self._tick_error = None

    def _orphan(self, why: str) -> None:
        print(
            f"rank {self.rank}: exiting: {why}; an orphaned rank must not keep writing",
            file=sys.stderr,
            flush=True,
        )
        os._exit(failure.EXIT_CRASH)

    def _read(self, rank: int) -> dict[str, Any] | None:
        assert self.store is not None
        key = f"hb/{rank}"
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def diagnose(self) -> dict[str, Any] | None:
        """A failure record if the watched rank is frozen or stuck waiting for data
        (`frozen_pid`: the process to kill, when frozen on this host)."""
        peer = self._watched
        if peer is None:
            return None
        doc = self._read(peer)
        if doc is None or doc["phase"] == "done":
            return None
        now = self._clock()
        key = f"{doc['beat']}"
        stalled = doc["phase"] == "data" and doc.get("phase_s", 0) >= self.timeout_s
        if not stalled and (self._seen is None or self._seen[0] != key):
            self._seen = (key, now)
            return None
        silent = 0.0 if stalled else now - self._seen[1]
        if not stalled and silent < self.timeout_s:
            return None
        others = []
        for r in range(self.world):
            if r == peer:
                continue
            d = self._read(r)
            if d is not None:
                others.append(f"rank {r}: {d['phase']} (step {d['step']})")
        who = f"rank {peer} (host {doc['host']}, pid {doc['pid']})"
        if stalled:
            what = f"has waited {doc['phase_s']:.0f}s for its data at step {doc['step']}"
        else:
            what = (
                f"sent no heartbeat for {silent:.0f}s; it was last in '{doc['phase']}' at "
                f"step {doc['step']}"
            )
        msg = (
            f"{who} {what} (job.heartbeat_timeout_s = {self.timeout_s:g}). The others wait: "
            + "; ".join(others)
        )
        rec = failure.record(peer, "hang", msg)
        rec["reported_by"] = self.rank
        rec["frozen_pid"] = None if stalled or doc["host"] != self.host else int(doc["pid"])
        return rec

    def _watch(self) -> None:
        rec = self.diagnose()
        if rec is None:
            return
        if self.publish_failure(rec):
            failure.write_record(rec, name=f"hang-{rec['rank']}.json") or print(
                failure.format_record(rec), file=sys.stderr, flush=True
            )
            if rec["frozen_pid"] is not None:
                try:  # a stopped process ignores SIGTERM until continued
                    os.kill(rec["frozen_pid"], signal.SIGKILL)
                except OSError:
                    pass
        self._exit_for(rec)
