#!/usr/bin/env python
"""Unattended runs: elastic restarts, preemption and divergence, on one machine.

    .venv/bin/python scripts/experiments/elastic_scenarios.py            # every scenario
    .venv/bin/python scripts/experiments/elastic_scenarios.py --scenarios kill9_agent,join

Each scenario launches `run_train.sh` agents (torchrun's elastic agent, NNODES=1:3,
c10d rendezvous on 127.0.0.1) on the debug model and the sample data (8 lanes), injects
a fault, and checks the job without a person. Most sizes do not divide the 8 lanes,
as the survivors of a lost node rarely do: a rank with fewer lanes pads (docs/design.md
§2), and no size up to the lane count is refused.
- kill9_agent: agents of 2 + 1 + 1 processes; kill -9 of a 1-process launcher
  mid-run. Its rank must exit on its own; the job goes on with 3 processes (4 -> 3).
- join: one agent of 2 processes; an agent of 1 starts at step 3: the job restarts
  on 3 processes (2 -> 3).
- sigterm_all_ranks: agents of 2 + 1; SIGTERM to every rank: a checkpoint of the
  current step, both launchers exit 3 (PREEMPT_EXIT_CODE); relaunched, the job
  resumes from that step on 3 processes and finishes.
- kill_during_restart: agents of 1 (the rendezvous host) + 1 + 1; kill -9 of the
  second launcher, then, as soon as the survivors start to restart (3 -> 2), of the
  third: the host finishes alone.
- ctrl_c: one agent of 3; SIGINT to the launcher (a terminal's Ctrl-C): one line,
  a checkpoint of the current step, exit 3; relaunched, the job finishes.
- ctrl_c_twice: the same with a second SIGINT at once: the job stops at once
  (exit 3, no new checkpoint), no process is left.
- divergence: 3 processes, `--optimizer.lr 30`, `--checkpoint.keep_latest_k 1`: the
  loss diverges; the job stops with exit 2 and one message naming the newest finite
  checkpoint, which pruning kept.
- input_error: agents of 1 + 1 with a recipe that does not exist: both exit 2
  with the message, and neither restarts (an input error is not retried).
- idle_share_refused: agents of 2 + 1 with `--parallelism.max_idle_share 0.1`: 3
  processes pad 11.1% of the compute, more than allowed: an input error, exit 2 on
  both, not retried.

For each scenario: the world sizes (processes) the job formed at before and after
the fault, whether every step's global-batch digest equals the data's (a one-rank
Zephon loader: what any process count must log), steps lost (trained before the
fault, not in the checkpoint resumed from), seconds from the fault to the next
trained step (metrics.jsonl times) against the bound docs/unattended.md states,
and orphans (processes of the run still alive after it ended). Writes
`elastic_scenarios.json` and `.md` (generated from the JSON; `--render JSON`, which
also rewrites the copy in docs/unattended.md, QUOTED_IN, for the committed JSON)
under --results; exits 1 if any scenario fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import faults as fi
from harness.train import (
    REPO,
    data_digests,
    ensure_sample_data,
    etcd_server,
    immutable,
    pick_scenarios,
    quote_in_page,
    read_metrics,
    render_results,
)
from torchtitan.distributed.utils import free_port

RESULTS = REPO / "docs" / "results" / "elastic_scenarios.json"
# The documentation page whose `<!-- NAME:begin/end -->` markers quote this script's summary.
QUOTED_IN = "docs/unattended.md"

STEPS, INTERVAL = 16, 4
LONG_STEPS = 40  # the scenarios that need a longer run (the restart budget's window)
BASE = {"training.steps": STEPS, "checkpoint.interval": INTERVAL}
# Short rendezvous timeouts for a test on one machine (run_train.sh's defaults are 5 x 3
# s keep-alive and a 10 s last call).
KEEP_ALIVE_S, KEEP_ALIVE_ATTEMPTS, LAST_CALL_S, MONITOR_S = 1, 3, 3, 0.5
RDZV_CONF = (
    f"join_timeout=120,last_call_timeout={LAST_CALL_S},close_timeout=10,heartbeat=5,"
    f"keep_alive_interval={KEEP_ALIVE_S},keep_alive_max_attempt={KEEP_ALIVE_ATTEMPTS}"
)
# A rank whose collective breaks waits 3 heartbeat intervals (2 s) for its peer's report.
DETECT_S = 3 * 2.0 + MONITOR_S
# Start, imports, model build, checkpoint load and one step, on a shared 2-core machine.
STARTUP_S = 60.0
BOUND_S = DETECT_S + KEEP_ALIVE_S * KEEP_ALIVE_ATTEMPTS + LAST_CALL_S + STARTUP_S
SCENARIOS = (
    "kill9_agent",
    "join",
    "sigterm_all_ranks",
    "kill_during_restart",
    "ctrl_c",
    "ctrl_c_twice",
    "divergence",
    "input_error",
    "idle_share_refused",
    "restart_budget_renews",
    "first_node_lost_c10d",
    "first_node_lost_etcd",
    "sigterm_twice_one_rank",
    "checkpoint_folder_readonly",
    "dump_folder_readonly",
)
# The processes each scenario must train at before the fault and finish at: most do
# not divide the 8 lanes.
SIZES = {
    "kill9_agent": (4, 3),
    "join": (2, 3),
    "sigterm_all_ranks": (3, 3),
    "kill_during_restart": (3, 1),
    "ctrl_c": (3, 3),
}


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Run:
    """The agents of one job (a dump folder, a rendezvous endpoint), watched in the
    background: every process they started, and the highest step logged over time."""

    def __init__(self, dump: Path, extra: dict[str, Any] | None = None, fresh: bool = True):
        if fresh:
            shutil.rmtree(dump, ignore_errors=True)
        self.dump, self.extra = dump, {**BASE, **(extra or {})}
        self.port = free_port()
        self.agents: list[fi.Job] = []
        self.nproc: list[int] = []  # processes per agent
        self.elastic = True
        self.pids: set[int] = set()
        self.steps: list[tuple[float, int]] = []  # (time, highest step in metrics.jsonl)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def agent(self, nproc: int, elastic: bool = True, env: dict[str, str] | None = None) -> fi.Job:
        env = {"MONITOR_INTERVAL": str(MONITOR_S), **(env or {})}
        if elastic:
            env = {"NNODES": "1:3", "RDZV_ENDPOINT": f"127.0.0.1:{self.port}",
                   "RDZV_CONF": RDZV_CONF, **env}  # fmt: skip
        job = fi.Job(self.dump, self.extra, nproc, env, name=f"agent{len(self.agents)}")
        self.agents.append(job)
        self.nproc.append(nproc)
        self.elastic = elastic
        if elastic and len(self.agents) == 1 and env.get("RDZV_BACKEND", "c10d") == "c10d":
            # The first agent hosts the rendezvous store: the others must find it up.
            end = time.monotonic() + 60
            while not _port_open(self.port) and time.monotonic() < end:
                time.sleep(0.1)
        return job

    def relaunch(self) -> Run:
        """The same job launched again on its dump folder (as a scheduler requeues it),
        keeping the history of steps logged."""
        again = Run(self.dump, self.extra, fresh=False)
        again.steps[:0] = self.steps
        return again

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            for job in self.agents:
                self.pids.update(job.tree())
            self.steps.append((time.time(), fi.steps_logged(self.dump)))

    def step(self) -> int:
        return fi.steps_logged(self.dump)

    def ended(self) -> bool:
        """Every agent has exited: nothing more will happen."""
        return all(job.proc.poll() is not None for job in self.agents)

    def wait_step(self, step: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.step() >= step:
                return True
            if self.ended():
                return self.step() >= step
            time.sleep(0.05)
        return False

    def trained_at(self, procs: int, step: int, timeout: float) -> bool:
        """Wait until the job has formed at `procs` processes and, so formed, trained
        up to `step` at least and past every step logged before (a late joiner makes
        the job re-form before the fault: the fault must hit the size it names)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.formed()[-1:] != [procs] and not self.ended():
            time.sleep(0.1)
        return self.formed()[-1:] == [procs] and self.wait_step(
            max(step, self.step() + 1), end - time.monotonic()
        )

    def output(self) -> str:
        return "\n".join(job.output() for job in self.agents)

    def formed(self) -> list[int]:
        """The process counts the job formed at, in order: the first agent's "job
        formed" lines (it takes part in every round of these scenarios), or its own
        process count when it runs without a rendezvous."""
        if not self.agents:
            return []
        if not self.elastic:
            return [self.nproc[0]]
        text = self.agents[0].output()
        return [int(n) for n in re.findall(r"job formed: \d+ node\(s\), (\d+) process", text)]

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for every agent; then the exit statuses and the orphans (processes of
        the run alive 20 s after the last agent exited), which are then killed."""
        codes = [job.wait(timeout) for job in self.agents]
        end = time.monotonic() + 20
        while time.monotonic() < end and any(_alive(p) for p in self.pids):
            time.sleep(0.2)
        self._stop.set()
        self._thread.join()
        orphans = sorted(p for p in self.pids if _alive(p))
        for p in orphans:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        for job in self.agents:
            if job.proc.poll() is None:
                job.kill9()
        return {"exit": codes, "orphans": len(orphans)}


def sizes(seen: list[int], after: list[int], *runs: Run) -> dict[str, Any]:
    """The world sizes around a fault: the size the job had formed at when it hit
    (`seen`: formed() then), the sizes it formed at afterwards, in order (the last
    finished the job), and the sizes whose padded layout rank 0 reported."""
    text = "\n".join(r.output() for r in runs)
    padded = re.findall(r"padded layout: \d+ lanes over (\d+) data-parallel ranks", text)
    return {"world_before": seen[-1] if seen else None, "world_after": after,
            "padded_sizes": sorted({int(n) for n in padded})}  # fmt: skip


def measure(run: Run, t_fault: float, ref: dict[int, str]) -> dict[str, Any]:
    """Digests, the step resumed from (the last "resumed from step K" its agents
    logged) and at which data-parallel sizes, steps lost and seconds from the fault
    to the first step trained after the resume (step K+1's time in metrics.jsonl)."""
    records = read_metrics(run.dump)
    why = fi.digests_ok(run.dump, {s: {"digest": d} for s, d in ref.items()}, 1, STEPS)
    resumes = [
        (int(k), int(d))
        for k, d in re.findall(r"resumed from step (\d+) on (\d+) data-parallel", run.output())
    ]
    out: dict[str, Any] = {"digests_ok": why is None, "digest_problem": why}
    if not resumes or max(resumes)[0] + 1 not in records:
        return {**out, "resumed_from": None}
    resumed = max(resumes)[0]
    first_new = records[resumed + 1]["time"]
    trained = max((m for t, m in run.steps if t < first_new), default=0)
    return {
        **out,
        "resumed_from": resumed,
        # Every attempt that resumed from that step (one that was cut short too).
        "resumed_on": sorted({d for k, d in resumes if k == resumed}),
        "steps_trained_before": trained,
        "steps_lost": max(trained - resumed, 0),
        "recovery_s": round(first_new - t_fault, 1),
    }


# -- scenarios -------------------------------------------------------------------------------


def kill9_agent(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    run = Run(out / "kill9_agent")
    run.agent(2)
    run.agent(1)
    victim = run.agent(1)
    if not run.trained_at(4, 5, timeout):
        return {**run.finish(5), "problem": f"no step 5 on 4 processes (formed {run.formed()})"}
    seen, t_fault = run.formed(), time.time()
    os.kill(victim.proc.pid, signal.SIGKILL)  # run_train.sh execs the launcher: this is it
    result = run.finish(timeout)
    result["exit"][2] = "killed"
    return {**result, **sizes(seen, run.formed()[len(seen):], run), **measure(run, t_fault, ref),
            "bound_s": BOUND_S,
            "restarted": "restarted the workers: rank" in run.output()}  # fmt: skip


def join(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    run = Run(out / "join")
    run.agent(2)
    if not run.trained_at(2, 3, timeout):
        return {**run.finish(5), "problem": f"no step 3 on 2 processes (formed {run.formed()})"}
    seen, t_fault = run.formed(), time.time()
    run.agent(1)
    result = run.finish(timeout)
    bound = LAST_CALL_S + STARTUP_S * 2  # the new agent starts Python too
    return {**result, **sizes(seen, run.formed()[len(seen):], run), **measure(run, t_fault, ref),
            "bound_s": bound}  # fmt: skip


def sigterm_all_ranks(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    run = Run(out / "sigterm_all_ranks")
    run.agent(2)
    run.agent(1)
    if not run.trained_at(3, 5, timeout):
        return {**run.finish(5), "problem": f"no step 5 on 3 processes (formed {run.formed()})"}
    ranks = [p for job in run.agents for r in range(3) if (p := job.rank_pid(r)) is not None]
    seen, t_fault = run.formed(), time.time()
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    first = run.finish(timeout)
    saved = fi.steps_logged(run.dump)
    ckpt = run.dump / "checkpoint" / f"step-{saved}" / "COMPLETE.json"
    again = run.relaunch()  # requeued: the same two agents
    again.agent(2)
    again.agent(1)
    second = again.finish(timeout)
    return {"exit": first["exit"], "relaunch_exit": second["exit"],
            "orphans": first["orphans"] + second["orphans"], "ranks_signalled": len(ranks),
            "checkpoint_of_last_step": ckpt.is_file(), **sizes(seen, again.formed(), run, again),
            **measure(again, t_fault, ref), "bound_s": BOUND_S}  # fmt: skip


def kill_during_restart(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    run = Run(out / "kill_during_restart")
    host = run.agent(1)  # the rendezvous host survives: losing it ends any torchrun job
    first, second = run.agent(1), run.agent(1)
    if not run.trained_at(3, 5, timeout):
        return {**run.finish(5), "problem": f"no step 5 on 3 processes (formed {run.formed()})"}
    worker = host.rank_pid(0)
    seen, t_fault = run.formed(), time.time()
    os.kill(first.proc.pid, signal.SIGKILL)
    # The survivors restart (3 -> 2): the second kill lands as the host's worker is
    # replaced, before the job has re-formed.
    end = time.monotonic() + timeout
    while worker is not None and _alive(worker) and time.monotonic() < end:
        time.sleep(0.05)
    os.kill(second.proc.pid, signal.SIGKILL)
    result = run.finish(timeout)
    result["exit"][1:] = ["killed", "killed"]
    return {**result, **sizes(seen, run.formed()[len(seen):], run), **measure(run, t_fault, ref),
            "bound_s": 2 * BOUND_S}  # fmt: skip


def ctrl_c(out: Path, ref: dict[int, str], timeout: float, twice: bool = False) -> dict[str, Any]:
    run = Run(out / ("ctrl_c_twice" if twice else "ctrl_c"))
    job = run.agent(3, elastic=False)
    if not run.wait_step(5, timeout):
        return {**run.finish(5), "problem": "no step 5"}
    t_fault = time.time()
    os.killpg(job.proc.pid, signal.SIGINT)  # what a terminal sends to the foreground group
    if twice:
        time.sleep(0.5)
        os.killpg(job.proc.pid, signal.SIGINT)
    first = run.finish(timeout)
    text = job.output()
    launcher_lines = [ln for ln in text.splitlines() if ln and not ln.startswith("[rank")]
    shown = {"traceback": "Traceback" in text, "launcher_lines_after_signal": launcher_lines}
    if twice:
        ckpts = sorted((run.dump / "checkpoint").glob("step-*/COMPLETE.json"))
        return {**first, **shown, **sizes(run.formed(), [], run),
                "stopped_at_once": "stopped at once (SIGINT)" in text,
                "checkpoints": [p.parent.name for p in ckpts]}  # fmt: skip
    again = run.relaunch()
    again.agent(3, elastic=False)
    second = again.finish(timeout)
    return {**first, **shown, "relaunch_exit": second["exit"],
            "orphans": first["orphans"] + second["orphans"],
            **sizes(run.formed(), again.formed(), run, again),
            **measure(again, t_fault, ref), "bound_s": STARTUP_S}  # fmt: skip


def divergence(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    extra = {"optimizer.lr": 30, "lr_scheduler.warmup_steps": 8, "checkpoint.interval": 2,
             "checkpoint.keep_latest_k": 1, "training.max_nonfinite_steps": 5}  # fmt: skip
    run = Run(out / "divergence", extra)
    job = run.agent(3, elastic=False)
    result = run.finish(timeout)
    text = job.output()
    errors = [ln for ln in text.splitlines() if ln.startswith("error")]
    ckdir = run.dump / "checkpoint"
    kept = {}
    for marker in sorted(ckdir.glob("step-*/COMPLETE.json")):
        kept[marker.parent.name] = json.loads(marker.read_text()).get("finite", True)
    finite = sorted(int(k.split("-")[1]) for k, v in kept.items() if v)
    # The advice names the newest finite checkpoint from before the trouble began
    # (at least two steps before its first bad step), or says none was kept.
    began = re.search(r"trouble began at step (\d+)", errors[0]) if len(errors) == 1 else None
    safe = [s for s in finite if began and s < int(began.group(1)) - 1]
    named = began is not None and (
        f"from before the trouble began is step {safe[-1]} (" in errors[0]
        if safe
        else "No checkpoint from before step" in errors[0]
    )
    return {**result, **sizes(run.formed(), [], run), "error_lines": errors,
            "checkpoints_finite": kept, "names_finite": named,
            "traceback": "Traceback" in text}  # fmt: skip


def _refused(run: Run, timeout: float) -> dict[str, Any]:
    """How an elastic job that fails on its input ended: every agent must say it does
    not restart after an input error, and print the error once, without a traceback."""
    result = run.finish(timeout)
    outs = [job.output() for job in run.agents]
    errors = [[ln for ln in o.splitlines() if ln.startswith("error")] for o in outs]
    return {**result, **sizes(run.formed(), [], run),
            "not_retried": all("not restarting after an input error" in o for o in outs),
            "failure_restarts": sum(o.count("restarted the workers: rank") for o in outs),
            "error_lines": [len(e) for e in errors], "errors": [e[:1] for e in errors],
            "traceback": any("Traceback" in o for o in outs)}  # fmt: skip


def input_error(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    run = Run(out / "input_error", {"data.recipe": out / "no-such-recipe.toml"})
    run.agent(1)
    run.agent(1)
    return _refused(run, timeout)


def idle_share_refused(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    """3 processes over 8 lanes pad 2 of 18 rows (11.1%): above the 10% allowed."""
    run = Run(out / "idle_share_refused", {"parallelism.max_idle_share": 0.1})
    run.agent(2)
    run.agent(1)
    result = _refused(run, timeout)
    names = all("more than the allowed 10.0%" in (e or [""])[0] for e in result["errors"])
    return {**result, "names_share": names}


# -- a week alone (issue 30): each returns named checks, all of which must hold ---------------


def _one_line(text: str, start: str) -> dict[str, Any]:
    """The launcher's lines starting with `start`, and whether the output has a traceback."""
    lines = [ln for ln in text.splitlines() if ln.startswith(start)]
    return {"lines": lines, "traceback": "Traceback" in text}


def _storage_line(text: str, what: str) -> dict[str, Any]:
    """The error lines naming `what`: `error: ...` on the failing rank's node, `error
    (rank R, host H): ...` on the others."""
    lines = [
        ln for ln in text.splitlines() if re.match(r"error( \([^)]*\))?: " + re.escape(what), ln)
    ]
    return {"lines": lines, "traceback": "Traceback" in text}


def restart_budget_renews(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    """MAX_RESTARTS=1 per RESTART_WINDOW=20 s: the second agent is killed twice (and
    started again each time), the second time more than a window after the first, so
    each failure is "failure 1 of 1": the job survives both. With a budget that never
    renews the second loss ends it."""
    window = 20.0
    env = {"MAX_RESTARTS": "1", "RESTART_WINDOW": f"{window:g}"}
    run = Run(out / "restart_budget_renews", {"training.steps": LONG_STEPS})
    host = run.agent(1, env=env)
    victim = run.agent(1, env=env)
    kills = []
    for at in (4, 14):
        if not run.trained_at(2, at, timeout):
            return {**run.finish(5), "problem": f"no step {at} on 2 processes ({run.formed()})"}
        if kills and time.time() - kills[-1] < window + 2:
            time.sleep(window + 2 - (time.time() - kills[-1]))
        kills.append(time.time())
        seen = len(re.findall(r"failure \d+ of 1", host.output()))
        victim.kill9()  # the launcher and its ranks
        # The node comes back once the host has re-formed without it (a failure
        # counted against the budget), not before: a quick return is a mere join.
        end = time.monotonic() + timeout
        while len(re.findall(r"failure \d+ of 1", host.output())) == seen:
            if time.monotonic() > end or host.proc.poll() is not None:
                break
            time.sleep(0.2)
        victim = run.agent(1, env=env)
    result = run.finish(timeout)
    text = host.output()
    said = re.findall(r"failure (\d+) of 1 in the last 20s", text)
    checks = {
        "job finished (exit 0)": result["exit"][0] == 0,
        "each failure was 1 of 1": said == ["1", "1"],
        "digests right": fi.digests_ok(
            run.dump, {k: {"digest": d} for k, d in ref.items()}, 1, LONG_STEPS
        )
        is None,
    }
    return {**result, "budget_lines": said, "checks": checks}


def _kill_first_node(run: Run, first: fi.Job, timeout: float) -> tuple[list[int], float] | None:
    # After the save of step 4 (a kill inside it would leave nothing to resume from).
    if not run.trained_at(3, INTERVAL + 2, timeout):
        return None
    seen, t_fault = run.formed(), time.time()
    os.killpg(first.proc.pid, signal.SIGKILL)  # the launcher, and its ranks' sessions:
    for pid in first.tree():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return seen, t_fault


def first_node_lost_c10d(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    """With c10d the first node's agent holds the rendezvous: killing every process
    of it ends the job, with one line naming the host and the requeue status (3)."""
    run = Run(out / "first_node_lost_c10d")
    first = run.agent(1)
    run.agent(1)
    run.agent(1)
    if _kill_first_node(run, first, timeout) is None:
        return {**run.finish(5), "problem": f"no step 6 on 3 processes ({run.formed()})"}
    result = run.finish(timeout)
    outs = [job.output() for job in run.agents[1:]]
    lost = [_one_line(o, "error: lost the rendezvous host 127.0.0.1:") for o in outs]
    checks = {
        "survivors exit 3": result["exit"][1:] == [3, 3],
        "one line each naming the host": all(len(x["lines"]) == 1 for x in lost),
        "no traceback": not any(x["traceback"] for x in lost),
        "no restarting line": not any("restart" in o.split("[launcher]", 1)[-1] for o in outs),
    }
    result["exit"][0] = "killed"
    return {**result, "lines": [x["lines"] for x in lost], "checks": checks}


def first_node_lost_etcd(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    """With RDZV_BACKEND=etcd-v2 (an etcd server on 127.0.0.1 holds the rendezvous) no
    node is special: killing every process of the node that started first is
    survived, and every digest is right."""
    with etcd_server(out / "etcd") as endpoint:
        env = {"RDZV_BACKEND": "etcd-v2", "RDZV_ENDPOINT": endpoint}
        run = Run(out / "first_node_lost_etcd")
        first = run.agent(1, env=env)
        second = run.agent(1, env=env)
        run.agent(1, env=env)
        hit = _kill_first_node(run, first, timeout)
        if hit is None:
            return {**run.finish(5), "problem": f"no step 6 on 3 processes ({run.formed()})"}
        seen, t_fault = hit
        result = run.finish(timeout)
    result["exit"][0] = "killed"
    text = second.output()
    after = [int(n) for n in re.findall(r"job formed: \d+ node\(s\), (\d+) process", text)]
    m = measure(run, t_fault, ref)
    checks = {
        "survivors finish (exit 0)": result["exit"][1:] == [0, 0],
        "re-formed on 2": after[-1:] == [2],
        "digests right": bool(m.get("digests_ok")),
        "resumed": m.get("resumed_from") is not None,
    }
    return {**result, **m, "world_before": seen[-1] if seen else None, "world_after": after,
            "checks": checks}  # fmt: skip


def sigterm_twice_one_rank(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    """SIGTERM twice, 0.2 s apart, to rank 1 only: the job stops at once with the
    preemption status on both launchers (not 1, not retried); relaunched, it
    finishes with every digest right."""
    run = Run(out / "sigterm_twice_one_rank")
    run.agent(2)
    run.agent(1)
    if not run.trained_at(3, 4, timeout):
        return {**run.finish(5), "problem": f"no step 4 on 3 processes ({run.formed()})"}
    pid = run.agents[0].rank_pid(1)
    if pid is None:
        return {**run.finish(5), "problem": "rank 1 not found"}
    t_fault = time.time()
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.2)
    os.kill(pid, signal.SIGTERM)
    first = run.finish(timeout)
    text = run.output()
    again = run.relaunch()
    again.agent(2)
    again.agent(1)
    second = again.finish(timeout)
    m = measure(again, t_fault, ref)
    checks = {
        "both launchers exit 3": first["exit"] == [3, 3],
        "a stop, not a crash": "stopped (rank 1, second SIGTERM)" in text and "crash" not in text,
        "not restarted": "restarted the workers: rank" not in text,
        "relaunch finishes": second["exit"] == [0, 0],
        "digests right": bool(m.get("digests_ok")),
    }
    return {"exit": first["exit"], "relaunch_exit": second["exit"], **m,
            "orphans": first["orphans"] + second["orphans"], "checks": checks}  # fmt: skip


def checkpoint_folder_readonly(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    """The checkpoint folder cannot be written at the first save: one line naming the
    path, exit 2 on both launchers, not retried; writable again, a relaunch finishes."""
    run = Run(out / "checkpoint_folder_readonly")
    run.agent(2)
    run.agent(1)
    ckpt = run.dump / "checkpoint"
    if not run.trained_at(3, 1, timeout):
        return {**run.finish(5), "problem": f"no step 1 on 3 processes ({run.formed()})"}
    ckpt.mkdir(exist_ok=True)
    with immutable(ckpt):
        first = run.finish(timeout)
    outs = [job.output() for job in run.agents]
    named = [_storage_line(o, f"storage: cannot write {ckpt}/step-{INTERVAL}") for o in outs]
    again = run.relaunch()
    again.agent(2)
    again.agent(1)
    second = again.finish(timeout)
    checks = {
        "exit 2 on both": first["exit"] == [2, 2],
        "one line naming the path": all(len(x["lines"]) == 1 for x in named),
        "no traceback": not any(x["traceback"] for x in named),
        "not retried": all("not restarting after an input error" in o for o in outs),
        "relaunch finishes": second["exit"] == [0, 0],
        "digests right": fi.digests_ok(
            again.dump, {k: {"digest": d} for k, d in ref.items()}, 1, STEPS
        )
        is None,
    }
    return {"exit": first["exit"], "relaunch_exit": second["exit"],
            "lines": [x["lines"] for x in named], "checks": checks}  # fmt: skip


def dump_folder_readonly(out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    """The dump folder is made read-only after the first checkpoint and stays so to the
    end: the lock's renewal fails (the monitor says so once and keeps beating, so no
    rank is taken for hung), training and its checkpoints (in their subfolder, which
    exists by then) go on, and the lock that cannot be removed at the end does not
    fail the finished run."""
    steps = 30
    run = Run(out / "dump_folder_readonly", {"training.steps": steps, "job.heartbeat_timeout_s": 8})
    job = run.agent(2, elastic=False)
    if not run.wait_step(INTERVAL + 1, timeout):
        return {**run.finish(5), "problem": f"no step {INTERVAL + 1}"}
    with immutable(run.dump):
        result = run.finish(timeout)
    text = job.output()
    checks = {
        "finished (exit 0)": result["exit"] == [0],
        "renewal error said once": text.count("monitor: ") == 1,
        "release did not fail the run": "could not remove the dump-folder lock" in text,
        "no hang reported": "sent no heartbeat" not in text,
        "digests right": fi.digests_ok(
            run.dump, {k: {"digest": d} for k, d in ref.items()}, 1, steps
        )
        is None,
    }
    return {**result, "checks": checks}


def run_scenario(name: str, out: Path, ref: dict[int, str], timeout: float) -> dict[str, Any]:
    if name == "ctrl_c_twice":
        return ctrl_c(out, ref, timeout, twice=True)
    fn: Callable[[Path, dict[int, str], float], dict[str, Any]] = globals()[name]
    return fn(out, ref, timeout)


def verdict(name: str, r: dict[str, Any]) -> str:
    """'ok' or what went wrong."""
    if r.get("problem"):
        return r["problem"]
    bad = []
    if r.get("orphans"):
        bad.append(f"{r['orphans']} orphan(s)")
    if "checks" in r:
        bad += [what for what, ok in r["checks"].items() if not ok]
        return "; ".join(bad) or "ok"
    if name == "divergence":
        if r["exit"] != [2] or not r["names_finite"] or r["traceback"]:
            bad.append("no clean divergence stop")
        return "; ".join(bad) or "ok"
    if name == "ctrl_c_twice":
        if r["exit"] != [3] or not r["stopped_at_once"] or r["traceback"]:
            bad.append("not stopped at once")
        return "; ".join(bad) or "ok"
    if name in ("input_error", "idle_share_refused"):
        if r["exit"] != [2, 2] or not r["not_retried"] or r["failure_restarts"] or r["traceback"]:
            bad.append("an input error was retried or reported unclearly")
        if name == "idle_share_refused" and not r["names_share"]:
            bad.append("the refusal does not name the allowed share")
        return "; ".join(bad) or "ok"
    if not r.get("digests_ok"):
        bad.append(f"WRONG DATA: {r.get('digest_problem')}")
    before, after = SIZES[name]
    if r.get("world_before") != before or r.get("world_after", [])[-1:] != [after]:
        bad.append(
            f"sizes {r.get('world_before')} -> {r.get('world_after')}, not {before} -> {after}"
        )
    elif after not in r.get("resumed_on", []):
        bad.append(f"no resume logged on {after} data-parallel ranks")
    if r.get("recovery_s") is None or r["recovery_s"] > r["bound_s"]:
        bad.append(f"recovery {r.get('recovery_s')} s > bound {r['bound_s']} s")
    if name in ("sigterm_all_ranks", "ctrl_c"):
        if r.get("steps_lost") != 0 or set(r["exit"]) != {3}:
            bad.append(f"lost {r.get('steps_lost')} step(s), exit {r['exit']}")
    elif (r.get("steps_lost") or 0) > INTERVAL:
        bad.append(f"lost {r['steps_lost']} > {INTERVAL} steps")
    return "; ".join(bad) or "ok"


def _world(r: dict[str, Any]) -> str:
    """'4 -> 3': processes when the fault hit, then each size the job formed at."""
    sizes = [r.get("world_before"), *r.get("world_after", [])]
    return " -> ".join(str(n) for n in sizes if n is not None) or "-"


def table(doc: dict[str, Any]) -> str:
    rows = [
        "| scenario | result | processes | exit | resumed from | steps lost | "
        "fault to next step (s) | bound (s) | orphans |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["results"].items():
        cells = [
            name,
            r["verdict"],
            _world(r),
            " ".join(str(c) for c in r.get("exit", [])),
            str(r.get("resumed_from", "-")),
            str(r.get("steps_lost", "-")),
            str(r.get("recovery_s", "-")),
            f"{r['bound_s']:.0f}" if "bound_s" in r else "-",
            str(r.get("orphans", "-")),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report(doc: dict[str, Any]) -> str:
    return (
        "# Elastic scenarios\n\n"
        f"`.venv/bin/python {doc['command']}`: the debug model, {doc['steps']} steps, a "
        f"checkpoint every {doc['interval']} steps, `run_train.sh` agents on a loopback "
        f"rendezvous (keep-alive {doc['keep_alive_s']} s x {doc['keep_alive_attempts']}, last "
        f"call {doc['last_call_s']} s), {doc['wall_s']:.0f} s in all on a shared 2-core "
        "machine. Generated from `elastic_scenarios.json` (`--render`). The bound is "
        "detection + keep-alive expiry + last call + a startup allowance of "
        f"{doc['startup_s']:.0f} s (twice for two faults). Processes: the world size when the "
        "fault hit, then each size the job formed at after it (the last one finished the "
        "run); 8 lanes over 3 processes pad 2 of 18 rows per step.\n\n" + table(doc) + "\n"
    )


def quoted_summary(doc: dict[str, Any]) -> str:
    """The copy of the results QUOTED_IN quotes: the time taken and the table."""
    return f"Here ({doc['wall_s']:.0f} s in all):\n\n" + table(doc) + "\n"


def render(path: Path) -> int:
    """The page beside a results JSON and, for the committed one, the copy in QUOTED_IN."""
    code = render_results(path, report)
    if code == 0 and path.resolve() == RESULTS.resolve():
        quote_in_page(QUOTED_IN, "elastic_scenarios", quoted_summary(json.loads(path.read_text())))
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "elastic_scenarios")
    p.add_argument("--results", type=Path, default=REPO / "docs" / "results")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    p.add_argument("--run-timeout", type=float, default=420, help="seconds per run")
    p.add_argument("--render", type=Path, default=None, help="no runs: JSON -> .md")
    p.add_argument(
        "--update", action="store_true",
        help="merge these scenarios' results into the existing JSON (a rerun of a few)",
    )  # fmt: skip
    a = p.parse_args(argv)
    if a.render is not None:
        return render(a.render)
    names = pick_scenarios(p, a.scenarios, SCENARIOS)
    ensure_sample_data()
    ref = data_digests(
        LONG_STEPS, int(fi.BASE["training.seq_len"]), int(fi.BASE["training.global_batch_size"])
    )
    t0 = time.monotonic()
    results = {}
    for name in names:
        t = time.monotonic()
        r = run_scenario(name, a.out.resolve(), ref, a.run_timeout)
        r["verdict"] = verdict(name, r)
        r["seconds"] = round(time.monotonic() - t, 1)
        results[name] = r
        print(f"{name}: {r['verdict']} ({time.monotonic() - t:.0f}s)", flush=True)
    path = a.results / "elastic_scenarios.json"
    if a.update and path.is_file():  # rerun scenarios replace theirs; the others stay
        results = {**json.loads(path.read_text())["results"], **results}
        names = [n for n in SCENARIOS if n in results]
    doc = {
        "command": "scripts/experiments/elastic_scenarios.py --scenarios " + ",".join(names),
        "steps": STEPS, "interval": INTERVAL, "keep_alive_s": KEEP_ALIVE_S,
        "keep_alive_attempts": KEEP_ALIVE_ATTEMPTS, "last_call_s": LAST_CALL_S,
        "startup_s": STARTUP_S,
        "wall_s": round(sum(r.get("seconds", 0) for r in results.values()) if a.update
                        else time.monotonic() - t0, 1),
        "results": results,
    }  # fmt: skip
    a.results.mkdir(parents=True, exist_ok=True)
    # The runs' messages name their dump folders: keep the results free of this machine's paths.
    path.write_text(json.dumps(doc, indent=1).replace(f"{REPO}/", "") + "\n")
    render(path)
    return 0 if all(r["verdict"] == "ok" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
