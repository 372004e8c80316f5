"""Training jobs launched the way a user launches them, for the experiments that
break them (scripts/experiments/fault_injection.py, elastic_scenarios.py, soak.py,
preempt_save_time.py) and the tests of their scenarios: one `run_train.sh` launch
(`Job`) with the fault experiments' small settings (`BASE`), and what its dump
folder shows (`steps_logged`, `digests_ok`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.train import REPO, read_metrics

STEPS, INTERVAL = 8, 2
BASE = {
    "training.seq_len": 64,
    "training.global_batch_size": 16,
    "training.local_batch_size": 2,
    "training.steps": STEPS,
    "checkpoint.interval": INTERVAL,
    "lr_scheduler.warmup_steps": 2,
    "data.log_batch_digests": "true",
}


def _args(fields: dict[str, Any]) -> list[str]:
    out = []
    for k, v in fields.items():
        out += [f"--{k}", str(v)]
    return out


class Job:
    """One `run_train.sh` launch in its own session, output to a log file; `env`
    adds launch settings (NNODES, RDZV_ENDPOINT...), `name` prefixes the log."""

    def __init__(
        self,
        dump: Path,
        extra: dict[str, Any] | None = None,
        nproc: int = 2,
        env: dict[str, str] | None = None,
        name: str = "run",
    ):
        dump.mkdir(parents=True, exist_ok=True)
        self.dump, self.log = dump, dump / f"{name}-{time.time_ns()}.log"
        env = {**os.environ, "NGPU": str(nproc), "CUDA_VISIBLE_DEVICES": "", **(env or {})}
        args = _args({**BASE, **(extra or {}), "job.dump_folder": dump})
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(
            ["bash", str(REPO / "run_train.sh"), *args],
            cwd=REPO,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started = time.monotonic()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self._out.flush()

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def tree(self) -> list[int]:
        """The launcher and all its descendants (ranks run in their own sessions)."""
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
        out, todo = [], [self.proc.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += children.get(p, [])
        return out

    def rank_pid(self, rank: int) -> int | None:
        for pid in self.tree():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b"".join(env):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"torchtitan.train" in cmd:
                    return pid
        return None

    def kill9(self) -> None:
        for pid in self.tree():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.wait(30)


def kill_together(jobs: list[Job]) -> float:
    """SIGKILL every process of these launches at once (a lost node or replica group,
    all its processes in the same instant), then reap them; the time it was sent."""
    trees = [job.tree() for job in jobs]
    t = time.time()
    for pid in (p for tree in trees for p in tree):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for job in jobs:
        job.wait(30)
    return t


def wait_for(cond: Callable[[], bool], job: Job, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        if job.proc.poll() is not None:
            return cond()
        time.sleep(0.02)
    return False


def steps_logged(dump: Path) -> int:
    return max(read_metrics(dump), default=0) if (dump / "metrics.jsonl").exists() else 0


def digests_ok(
    dump: Path, ref: dict[int, dict[str, Any]], first: int = 1, last: int = STEPS
) -> str | None:
    """None if every step `first`..`last` has the reference digest, once; else why not."""
    lines = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r["step"] for r in lines if r["step"] >= first]
    if sorted(steps) != list(range(first, last + 1)):
        return f"metrics.jsonl steps {steps}"
    got = {r["step"]: r["digest"] for r in lines}
    bad = [s for s in range(first, last + 1) if got[s] != ref[s]["digest"]]
    return f"digests differ at steps {bad}" if bad else None
