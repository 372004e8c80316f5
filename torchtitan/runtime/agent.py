"""The elastic agent's policy: what torchrun's agent does when a worker fails or
the membership changes, for this trainer.

torchrun's LocalElasticAgent already restarts the workers (stop, rendezvous,
start) when one fails (counted against `--max-restarts`) and when a node waits
to join (not counted); the trainer then resumes from the newest complete
checkpoint at whatever size the rendezvous gave it. On top of that:
- the restart budget renews: `--max-restarts N` allows N failures within any
  window of `TORCHTITAN_RESTART_WINDOW_S` seconds (run_train.sh's
  RESTART_WINDOW, default an hour); older failures are forgotten, so a week-long
  job is not ended by its fourth node loss of the week. Each restart says
  "failure 2 of 3 in the last hour"; membership changes (a node joining) never
  count;
- input errors are not retried: a worker that exits 2 (bad config or data, a
  held dump-folder lock, a divergence stop) ends the job, and so does a failure
  while a stop (preemption) is pending;
- the error folder is emptied before each restart, so the launcher never
  reports a failure of an earlier attempt;
- before the agent signals its workers it marks the folder (`AGENT_STOPPING`),
  so a rank tells that SIGTERM from a preemption warning (preemption.py);
- the log says why the job restarts and at which size it re-formed.

`install` swaps this class in for torchrun's (the launcher runs torchrun in its
own process).

What this relies on, as torch 2.11 to 2.13's torch/distributed/elastic implement it:
- the job forms once MIN nodes joined and `last_call_timeout` passed (or MAX
  joined), within `join_timeout`; a node whose keep-alive stops is dropped after
  `keep_alive_interval` x `keep_alive_max_attempt`; the agent polls its workers
  and the waiting nodes every `--monitor-interval`;
- a restart stops the workers with SIGTERM, then SIGKILL after
  `--shutdown-timeout` (2.13; 2.11 waits a fixed 30 s); workers run in their own sessions, so a terminal's
  Ctrl-C reaches only the launcher; torchrun re-installs its handlers for
  `--signals-to-handle` at every start (the launcher leaves it the stop
  signals);
- workers learn `TORCHELASTIC_RUN_ID`, `TORCHELASTIC_RESTART_COUNT` (counted by
  each agent, failures only: not the same on every node after a membership
  change), `GROUP_WORLD_SIZE` (nodes) and `GROUP_RANK`;
- the rendezvous store is a TCPStore in the agent on the endpoint's host: if
  that agent dies, the others' rendezvous fails and the job ends.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from torchtitan.runtime import failure, preemption

_running = False  # whether this launcher's workers run now (read by the signal handlers)
_formed = False  # whether a rendezvous of this launcher ever completed (read by the launcher)
WINDOW_ENV = "TORCHTITAN_RESTART_WINDOW_S"
DEFAULT_WINDOW_S = 3600.0


def workers_running() -> bool:
    return _running


def job_formed() -> bool:
    """Whether this launcher's job ever formed: a rendezvous lost after that is the
    loss of its host; one that never completed is an endpoint that cannot be reached."""
    return _formed


def say(message: str) -> None:
    """One launcher line (torchrun's own logger is silenced by the launcher)."""
    print(f"[launcher] {message}", file=sys.stderr, flush=True)


def clear_records(folder: str) -> None:
    """Forget the failure and stop records of an attempt (not a pending stop request)."""
    for name in os.listdir(folder):
        if name.endswith(".json") and name != preemption.STOP_REQUEST:
            try:
                os.remove(os.path.join(folder, name))
            except FileNotFoundError:
                pass


def describe_failure(folder: str, result: RunResult | None) -> str:
    """Why the workers failed: the root-cause record a rank wrote, else exit statuses."""
    recs = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json") and not name.startswith((preemption.STOPPED_PREFIX, "stop-")):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    recs.append(json.load(f))
            except (OSError, ValueError):
                continue
    if recs:
        rec = min(recs, key=lambda r: (r.get("kind") != "user", r.get("time", 0)))
        lines = [x.strip() for x in str(rec.get("message", "")).splitlines() if x.strip()]
        # The first line says it all: a user error's message, a crash's exception and
        # where it was raised (failure.describe).
        text = lines[0][:200] if lines else ""
        return f"rank {rec.get('rank')} failed ({rec.get('kind')}): {text}"
    parts = []
    for rank, f in sorted((result.failures if result else {}).items()):
        code = f.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        parts.append(f"rank {rank} {how}")
    return "worker failure (" + (", ".join(parts) or "no status") + ")"


def no_restart_reason(exit_codes: set[int], folder: str) -> str | None:
    """Why a failed attempt must not be retried, or None: an input error (exit 2)
    fails again the same way; a pending stop request means the node is going away."""
    if failure.EXIT_USER in exit_codes:
        return f"an input error (exit {failure.EXIT_USER})"
    if os.path.exists(os.path.join(folder, preemption.STOP_REQUEST)):
        return "a stop request"
    if preemption.original_stop(preemption.stop_records(folder)) is not None:
        return "a stop (a rank was asked to stop at once)"
    return None


def _span(seconds: float) -> str:
    if seconds == 3600:
        return "hour"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} hours"
    if seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g}s"


