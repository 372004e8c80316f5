"""Stopping early without losing a step: preemption warnings and Ctrl-C.

A stop is requested by a signal (SIGTERM, SIGINT, SIGUSR1: a scheduler's
warning before the kill, SLURM's `--signal`, Ctrl-C):
- to the launcher (`LauncherSignals`): it writes `STOP_REQUEST` into its error
  folder, which the ranks of its node look for at every step;
- to a rank itself (`StopRequests`), e.g. a scheduler that signals every process.
The ranks agree on the stop step through a flag in the all-reduce they run at
every step anyway (train.py `_batch_counts`): every rank trains that step,
saves and verifies its checkpoint, and exits; the launcher then exits with
`PREEMPT_EXIT_CODE` (default 3) so a scheduler can requeue the job. A second
signal stops at once, to the launcher or to any one rank, and still exits with
that status: the rank that stops at once leaves a stop record for its launcher
and publishes it in the store (`kind = "stopped"`), so its peers, whose
collectives break, report the stop and not a crash. A rank whose collective
breaks while a stop is requested reports the stop too.

The agent's own SIGTERM to its workers (before a restart after a membership
change or a failure, or at teardown) is not a preemption: the launcher marks its
folder (`AGENT_STOPPING`) before it signals, and a rank that sees the mark exits
at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from torchtitan.runtime.failure import ERROR_DIR_ENV
from zephon import atomic_write

logger = logging.getLogger("torchtitan")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
STOP_REQUEST = "stop-request.json"
AGENT_STOPPING = "agent-stopping"
STOPPED_PREFIX = "stopped-"
STOPPED_KIND = "stopped"  # a failure record's kind for a stop at once (monitor.py)
AT_ONCE = (
    "stopped at once: no checkpoint of the step in flight; the newest complete checkpoint "
    "is the resume point"
)
EXIT_CODE_ENV = "PREEMPT_EXIT_CODE"
EXIT_PREEMPTED = 3


def exit_code() -> int:
    """The exit status of a job stopped early with its checkpoint written
    (`PREEMPT_EXIT_CODE`, default 3)."""
    text = os.environ.get(EXIT_CODE_ENV, "")
    try:
        code = int(text) if text else EXIT_PREEMPTED
    except ValueError:
        code = -1
    if not 0 <= code <= 255:
        print(
            f"error: {EXIT_CODE_ENV}={text!r} is invalid: expected an exit status 0..255; "
            f"using {EXIT_PREEMPTED}",
            file=sys.stderr,
        )
        return EXIT_PREEMPTED
    return code


def _name(signum: int) -> str:
    return signal.Signals(signum).name


# -- the ranks' side -----------------------------------------------------------------------


class StopRequests:
    """A rank's view of stop requests: its own signals and its launcher's mark."""

    def __init__(
        self,
        rank: int,
        on_exit: Callable[[], None] | None = None,
        on_stop_at_once: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.rank = rank
        self.on_exit = on_exit  # e.g. releasing the dump-folder lock before an immediate exit
        self.on_stop_at_once = on_stop_at_once  # e.g. telling the peers through the store
        self.folder = os.environ.get(ERROR_DIR_ENV) or None
        self.signal: str | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
            signal.siginterrupt(sig, False)  # system calls in flight resume, not fail

    def _mark(self, name: str) -> str | None:
        return os.path.join(self.folder, name) if self.folder else None

    def _on_signal(self, signum: int, frame: Any) -> None:
        stopping = self._mark(AGENT_STOPPING)
        if stopping is not None and os.path.exists(stopping):
            self._exit_now(signum)  # the agent restarts or tears down the workers
        name = _name(signum)
        if self.signal is not None:
            self.stop_at_once(f"second {name}", tell_peers=True)
        self.signal = name
        if self.rank == 0:
            logger.warning(
                f"{name} received: finishing this step, saving a checkpoint of it, then "
                f"exiting ({name} again: stop at once)"
            )

    def _exit_now(self, signum: int) -> None:
        if self.on_exit is not None:
            self.on_exit()
        sys.stdout.flush()
        os._exit(128 + signum)

    def stop_at_once(
        self, reason: str, tell_peers: bool = False, follows: int | None = None
    ) -> None:
        """End this process now with the preemption status, leaving a stop record for
        the launcher (and, `tell_peers`, for the other ranks through the store);
        `follows`: the rank whose stop at once ended this one."""
        rec = {"rank": self.rank, "step": None, "reason": reason, "what": AT_ONCE, "at_once": True}
        # The root cause (a second signal to this rank), or a consequence of another
        # rank's stop or of a collective broken during a requested stop.
        rec["original"] = tell_peers
        if follows is not None:
            rec["follows"] = follows
        self.write_record(rec)
        if tell_peers and self.on_stop_at_once is not None:
            try:
                self.on_stop_at_once(rec)
            except Exception:
                pass  # the store may be gone already: the exit status still says it
        if self.folder is None:  # no launcher to say it
            print(f"rank {self.rank}: {reason}: {AT_ONCE}", file=sys.stderr, flush=True)
        if self.on_exit is not None:
            self.on_exit()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code())

    def write_record(self, rec: dict[str, Any]) -> None:
        """A stop record for this node's launcher (none without a launcher)."""
        mark = self._mark(f"{STOPPED_PREFIX}{self.rank}.json")
        if mark is not None:
            try:
                atomic_write(mark, json.dumps(rec))
            except OSError:
                pass  # the launcher's folder is gone: it is gone too

    def requested(self) -> bool:
        """Whether this rank was asked to stop: a signal, or its launcher's mark."""
        if self.signal is not None:
            return True
        mark = self._mark(STOP_REQUEST)
        return mark is not None and os.path.exists(mark)

    def reason(self) -> str:
        if self.signal is not None:
            return self.signal
        mark = self._mark(STOP_REQUEST)
        try:
            with open(mark or "", encoding="utf-8") as f:
                return f"{json.load(f)['signal']} to the launcher"
        except (OSError, ValueError, KeyError):
            return "another rank's request"

    def finish(self, step: int, saved: tuple[str, float] | None) -> int:
        """After the agreed stop step is saved: log it, leave a record for the
        launcher, and return this rank's exit status (0 under the launcher, which
        then exits with the preemption code itself)."""
        if saved is None:
            what = "no checkpoint written (checkpoint.enable = false, or parameters not finite)"
        else:
            what = f"checkpoint {saved[0]} written and verified in {saved[1]:.2f}s"
        if self.rank == 0:
            logger.warning(f"preempted at step {step} ({self.reason()}): {what}")
        if self.folder is None:
            return exit_code()
        self.write_record({"rank": self.rank, "step": step, "reason": self.reason(), "what": what})
        return 0


