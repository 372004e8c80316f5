#!/usr/bin/env python
"""A week alone, compressed: one job under a seeded schedule of faults for an hour.

    .venv/bin/python scripts/experiments/soak.py                       # 60 minutes, 16 faults, seed 0
    .venv/bin/python scripts/experiments/soak.py --minutes 8 --faults 3   # a quick look
    .venv/bin/python scripts/experiments/soak.py --render docs/results/soak.json
    .venv/bin/python scripts/experiments/soak.py --mode live   # replica groups: soak_live.py

Three `run_train.sh` agents of one process each (NNODES=1:3, an etcd-v2 rendezvous on
an etcd server this script starts on 127.0.0.1, so no node is special; MAX_RESTARTS=3
per RESTART_WINDOW=600 s) train the debug model on the sample recipe's 8 lanes with a
checkpoint every 10 steps. The script plays the cluster and its scheduler: at seeded
moments it injects one fault of each kind in turn (seeded order):
- agent_lost_rejoins: kill -9 of every process of a node other than the first; the
  node comes back after a seeded delay (a join, never counted);
- agent_lost: the same, and the node stays away until the next fault;
- first_node_lost: every process of the node that started first (etcd: survived);
- sigterm / sigusr1: the signal to every launcher (a scheduler's preemption warning);
- double_sigterm_rank: SIGTERM twice, 0.2 s apart, to one rank;
- checkpoint_readonly: the checkpoint folder cannot be written across a save, then
  can again;
- dump_readonly: the dump folder is read-only for 40 s (the lock cannot be renewed);
- stale_lock: a stopped job's requeue finds a lock left by a dead process.
The job is relaunched only where its launchers' exit statuses say a scheduler would
requeue (all `PREEMPT_EXIT_CODE`, 3); after a storage error (exit 2) the script, as
the operator, makes the folder writable and relaunches (listed as such). At the end
it stops the job with SIGTERM and checks: every step 1..N in metrics.jsonl once,
with the global-batch digest the data gives (a one-rank loader), every complete
checkpoint verifies against its manifest, and for each fault: the seconds to the next
trained step, the steps trained again, the exits and relaunches. Time lost: recovery
plus steps trained again times the median step time, as a share of the run. Writes
soak.json and soak.md (generated from the JSON) under --results.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
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
    read_metrics,
    render_results,
)
from torchtitan.components.checkpoint import CheckpointError, manifest

KINDS = (
    "agent_lost_rejoins",
    "agent_lost",
    "first_node_lost",
    "sigterm",
    "sigusr1",
    "double_sigterm_rank",
    "checkpoint_readonly",
    "dump_readonly",
    "stale_lock",
)
REQUEUE = 3  # PREEMPT_EXIT_CODE: what a scheduler requeues on
INTERVAL = 10
SETTINGS = {"training.steps": 100_000, "checkpoint.interval": INTERVAL,
            "checkpoint.keep_latest_k": 3, "lr_scheduler.warmup_steps": 10,
            "metrics.log_freq": 1}  # fmt: skip
RDZV_CONF = (
    "join_timeout=300,last_call_timeout=3,close_timeout=10,heartbeat=5,"
    "keep_alive_interval=1,keep_alive_max_attempt=3"
)


def parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


class Cluster:
    """Three nodes of one process each, as a scheduler sees them: launch, kill, signal."""

    def __init__(self, dump: Path, endpoint: str):
        self.dump, self.endpoint = dump, endpoint
        self.nodes: dict[int, fi.Job | None] = {0: None, 1: None, 2: None}
        self.started: dict[int, float] = {}
        self.logs: list[Path] = []
        # (time, highest step in metrics.jsonl), polled: a resume rewrites the file, so
        # the steps trained before a fault are known only from this history.
        self.generation = 0  # a relaunch is a new job to the scheduler: a new rendezvous id
        self.history: list[tuple[float, int]] = []
        self.stopped_at: float | None = None  # when a job-ending fault's launchers exited
        self._done = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._done.wait(0.5):
            try:
                self.history.append((time.time(), steps_now(self.dump)))
            except (OSError, ValueError):
                continue  # the file was being rewritten

    def highest_between(self, t0: float, t1: float) -> int:
        return max((s for t, s in self.history if t0 <= t <= t1), default=0)

    def close(self) -> None:
        self._done.set()
        self._poller.join()

    def env(self) -> dict[str, str]:
        # etcd keeps a rendezvous that ended closed: a relaunch needs its own id (as a
        # requeued SLURM job gets with SLURM_RESTART_COUNT, run_train.sh).
        return {"NNODES": "1:3", "RDZV_BACKEND": "etcd-v2", "RDZV_ENDPOINT": self.endpoint,
                "RDZV_ID": f"soak-{self.generation}", "RDZV_CONF": RDZV_CONF,
                "MAX_RESTARTS": "3", "RESTART_WINDOW": "600",
                "MONITOR_INTERVAL": "0.5"}  # fmt: skip

    def launch(self, node: int) -> None:
        job = fi.Job(self.dump, SETTINGS, 1, self.env(), name=f"node{node}")
        self.nodes[node], self.started[node] = job, time.time()
        self.logs.append(job.log)

    def launch_all(self) -> None:
        """The whole job launched anew (a requeue)."""
        self.generation += 1
        for node in self.nodes:
            self.launch(node)

    def alive(self) -> list[int]:
        return [n for n, j in self.nodes.items() if j is not None and j.proc.poll() is None]

    def first(self) -> int:
        return min(self.alive(), key=lambda n: self.started[n])

    def kill(self, node: int) -> None:
        job = self.nodes[node]
        assert job is not None
        job.kill9()
        job.wait(30)
        self.nodes[node] = None

    def ranks(self, nodes: list[int] | None = None) -> list[int]:
        """The pids of the trainer processes of the nodes alive now (or of `nodes`)."""
        out = []
        for n in self.alive() if nodes is None else nodes:
            job = self.nodes[n]
            for pid in job.tree() if job is not None else []:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"torchtitan.train" in cmd and b"torch.distributed.run" not in cmd:
                    out.append(pid)
        # A trainer's own children (a fork inherits its command line) are not ranks.
        return [pid for pid in out if parent(pid) not in out]

    def wait_all(self, timeout: float) -> list[int | None]:
        codes = []
        for job in self.nodes.values():
            codes.append(job.wait(timeout) if job is not None else None)
        return codes

    def output_since(self, offsets: dict[Path, int]) -> str:
        text = []
        for log in self.logs:
            data = log.read_text(errors="replace")
            text.append(data[offsets.get(log, 0) :])
        return "\n".join(text)

    def offsets(self) -> dict[Path, int]:
        return {log: len(log.read_text(errors="replace")) for log in self.logs}


def steps_now(dump: Path) -> int:
    return fi.steps_logged(dump)


def wait_healthy(cluster: Cluster, since_step: int, timeout: float) -> bool:
    """Three nodes alive and a step trained past `since_step` by the job they form."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if len(cluster.alive()) == 3 and steps_now(cluster.dump) > since_step + 2:
            return True
        time.sleep(0.5)
    return False


