"""Live recovery, measured: replica groups under torchft's lighthouse lose groups and
get them back, and every step's global batch stays the one of a run without faults.

    .venv/bin/python scripts/experiments/live_recovery.py            # every scenario, 5 seeds
    .venv/bin/python scripts/experiments/live_recovery.py --seeds 1 --scenarios one_group
    .venv/bin/python scripts/experiments/live_recovery.py --render docs/results/live_recovery.json

Each run: 3 replica groups x 2 processes (FSDP inside a group) on CPU with gloo, the
debug model, 30 steps, the 8 lanes of the sample mix (uneven over 3 groups of 2:
2 + 3 + 3 lanes). Scenarios:
- one_group (one per seed): SIGKILL every process of a random group at a random
  step, start it again after a random delay;
- two_groups: two groups killed at once, both started again;
- all_groups: every group killed: started again, the job resumes from the newest
  DCP checkpoint by the normal path;
- during_heal: a group killed, started again, and another group killed as the
  first one finishes copying its state from a peer.
- lighthouse_restarted (one per seed): the lighthouse killed at a random step and
  started again on its address after a random delay; every group goes on (the
  same processes, exit 0);
- checkpoints: the groups start from an ordinary checkpoint (a run without fault
  tolerance), and a job without it resumes on 1 process from theirs.
Checked for each: every step once in metrics.jsonl with the reference run's global
digest, every loss within 1e-5 relative, at most one step redone per failure, the
surviving groups' processes the same throughout (PIDs), the parameters of every
group equal at the end (their digests), the lanes each group held at each size.
Time lost per failure (kill to the next committed step + steps redone x step time)
is compared with `elastic_scenarios.py`'s kill9_agent, run in the same invocation.
Writes docs/results/live_recovery.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import elastic_scenarios as es

from harness import faults as fi
from harness.train import (
    REPO,
    copy_checkpoint,
    data_digests,
    ensure_sample_data,
    quote_in_page,
    read_metrics,
    render_results,
)
from torchtitan.distributed.utils import free_port

RESULTS = REPO / "docs" / "results" / "live_recovery.json"
# The documentation page whose `<!-- live_recovery:begin/end -->` markers quote the summary.
QUOTED_IN = "README.md"
GROUPS, PROCS, STEPS, INTERVAL = 3, 2, 30, 10
# seq_len 256 (the debug config's own): steps long enough that a group started again
# (a few seconds' delay, then process start and imports on 2 shared cores) rejoins
# well before the end.
SHAPE = {"training.steps": STEPS, "checkpoint.interval": INTERVAL, "training.seq_len": 256}
EXTRA = {
    **SHAPE,
    "fault_tolerance.enable": "true",
    "fault_tolerance.group_count": GROUPS,
}  # every timeout at its default, as a user runs it: the one-group runs (the README's
# figure) and the checkpoint run
HEARTBEAT_MS = 2000  # the lighthouse's default (runtime/lighthouse.py)
# Where two faults meet (groups lost together, or one lost while another heals), a
# peer lost while the quorum's communicator forms is waited for twice the step
# timeout (30 s by default): 8 s here, so that a group started again rejoins within
# the run.
STEP_TIMEOUT_OF = {"two_groups": 8, "all_groups": 8, "during_heal": 8}
# The run with two faults is longer: the group started again after the first must
# rejoin, and the second one after it, before the end (each start takes ~20 s here).
STEPS_OF = {"during_heal": 60}
SCENARIOS = (
    "one_group", "two_groups", "all_groups", "during_heal", "lighthouse_restarted", "checkpoints",
)  # fmt: skip


class Lighthouse:
    """The lighthouse on `port` (0: any free one)."""

    def __init__(self, port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchtitan.runtime.lighthouse", "--port", str(port),
             "--host", "127.0.0.1", "--heartbeat-timeout-ms", str(HEARTBEAT_MS)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.address = line.split("FT_LIGHTHOUSE=")[1].rstrip(")\n")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Groups:
    """The replica groups of one job on one dump folder: start, kill, watch."""

    def __init__(
        self, dump: Path, lighthouse: Lighthouse, steps: int = STEPS, step_timeout: int = 0
    ):
        shutil.rmtree(dump, ignore_errors=True)
        self.dump, self.lighthouse, self.steps = dump, lighthouse, steps
        self.extra = {**EXTRA, "training.steps": steps}
        if step_timeout:
            self.extra["fault_tolerance.step_timeout_s"] = step_timeout
        self.jobs: dict[int, list[fi.Job]] = {}

    def start(self, k: int) -> fi.Job:
        # torchft's chatter in the logs: the checkpoint server's access lines (`copies`)
        env = {"FT_LIGHTHOUSE": self.lighthouse.address, "FT_REPLICA_ID": str(k),
               "TORCHTITAN_FT_DEBUG": "1"}  # fmt: skip
        job = fi.Job(self.dump, self.extra, nproc=PROCS, env=env, name=f"group{k}")
        self.jobs.setdefault(k, []).append(job)
        return job

    def current(self, k: int) -> fi.Job:
        return self.jobs[k][-1]

    def pids(self, k: int) -> list[int | None]:
        return [self.current(k).rank_pid(r) for r in range(PROCS)]

    def kill(self, ks: list[int]) -> float:
        """SIGKILL every process of these groups at once; the time it was sent."""
        return fi.kill_together([self.current(k) for k in ks])

    def records(self) -> dict[int, dict[str, Any]]:
        return read_metrics(self.dump) if (self.dump / "metrics.jsonl").exists() else {}

    def wait_record(self, cond: Any, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond(self.records()):
                return True
            if all(j.proc.poll() is not None for js in self.jobs.values() for j in js[-1:]):
                return cond(self.records())
            time.sleep(0.05)
        return False

    def finish(self, timeout: float) -> dict[int, int | None]:
        codes = {k: js[-1].wait(timeout) for k, js in self.jobs.items()}
        for js in self.jobs.values():
            for j in js:
                if j.proc.poll() is None:
                    j.kill9()
        return codes

    def output(self, k: int) -> str:
        return "\n".join(j.output() for j in self.jobs[k])


def copies(g: Groups, ks: Any) -> int:
    """Copies of the state these groups served to a joining peer so far."""
    return sum(g.current(k).output().count("GET /checkpoint") for k in ks)


def _full(records: dict[int, dict[str, Any]], step: int) -> bool:
    """Every group trained a step at or after `step`."""
    return any(
        s >= step and len(r.get("replica_groups") or []) == GROUPS for s, r in records.items()
    )


def check(g: Groups, ref: dict[int, dict[str, Any]], kills: list[tuple[float, list[int]]],
          survivors: dict[int, list[int | None]], later: dict[int, list[int | None]],
          codes: dict[int, int | None]) -> dict[str, Any]:  # fmt: skip
    records = g.records()
    steps = sorted(records)
    lines = [json.loads(x) for x in (g.dump / "metrics.jsonl").read_text().splitlines() if x]
    logged = [r["step"] for r in lines]
    digests = all(records[s]["digest"] == ref[s]["digest"] for s in steps)
    rel = max(abs(records[s]["loss"] - ref[s]["loss"]) / abs(ref[s]["loss"]) for s in steps)
    text = "\n".join(g.output(k) for k in g.jobs)
    recoveries = sorted(set(re.findall(r"recovery: [^\n]*", text)))
    redone = [int(n) for n in re.findall(r"(\d+) steps? redone", "\n".join(recoveries))]
    params = dict(re.findall(r"replica group (\d+) parameters at step \d+: ([0-9a-f]+)", text))
    held: dict[int, list[int]] = {}
    for r in records.values():
        held.setdefault(len(r["replica_groups"]), r["lanes_per_group"])
    step_time = statistics.median(r["step_time_s"] for r in records.values())
    lost = []
    for t_kill, _ in kills:
        after = [r["time"] for r in records.values() if r["time"] > t_kill]
        if after:
            lost.append(round(min(after) - t_kill + max(redone or [0]) * step_time, 1))
    return {
        "exit": {str(k): c for k, c in codes.items()},
        "steps_once": sorted(logged) == list(range(1, g.steps + 1)),
        "steps_logged": len(set(logged)),
        "digests_ok": digests and steps == list(range(1, g.steps + 1)),
        "max_rel_dloss": rel,
        "recoveries": recoveries,
        "max_redone": max(redone or [0]),
        # Read before the kill and once every group trained again after it.
        "survivors_kept_pids": all(
            later[k] == pids and None not in pids for k, pids in survivors.items()
        ),
        "parameters_equal": len(set(params.values())) == 1 and len(params) == GROUPS,
        # Every group trained together again after the first kill (a group started
        # again after a second one may find the run over: it then loads the final
        # checkpoint, and its parameter digest says so).
        "rejoined": any(
            len(r["replica_groups"]) == GROUPS and r["time"] > kills[0][0] for r in records.values()
        ),
        "lanes_by_groups": {str(n): v for n, v in sorted(held.items())},
        "step_time_s": round(step_time, 3),
        "time_lost_s": lost,
    }


def checkpoints(out: Path, ref_dump: Path, ref: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Checkpoints are ordinary both ways: the 3 groups start from the reference run's
    step-10 checkpoint (no fault tolerance, 2 processes), and a job without fault
    tolerance on 1 process resumes from the groups' step-20 checkpoint."""
    lighthouse = Lighthouse()
    g = Groups(out / "checkpoints-ft", lighthouse)
    try:
        copy_checkpoint(ref_dump, INTERVAL, g.dump)
        for k in range(GROUPS):
            g.start(k)
        codes = g.finish(300)
    finally:
        g.finish(5)
        lighthouse.close()
    got = g.records()
    plain = out / "checkpoints-plain"
    shutil.rmtree(plain, ignore_errors=True)
    copy_checkpoint(g.dump, 2 * INTERVAL, plain)
    job = fi.Job(plain, SHAPE, nproc=1, name="plain")
    code = job.wait(300)
    after = read_metrics(plain)
    text = "\n".join(g.output(k) for k in g.jobs)
    return {
        "exit": {**{str(k): c for k, c in codes.items()}, "plain": code},
        "ft_resumed_from": [int(x) for x in re.findall(r"resumed from step (\d+)", text)][:1],
        "plain_resumed_from": [
            int(x) for x in re.findall(r"resumed from step (\d+)", job.output())
        ],
        "digests_ok": sorted(got) == list(range(INTERVAL + 1, STEPS + 1))
        and sorted(after) == list(range(2 * INTERVAL + 1, STEPS + 1))
        and all(got[s]["digest"] == ref[s]["digest"] for s in got)
        and all(after[s]["digest"] == ref[s]["digest"] for s in after),
        "max_rel_dloss": max(
            abs(r[s]["loss"] - ref[s]["loss"]) / abs(ref[s]["loss"])
            for r in (got, after)
            for s in r
        ),
    }