# -- the launcher's side --------------------------------------------------------------------


class LauncherSignals:
    """The launcher's handlers: the first stop signal asks the ranks to stop after a
    checkpoint; a second one (or one while no worker runs) raises torchrun's
    SignalException, which kills the workers at once."""

    def __init__(self, folder: str, workers_running: Callable[[], bool]):
        self.folder = folder
        self.workers_running = workers_running
        self.received: str | None = None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        name = _name(signum)
        if self.received is None and self.workers_running():
            self.received = name
            doc = {"signal": name, "time": time.time(), "pid": os.getpid()}
            atomic_write(os.path.join(self.folder, STOP_REQUEST), json.dumps(doc))
            print(
                f"{name}: the job finishes its current step, saves a checkpoint of it and "
                f"exits with status {exit_code()} ({name} again: stop at once)",
                file=sys.stderr,
                flush=True,
            )
            return
        first = self.received is None
        self.received = self.received or name
        raise SignalException(
            f"{name} {'with no worker running' if first else 'again'}", sigval=signal.SIGKILL
        )


def original_stop(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The record of a rank that was itself told to stop at once (a second signal),
    if any: the root cause of every failure it leads to."""
    return next((r for r in records if r.get("original")), None)


def stop_records(folder: str) -> list[dict[str, Any]]:
    """The ranks' records of a stop after a saved step, in rank order."""
    out = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(STOPPED_PREFIX) and name.endswith(".json"):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
    return sorted(out, key=lambda r: r.get("rank", 0))