def next_step_after(dump: Path, t: float, timeout: float) -> dict[str, Any] | None:
    """The first metrics record written after time t (the next trained step)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        later = [r for r in read_metrics(dump).values() if r["time"] > t]
        if later:
            return min(later, key=lambda r: r["time"])
        time.sleep(0.5)
    return None


def requeue_or_operator(cluster: Cluster, kind: str, timeout: float) -> dict[str, Any]:
    """Wait for every launcher; relaunch when they all say requeue (or, for a storage
    error the operator fixed, exit 2)."""
    codes = cluster.wait_all(timeout)
    cluster.stopped_at = time.time()
    live = [c for c in codes if c is not None]
    out: dict[str, Any] = {"exits": codes}
    if live and all(c == REQUEUE for c in live):
        out["relaunched_by"] = "scheduler (exit 3)"
    elif kind == "checkpoint_readonly" and live and all(c == 2 for c in live):
        out["relaunched_by"] = "operator (storage error, exit 2)"
    else:
        out["relaunched_by"] = None
        return out
    if kind == "stale_lock":  # a lock left by a process that no longer runs
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = {"host": os.uname().nodename, "pid": dead.pid, "proc_start": "1",
                 "started": "then", "run_id": "an-old-job", "renewed": time.time(),
                 "lease_s": 60}  # fmt: skip
        (cluster.dump / "LOCK.json").write_text(json.dumps(stale))
    cluster.launch_all()
    return out


def inject(cluster: Cluster, kind: str, rng: random.Random, timeout: float) -> dict[str, Any]:
    """One fault; returns what happened (exits, relaunch) once the job trains again."""
    dump = cluster.dump
    rec: dict[str, Any] = {"kind": kind}
    if kind in ("agent_lost_rejoins", "agent_lost", "first_node_lost"):
        first = cluster.first()
        victim = (
            first
            if kind == "first_node_lost"
            else rng.choice([n for n in cluster.alive() if n != first])
        )
        rec["node"] = victim
        cluster.kill(victim)
        if kind != "agent_lost":
            time.sleep(rng.uniform(5, 20))
            cluster.launch(victim)
        return rec
    if kind in ("sigterm", "stale_lock"):
        for n in cluster.alive():
            job = cluster.nodes[n]
            assert job is not None
            os.kill(job.proc.pid, signal.SIGTERM)
        return {**rec, **requeue_or_operator(cluster, kind, timeout)}
    if kind == "sigusr1":
        for pid in cluster.ranks():
            os.kill(pid, signal.SIGUSR1)
        return {**rec, **requeue_or_operator(cluster, kind, timeout)}
    if kind == "double_sigterm_rank":
        # One node's rank is stopped at once (exit 3); the others go on elastically,
        # so the scheduler requeues that node alone, as it would a preempted node.
        node = rng.choice(cluster.alive())
        (pid,) = cluster.ranks([node])
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        job = cluster.nodes[node]
        assert job is not None
        code = job.wait(timeout)
        # The step in flight still completes on every rank: recovery counts from the exit.
        cluster.stopped_at = time.time()
        rec.update(node=node, exits=[code])
        if cluster.alive():
            rec["relaunched_by"] = "scheduler (exit 3, this node)" if code == REQUEUE else None
            if code == REQUEUE:
                cluster.launch(node)
            return rec
        return {**rec, **requeue_or_operator(cluster, kind, timeout)}
    if kind == "checkpoint_readonly":
        folder = dump / "checkpoint"
        with immutable(folder):  # read-only across the next save: the job stops, exit 2
            codes = cluster.wait_all(timeout)
        cluster.stopped_at = time.time()
        rec["exits"] = codes
        if codes and all(c == 2 for c in codes if c is not None):
            rec["relaunched_by"] = "operator (storage error, exit 2)"
            cluster.launch_all()
        else:
            rec["relaunched_by"] = None
        return rec
    if kind == "dump_readonly":
        with immutable(dump):
            time.sleep(40)
        rec["alive_after"] = len(cluster.alive())
        return rec
    raise ValueError(kind)


def verify_checkpoints(dump: Path) -> dict[str, Any]:
    folder = dump / "checkpoint"
    steps = manifest.marked_steps(str(folder))
    bad = {}
    for s in steps:
        try:
            manifest.verify_step_dir(str(folder / f"step-{s}"), "full")
        except CheckpointError as exc:
            bad[s] = str(exc)
    return {"complete": steps, "not_verified": bad}


def run(a: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(a.seed)
    chosen = a.kinds.split(",") if a.kinds else list(KINDS)
    unknown = sorted(set(chosen) - set(KINDS))
    if unknown:
        raise SystemExit(f"--kinds: unknown {unknown}; expected some of {', '.join(KINDS)}")
    kinds = chosen * (a.faults // len(chosen) + 1)
    kinds = kinds[: a.faults]
    rng.shuffle(kinds)
    out = a.out.resolve()
    dump = out / "job"
    subprocess.run(["chattr", "-R", "-i", str(out)], capture_output=True)
    ensure_sample_data()
    t0 = time.time()
    faults: list[dict[str, Any]] = []
    with etcd_server(out / "etcd") as endpoint:
        if dump.exists():
            subprocess.run(["rm", "-rf", str(dump)], check=True)
        cluster = Cluster(dump, endpoint)
        cluster.launch_all()
        period = a.minutes * 60 / (len(kinds) + 1)
        for i, kind in enumerate(kinds):
            at = t0 + (i + 1) * period + rng.uniform(-0.2, 0.2) * period
            for n in [n for n, j in cluster.nodes.items() if j is None]:
                cluster.launch(n)  # a node that stayed away comes back (a join)
            healthy = wait_healthy(cluster, steps_now(dump), a.run_timeout)
            time.sleep(max(0.0, at - time.time()))
            t_fault = time.time()
            cluster.stopped_at = None
            rec = inject(cluster, kind, rng, a.run_timeout)
            # Training stopped at the fault, or (a job-ending fault) when the launchers
            # exited: the job may train on until its next save finds the folder read-only.
            t_stop = cluster.stopped_at or t_fault
            nxt = next_step_after(dump, t_stop, a.run_timeout)
            t_next = nxt["time"] if nxt else time.time()
            trained = cluster.highest_between(t_fault - 1, t_next)
            rec.update(
                at_s=round(t_fault - t0, 1),
                healthy_before=healthy,
                steps_trained_before=trained,
                next_step=nxt["step"] if nxt else None,
                recovery_s=round(t_next - t_stop, 1) if nxt else None,
                fault_to_next_step_s=round(t_next - t_fault, 1) if nxt else None,
                steps_redone=max(trained - (nxt["step"] - 1), 0) if nxt else None,
            )
            faults.append(rec)
            print(f"[soak] {i + 1}/{len(kinds)} {kind}: {json.dumps(rec)}", flush=True)
            if nxt is None:
                break
        # The soak lasts at least --minutes: the job trains on after the last fault.
        time.sleep(max(0.0, t0 + a.minutes * 60 - time.time()))
        # The end of the soak: a node that stayed away comes back, then a preemption
        # warning to every launcher; the job saves.
        for n in [n for n, j in cluster.nodes.items() if j is None]:
            cluster.launch(n)
        wait_healthy(cluster, steps_now(dump), a.run_timeout)
        for n in cluster.alive():
            job = cluster.nodes[n]
            assert job is not None
            os.kill(job.proc.pid, signal.SIGTERM)
        final = cluster.wait_all(a.run_timeout)
        cluster.close()
    wall = time.time() - t0
    records = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines() if x]
    last = max(r["step"] for r in records)
    ref = data_digests(
        last, int(fi.BASE["training.seq_len"]), int(fi.BASE["training.global_batch_size"])
    )
    steps = [r["step"] for r in records]
    wrong = [r["step"] for r in records if r["digest"] != ref[r["step"]]]
    step_times = [r["step_time_s"] for r in records if "step_time_s" in r]
    step_s = statistics.median(step_times) if step_times else 0.0
    lost = [
        (f["recovery_s"] or 0) + (f["steps_redone"] or 0) * step_s
        for f in faults
        if f.get("recovery_s") is not None
    ]
    return {
        "command": f"scripts/experiments/soak.py --minutes {a.minutes:g} --faults {a.faults} --seed {a.seed}",
        "seed": a.seed, "minutes": a.minutes, "wall_s": round(wall, 1),
        "steps": last, "each_step_once": sorted(steps) == list(range(1, last + 1)),
        "wrong_digests": wrong, "median_step_s": round(step_s, 3),
        "final_exits": final, "checkpoints": verify_checkpoints(dump), "faults": faults,
        "time_lost_s": round(sum(lost), 1), "time_lost_share": round(sum(lost) / wall, 4),
    }  # fmt: skip


def data_problems(doc: dict[str, Any]) -> list[str]:
    """What the job's records say against the data: each step once, the data's digest."""
    bad = []
    if not doc["each_step_once"]:
        bad.append("a step is missing or logged twice")
    if doc["wrong_digests"]:
        bad.append(f"WRONG DATA at steps {doc['wrong_digests'][:10]}")
    return bad


def verdict(doc: dict[str, Any]) -> list[str]:
    bad = data_problems(doc)
    if doc["checkpoints"]["not_verified"]:
        bad.append(f"checkpoints that do not verify: {sorted(doc['checkpoints']['not_verified'])}")
    for f in doc["faults"]:
        if f.get("next_step") is None:
            bad.append(f"{f['kind']} at {f['at_s']} s: the job did not train again")
    return bad


def report(doc: dict[str, Any]) -> str:
    rows = [
        "| # | at (s) | fault | exits | relaunched by | next step | steps redone | stop to next "
        "step (s) | fault to next step (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, f in enumerate(doc["faults"], 1):
        exits = " ".join("-" if c is None else str(c) for c in f.get("exits", [])) or "-"
        who = f.get("relaunched_by") or "-"
        rows.append(
            f"| {i} | {f['at_s']:.0f} | {f['kind']} | {exits} | {who} | {f.get('next_step')} | "
            f"{f.get('steps_redone')} | {f.get('recovery_s')} | {f.get('fault_to_next_step_s')} |"
        )
    problems = verdict(doc)
    ck = doc["checkpoints"]
    return (
        "# Soak: one job under a seeded schedule of faults\n\n"
        f"`.venv/bin/python {doc['command']}` on a shared 2-core machine: "
        f"{doc['wall_s'] / 60:.1f} minutes, {len(doc['faults'])} faults, {doc['steps']} steps "
        f"(median step {doc['median_step_s']} s). Generated from `soak.json` (`--render`).\n\n"
        f"- Every step 1..{doc['steps']} logged once: {doc['each_step_once']}; digests "
        f"different from the data's: {len(doc['wrong_digests'])}.\n"
        f"- Complete checkpoints: {len(ck['complete'])}, all verify: {not ck['not_verified']}.\n"
        f"- Time lost (recovery + steps redone x median step time): {doc['time_lost_s']:.0f} s, "
        f"{100 * doc['time_lost_share']:.1f}% of the run.\n"
        f"- Verdict: {'ok' if not problems else '; '.join(problems)}.\n\n" + "\n".join(rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--mode", choices=("elastic", "live"), default="elastic",
        help="elastic: one job of 3 agents (this page); live: 3 replica groups under a "
        "lighthouse (soak_live.py)",
    )  # fmt: skip
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--faults", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default="", help="comma-separated subset of the fault kinds")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "soak")
    p.add_argument("--results", type=Path, default=REPO / "docs" / "results")
    p.add_argument("--run-timeout", type=float, default=600)
    p.add_argument("--steps", type=int, default=0, help="live: training.steps (0: from --minutes)")
    p.add_argument("--render", type=Path, default=None, help="no run: JSON -> .md")
    a = p.parse_args(argv)
    if a.render is not None:
        live = a.render.name.startswith("soak_live")
        if live:
            import soak_live

        return render_results(a.render, soak_live.report if live else report)
    if a.mode == "live":
        import soak_live

        return soak_live.main(a)
    return publish(a, "soak", run(a), report, verdict)


def publish(
    a: argparse.Namespace,
    name: str,
    doc: dict[str, Any],
    page: Callable[[dict[str, Any]], str],
    problems: Callable[[dict[str, Any]], list[str]],
) -> int:
    """Write `name`.json and its page under --results; exit 1 if the verdict has problems."""
    a.results.mkdir(parents=True, exist_ok=True)
    path = a.results / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1).replace(f"{REPO}/", "") + "\n")
    render_results(path, page)
    print(page(doc))
    return 0 if not problems(doc) else 1


if __name__ == "__main__":
    sys.exit(main())