class RestartBudget:
    """At most `limit` failures within any `window_s` seconds; a failure older than
    the window is forgotten. No threads, and the clock is injected for the tests."""

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._failures: list[float] = []

    def failure(self) -> tuple[bool, str]:
        """Count a failure now: (whether a restart is allowed, the log's words)."""
        now = self._clock()
        self._failures = [t for t in self._failures if now - t < self.window_s]
        self._failures.append(now)
        n = len(self._failures)
        words = f"failure {n} of {self.limit} in the last {_span(self.window_s)}"
        return n <= self.limit, words


def window_from_env() -> float:
    """`TORCHTITAN_RESTART_WINDOW_S`: a positive number of seconds (default an hour)."""
    text = os.environ.get(WINDOW_ENV, "")
    try:
        value = float(text) if text else DEFAULT_WINDOW_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(
            f"{WINDOW_ENV}={text!r} (RESTART_WINDOW in run_train.sh) is invalid: expected "
            "a positive number of seconds"
        )
    return value


class PolicyAgent(LocalElasticAgent):
    """LocalElasticAgent with the trainer's restart policy (see the module docstring)."""

    def __init__(self, *args: Any, error_dir: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._error_dir = error_dir
        self._why: str | None = None
        spec = self._worker_group.spec
        settings = getattr(spec.rdzv_handler, "settings", None)
        ranged = settings is not None and settings.min_nodes != settings.max_nodes
        self._elastic = spec.max_restarts > 0 or ranged
        self._budget = RestartBudget(spec.max_restarts, window_from_env())
        self._budget_words = ""
        self._restart_line = ""

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        global _running
        result = super()._monitor_workers(worker_group)
        if result.state == WorkerState.SUCCEEDED:
            _running = False
        if result.state not in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            return result
        self._why = describe_failure(self._error_dir, result)
        codes = {f.exitcode for f in result.failures.values()}
        why_not = no_restart_reason(codes, self._error_dir)
        if why_not is not None:
            if self._budget.limit > 0:
                say(f"not restarting after {why_not}: {self._why}")
            self._remaining_restarts = 0
            return result
        if self._budget.limit > 0:
            allowed, self._budget_words = self._budget.failure()
            if not allowed:
                say(
                    f"not restarting: {self._budget_words} (MAX_RESTARTS per "
                    f"RESTART_WINDOW): {self._why}"
                )
            # torchrun restarts while this is positive and then takes one off.
            self._remaining_restarts = 1 if allowed else 0
        return result

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        # Said once the job re-formed: a rendezvous that fails instead (its host is
        # gone) ends the job with the launcher's one line, not a "restarting" line.
        if worker_group.state == WorkerState.HEALTHY:
            self._restart_line = (
                "restarted the workers: membership change: a node joined (not counted)"
            )
        else:
            why = self._why or "worker failure"
            self._restart_line = (
                f"restarted the workers: {why} ({self._budget_words}; membership changes "
                "are not counted)"
            )
        clear_records(self._error_dir)
        self._why = None
        super()._restart_workers(worker_group)

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        global _formed
        super()._rendezvous(worker_group)
        _formed = True
        if self._restart_line:
            say(self._restart_line)
            self._restart_line = ""
        if self._elastic:
            world = worker_group.workers[0].world_size if worker_group.workers else 0
            ranks = [w.global_rank for w in worker_group.workers]
            say(
                f"job formed: {worker_group.group_world_size} node(s), {world} process(es); "
                f"this node is node {worker_group.group_rank}, ranks {min(ranks)}..{max(ranks)}"
            )

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        global _running
        mark = os.path.join(self._error_dir, preemption.AGENT_STOPPING)
        if os.path.exists(mark):
            os.remove(mark)
        _running = True
        started = super()._start_workers(worker_group)
        # When one worker fails, torchrun's process context stops the others itself
        # (SIGTERM from its poll, before this agent's _shutdown): marked first too.
        context = getattr(self, "_pcontext", None)
        if context is not None:
            mark_before_close(context, mark)
        return started

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        # torch 2.11 calls it with (death_sig), 2.13 with (death_sig, timeout)
        # (torch_compat.py): whatever torch passes goes on unchanged.
        global _running
        # Marked before any signal: the ranks must not take it for a preemption.
        with open(os.path.join(self._error_dir, preemption.AGENT_STOPPING), "w"):
            pass
        _running = False
        super()._shutdown(*args, **kwargs)


def mark_before_close(context: Any, mark: str) -> None:
    """Make `context.close` (torchrun's process context: it signals the workers)
    write `mark` first, so a rank takes that SIGTERM for the agent's, not for a
    preemption warning."""
    close = context.close

    def marked_close(*args: Any, **kwargs: Any) -> Any:
        with open(mark, "w"):
            pass
        return close(*args, **kwargs)

    context.close = marked_close


def install(error_dir: str) -> None:
    """Make torchrun (run in this process) build a PolicyAgent."""
    from torch.distributed.launcher import api

    api.LocalElasticAgent = partial(PolicyAgent, error_dir=error_dir)  # type: ignore[misc]