def scenario(name: str, seed: int, out: Path, ref: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One fault run; `ref`: the reference run of its length (`STEPS_OF`)."""
    rng = random.Random(seed)
    lighthouse = Lighthouse()
    g = Groups(out / f"{name}-{seed}", lighthouse, len(ref), STEP_TIMEOUT_OF.get(name, 0))
    kills: list[tuple[float, list[int]]] = []
    survivors: dict[int, list[int | None]] = {}
    try:
        for k in range(GROUPS):
            g.start(k)
        at = rng.randint(4, 10) if name != "all_groups" else rng.randint(INTERVAL + 2, INTERVAL + 6)
        if not g.wait_record(lambda r: _full(r, at), 300):
            return {"problem": f"the {GROUPS} groups never trained step {at} together"}
        victims = {
            "one_group": [rng.randrange(GROUPS)],
            "two_groups": sorted(rng.sample(range(GROUPS), 2)),
            "all_groups": list(range(GROUPS)),
            "during_heal": [rng.randrange(GROUPS)],
        }[name]
        survivors = {k: g.pids(k) for k in range(GROUPS) if k not in victims}
        kills.append((g.kill(victims), victims))
        delay = round(rng.uniform(1, 5), 1)
        served = copies(g, survivors)
        time.sleep(delay)
        for k in victims:
            g.start(k)
        if name == "during_heal":
            # The second fault: another group, as the first finishes its copy (the
            # peer that served it logs the request).
            second = [rng.choice(sorted(survivors))]
            end = time.monotonic() + 240
            while time.monotonic() < end and copies(g, survivors) <= served:
                time.sleep(0.02)
            survivors.pop(second[0])
            kills.append((g.kill(second), second))
            time.sleep(delay)
            g.start(second[0])
        g.wait_record(lambda r: _full(r, max(r, default=0)) and max(r, default=0) > at + 1, 300)
        later = {k: g.pids(k) for k in survivors}
        result = check(g, ref, kills, survivors, later, g.finish(300))
        return {"seed": seed, "kill_step": at, "victims": [v for _, vs in kills for v in vs],
                "restart_delay_s": delay, **result}  # fmt: skip
    finally:
        g.finish(5)
        lighthouse.close()


def lighthouse_restarted(seed: int, out: Path, ref: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The lighthouse killed (SIGKILL) after a step every group trained, and started
    again on its address 1-5 s later: every group goes on in the same processes."""
    rng = random.Random(seed)
    port = free_port()
    lighthouse = Lighthouse(port)
    g = Groups(out / f"lighthouse-{seed}", lighthouse, len(ref))
    try:
        for k in range(GROUPS):
            g.start(k)
        at = rng.randint(4, 10)
        if not g.wait_record(lambda r: _full(r, at), 300):
            return {"problem": f"the {GROUPS} groups never trained step {at} together"}
        survivors = {k: g.pids(k) for k in range(GROUPS)}
        t_kill = time.time()
        lighthouse.proc.kill()
        lighthouse.proc.wait(10)
        delay = round(rng.uniform(1, 5), 1)
        time.sleep(delay)
        lighthouse = g.lighthouse = Lighthouse(port)
        g.wait_record(lambda r: _full(r, max(r, default=0)) and max(r, default=0) > at + 1, 300)
        later = {k: g.pids(k) for k in survivors}
        result = check(g, ref, [(t_kill, [])], survivors, later, g.finish(300))
        return {"seed": seed, "kill_step": at, "victims": [], "restart_delay_s": delay, **result}
    finally:
        g.finish(5)
        lighthouse.close()


def verdict(r: dict[str, Any]) -> str:
    if r.get("problem"):
        return r["problem"]
    bad = []
    if r["scenario"] == "checkpoints":
        if not r["digests_ok"] or r["max_rel_dloss"] > 1e-5:
            bad.append("WRONG DATA or loss")
        if r["ft_resumed_from"] != [INTERVAL] or r["plain_resumed_from"] != [2 * INTERVAL]:
            bad.append(f"resumed from {r['ft_resumed_from']} / {r['plain_resumed_from']}")
        if any(c != 0 for c in r["exit"].values()):
            bad.append(f"exit {r['exit']}")
        return "; ".join(bad) or "ok"
    if not r["digests_ok"] or not r["steps_once"]:
        bad.append(f"WRONG DATA or steps ({r['steps_logged']} logged)")
    if r["max_rel_dloss"] > 1e-5:
        bad.append(f"loss off by {r['max_rel_dloss']:.2e}")
    if r["max_redone"] > 1:
        bad.append(f"{r['max_redone']} steps redone")
    if not r["rejoined"]:
        bad.append("a group started again never rejoined")
    elif not r["survivors_kept_pids"]:
        bad.append("a survivor restarted")
    if not r["parameters_equal"]:
        bad.append("parameters differ between groups")
    if any(c != 0 for c in r["exit"].values()):
        bad.append(f"exit {r['exit']}")
    return "; ".join(bad) or "ok"


def elastic_comparison(out: Path, timeout: float) -> dict[str, Any]:
    """elastic_scenarios.py's kill9_agent on this machine, now: its time from the kill
    to the next trained step, plus the steps it trained again times its step time."""
    ref = data_digests(
        es.LONG_STEPS, int(fi.BASE["training.seq_len"]), int(fi.BASE["training.global_batch_size"])
    )
    r = es.kill9_agent(out, ref, timeout)
    records = read_metrics(out / "kill9_agent")
    step_time = statistics.median(x["step_time_s"] for x in records.values()) if records else 0.0
    lost = None
    if r.get("recovery_s") is not None:
        lost = round(r["recovery_s"] + (r.get("steps_lost") or 0) * step_time, 1)
    return {"recovery_s": r.get("recovery_s"), "steps_lost": r.get("steps_lost"),
            "step_time_s": round(step_time, 3), "time_lost_s": lost,
            "digests_ok": r.get("digests_ok")}  # fmt: skip


def page(doc: dict[str, Any]) -> str:
    rows = ["| scenario | seed | killed (group ids) | at step | result | steps redone | "
            "lanes by group count | time lost (s) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in doc["runs"]:
        lanes = "; ".join(f"{n}: {v}" for n, v in r.get("lanes_by_groups", {}).items())
        rows.append(
            f"| {r['scenario']} | {r.get('seed', '-')} | {r.get('victims', '-')} | "
            f"{r.get('kill_step', '-')} | {r['verdict']} | {r.get('max_redone', '-')} | "
            f"{lanes or '-'} | {', '.join(str(x) for x in r.get('time_lost_s', [])) or '-'} |"
        )
    e = doc["elastic"]
    ours = [
        x for r in doc["runs"] if r["scenario"] == "one_group" for x in r.get("time_lost_s", [])
    ]
    mean = statistics.mean(ours) if ours else float("nan")
    ratio = mean / e["time_lost_s"] if e.get("time_lost_s") else float("nan")
    return (
        "# Live recovery\n\n"
        f"`.venv/bin/python {doc['command']}`: {GROUPS} replica groups x {PROCS} processes "
        f"(FSDP inside each) under torchft's lighthouse (heartbeat timeout {HEARTBEAT_MS} ms), "
        f"every timeout at its default (step timeout {', '.join(STEP_TIMEOUT_OF)}: "
        f"{max(STEP_TIMEOUT_OF.values())} s, so that a group started again rejoins), "
        f"the debug model, {STEPS} steps ({STEPS_OF['during_heal']} for during_heal), 8 lanes, a checkpoint every {INTERVAL} steps, on a "
        f"shared 2-core machine ({doc['wall_s']:.0f} s in all). Generated from "
        "`live_recovery.json` (`--render`). Time lost: kill to the next committed step, plus "
        "the steps redone times the median step time.\n\n" + "\n".join(rows) + "\n\n"
        f"**Against an elastic restart**, in the same invocation (`elastic_scenarios.py` "
        f"kill9_agent: 4 processes, one killed, the job restarts at 3 from its checkpoint): "
        f"{e.get('time_lost_s')} s lost ({e.get('recovery_s')} s to the next step + "
        f"{e.get('steps_lost')} steps trained again x {e.get('step_time_s')} s). A lost group "
        f"here: {mean:.1f} s on average over the one-group runs, **{ratio:.2f}x** of it.\n"
    )


def summary(doc: dict[str, Any]) -> str:
    """The table README.md quotes (between its live_recovery markers)."""
    runs, e = doc["runs"], doc["elastic"]
    ours = [x for r in runs if r["scenario"] == "one_group" for x in r.get("time_lost_s", [])]
    ok = sum(r["verdict"] == "ok" for r in runs)
    mean = statistics.mean(ours) if ours else float("nan")
    lost = e.get("time_lost_s")
    ratio = f"{mean / lost:.2f}x" if lost else "-"
    return (
        f"Measured by `scripts/experiments/live_recovery.py` ({ok} of {len(runs)} fault runs "
        "with every digest and loss right; "
        "[live_recovery](docs/results/live_recovery.md)):\n\n"
        "| one replica group of 3 lost (kill -9) | live recovery | elastic restart |\n"
        "|---|---|---|\n"
        f"| time lost per failure (s) | {mean:.1f} | {lost if lost is not None else '-'} |\n"
        f"| steps trained again | at most {max((r.get('max_redone', 0) for r in runs), default=0)} "
        f"| {e.get('steps_lost', '-')} |\n"
        f"| live recovery / elastic | {ratio} | |\n"
    )


def render(path: Path) -> int:
    """The page beside a results JSON and, for the committed one, README.md's table."""
    code = render_results(path, page)
    if code == 0 and path.resolve() == RESULTS.resolve():
        quote_in_page(QUOTED_IN, "live_recovery", summary(json.loads(path.read_text())))
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "live_recovery")
    p.add_argument("--results", type=Path, default=REPO / "docs" / "results")
    p.add_argument(
        "--seeds",
        type=int,
        default=5,
        help="one_group and lighthouse_restarted runs (one per seed)",
    )
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--no-elastic", action="store_true", help="skip the elastic comparison")
    p.add_argument("--render", type=Path, default=None, help="no runs: JSON -> .md")
    p.add_argument(
        "--update", action="store_true", help="replace only these scenarios' runs in the JSON"
    )
    a = p.parse_args(argv)
    if a.render is not None:
        return render(a.render)
    ensure_sample_data()
    t0 = time.monotonic()
    out = a.out.resolve()
    names = [s for s in a.scenarios.split(",") if s]
    refs: dict[int, dict[int, dict[str, Any]]] = {}  # steps -> its reference run
    for steps in sorted({STEPS_OF.get(n, STEPS) for n in names}):
        shutil.rmtree(out / f"reference-{steps}", ignore_errors=True)
        ref_job = fi.Job(out / f"reference-{steps}", {**SHAPE, "training.steps": steps}, nproc=2)
        if ref_job.wait(900) != 0:
            print(ref_job.output()[-3000:], file=sys.stderr)
            return 1
        refs[steps] = read_metrics(out / f"reference-{steps}")
    ref_dump, ref = out / f"reference-{STEPS}", refs.get(STEPS, {})
    runs: list[dict[str, Any]] = []
    path = a.results / "live_recovery.json"
    if a.update and path.is_file():  # keep the runs of the scenarios not run now
        old = json.loads(path.read_text())
        runs = [r for r in old["runs"] if r["scenario"] not in a.scenarios.split(",")]
    for name in names:
        for seed in range(a.seeds if name in ("one_group", "lighthouse_restarted") else 1):
            t = time.monotonic()
            if name == "checkpoints":
                r = {"scenario": name, **checkpoints(out, ref_dump, ref)}
            elif name == "lighthouse_restarted":
                r = {"scenario": name, "steps": STEPS, **lighthouse_restarted(seed, out, ref)}
            else:
                steps = STEPS_OF.get(name, STEPS)
                r = {"scenario": name, "steps": steps, **scenario(name, seed, out, refs[steps])}
            r["verdict"] = verdict(r)
            r["seconds"] = round(time.monotonic() - t, 1)
            runs.append(r)
            print(f"{name} seed {seed}: {r['verdict']} ({r['seconds']:.0f}s)", flush=True)
    elastic = {} if a.no_elastic else elastic_comparison(out / "elastic", 420)
    if a.update and a.no_elastic and path.is_file():
        elastic = json.loads(path.read_text())["elastic"]
    runs.sort(key=lambda r: (SCENARIOS.index(r["scenario"]), r.get("seed", 0)))
    doc = {
        "command": "scripts/experiments/live_recovery.py "
        + " ".join(x for x in (argv or sys.argv[1:])),
        "wall_s": round(time.monotonic() - t0, 1),
        "runs": runs,
        "elastic": elastic,
    }
    a.results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1).replace(f"{REPO}/", "") + "\n")
    render(path)
    return 0 if all(r["verdict"] == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
