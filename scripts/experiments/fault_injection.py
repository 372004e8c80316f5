#!/usr/bin/env python
"""Fault injection: break training runs the ways real jobs break, and check
that every resume is either right or refused with a clear message.

    .venv/bin/python scripts/experiments/fault_injection.py --seeds 0,1,2,3,4 --trials 1
    .venv/bin/python scripts/experiments/fault_injection.py --render docs/results/fault_injection.json

Every run goes through `run_train.sh` (the launcher wrapper, 2 CPU processes,
the debug model on the sample data). A reference run without faults gives
the digest of every step's global batch. Scenarios:

- kill9_random: kill -9 of the whole job (launcher and every rank) at a random
  moment, then resume: every step's digest must equal the reference's, and
  metrics.jsonl must list each step once.
- kill9_in_save: the same, timed to land inside a checkpoint save.
- swapped_loader_state, zeros_in_shard, truncated_shard, deleted_shard,
  deleted_metadata: one file of the latest checkpoint damaged; the resume must
  be refused (exit 2) with a message naming the file and the older step
  that verifies. Then `--checkpoint.load_step` to that step must resume with
  the reference's digests.
- kill_launcher_only: kill -9 of the launcher alone: its ranks must notice and
  exit within seconds (no orphan keeps writing), and the resume must be right.
- second_job: a second job on a dump folder in use must be refused naming
  the holder, and the first job must finish with the reference's digests.
- stopped_rank: SIGSTOP on rank 1 with a short heartbeat timeout: the job must
  exit within the timeout (+ slack), naming rank 1.
- bad_record_rank1: a malformed line in a record only rank 1 reads: exit 2 and
  the file:line on the console once, without a traceback; with
  `bad_records = "drop"` the run finishes and counts the dropped record.

Each seed draws its own kill moments and save steps; every scenario runs
`--trials` times per seed, one seed after another, all against one reference
run. Prints a table (scenario, trials, outcome), writes the raw results to
`--results` (default docs/results/fault_injection.json) and, generated from
them, the table beside it (.md) and, for the committed results, the copy
between the `fault_injection` markers of docs/unattended.md (QUOTED_IN;
`--render JSON` regenerates them).
Run folders go under --out. Exits 1 if any resume trained on wrong data or any
damage was accepted silently (2 for any other unexpected outcome).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from harness.faults import INTERVAL, STEPS, Job, digests_ok, steps_logged, wait_for
from harness.train import (
    REPO,
    ensure_sample_data,
    pick_scenarios,
    quote_in_page,
    read_metrics,
    render_results,
)

RESULTS = REPO / "docs" / "results" / "fault_injection.json"
# The documentation page whose `<!-- NAME:begin/end -->` markers quote this script's summary.
QUOTED_IN = "docs/unattended.md"

CORRUPTIONS = (
    "swapped_loader_state",
    "zeros_in_shard",
    "truncated_shard",
    "deleted_shard",
    "deleted_metadata",
)
SCENARIOS = (
    "kill9_random",
    "kill9_in_save",
    *CORRUPTIONS,
    "kill_launcher_only",
    "second_job",
    "stopped_rank",
    "bad_record_rank1",
)
# Outcomes that mean the product failed its promise (exit 1).
LIES = ("WRONG DATA", "ACCEPTED SILENTLY", "SECOND WRITER ACCEPTED", "ORPHANS KEPT RUNNING")


def _resume_and_check(dump: Path, ref: dict[int, dict[str, Any]], timeout: float) -> str:
    job = Job(dump)
    code = job.wait(timeout)
    if code != 0:
        return f"resume failed (exit {code})"
    why = digests_ok(dump, ref)
    return "WRONG DATA: " + why if why else "ok"


# -- scenarios ------------------------------------------------------------------------------


def kill9(ctx: Ctx, trial: int, in_save: bool) -> str:
    dump = ctx.out / f"kill9{'_save' if in_save else ''}-{trial}"
    shutil.rmtree(dump, ignore_errors=True)
    job = Job(dump)
    if in_save:
        step = ctx.rng.choice(range(INTERVAL, STEPS, INTERVAL))
        folder = dump / "checkpoint" / f"step-{step}"
        # The first shard file appears as DCP starts writing: the save is under way.
        if not wait_for(lambda: any(folder.glob("*.distcp")), job, ctx.timeout):
            job.kill9()
            return "no save seen"
        time.sleep(ctx.rng.uniform(0, 0.1))
        mid_save = not (folder / "COMPLETE.json").exists()
    else:
        step = ctx.rng.randint(1, STEPS - 1)
        if not wait_for(lambda: steps_logged(dump) >= step, job, ctx.timeout):
            job.kill9()
            return "run ended early"
        time.sleep(ctx.rng.uniform(0, 1.0))
    if job.proc.poll() is not None:
        return "ok (finished before the kill)"
    job.kill9()
    outcome = _resume_and_check(dump, ctx.ref, ctx.timeout)
    if in_save and outcome == "ok":
        return "ok (killed mid-save)" if mid_save else "ok (killed just after the save)"
    return outcome


def _damage(step_dir: Path, kind: str, older: Path) -> Path:
    shard = step_dir / "__1_0.distcp"
    if kind == "swapped_loader_state":
        shutil.copy(older / "dataloader.json", step_dir / "dataloader.json")
        return step_dir / "dataloader.json"
    if kind == "zeros_in_shard":
        with open(shard, "r+b") as f:
            f.seek(shard.stat().st_size // 2)
            f.write(b"\0" * 4096)
        return shard
    if kind == "truncated_shard":
        os.truncate(shard, shard.stat().st_size // 2)
        return shard
    if kind == "deleted_shard":
        shard.unlink()
        return shard
    (step_dir / ".metadata").unlink()
    return step_dir / ".metadata"


def corruption(ctx: Ctx, trial: int, kind: str) -> str:
    dump = ctx.out / f"{kind}-{trial}"
    shutil.rmtree(dump, ignore_errors=True)
    shutil.copytree(ctx.ref_dump / "checkpoint", dump / "checkpoint")
    shutil.copy(ctx.ref_dump / "metrics.jsonl", dump / "metrics.jsonl")
    ck = dump / "checkpoint"
    bad = _damage(ck / f"step-{STEPS}", kind, ck / f"step-{STEPS - INTERVAL}")
    job = Job(dump)
    code = job.wait(ctx.timeout)
    out = job.output()
    if code == 0:
        why = digests_ok(dump, ctx.ref)
        return "ACCEPTED SILENTLY" + (f" and WRONG DATA: {why}" if why else "")
    if code != 2 or str(bad) not in out or f"load_step {STEPS - INTERVAL}" not in out:
        return f"refused unclearly (exit {code})"
    # The explicit fallback to the step that verifies resumes the right data.
    job = Job(dump, {"checkpoint.load_step": STEPS - INTERVAL})
    code = job.wait(ctx.timeout)
    if code != 0:
        return f"refused; load_step {STEPS - INTERVAL} then failed (exit {code})"
    why = digests_ok(dump, ctx.ref)
    return "WRONG DATA after load_step: " + why if why else "refused, named file; load_step ok"


def kill_launcher_only(ctx: Ctx, trial: int) -> str:
    dump = ctx.out / f"kill-launcher-{trial}"
    shutil.rmtree(dump, ignore_errors=True)
    job = Job(dump)
    step = ctx.rng.randint(1, STEPS - 2)
    if not wait_for(lambda: steps_logged(dump) >= step, job, ctx.timeout):
        job.kill9()
        return "run ended early"
    ranks = [p for p in (job.rank_pid(0), job.rank_pid(1)) if p is not None]
    os.kill(job.proc.pid, signal.SIGKILL)  # run_train.sh execs the launcher: this is it
    job.wait(10)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and any(Path(f"/proc/{p}").exists() for p in ranks):
        time.sleep(0.1)
    alive = [p for p in ranks if Path(f"/proc/{p}").exists()]
    took = time.monotonic() - t0
    for p in alive:
        os.kill(p, signal.SIGKILL)
    if alive or not ranks:
        return f"ORPHANS KEPT RUNNING ({len(alive)} after 60s)" if alive else "ranks not found"
    outcome = _resume_and_check(dump, ctx.ref, ctx.timeout)
    return f"ok (orphans exited in {took:.0f}s)" if outcome == "ok" else outcome


def second_job(ctx: Ctx, trial: int) -> str:
    dump = ctx.out / f"second-job-{trial}"
    shutil.rmtree(dump, ignore_errors=True)
    # Long enough that the second launch (several seconds of startup) meets it running.
    first = Job(dump, {"training.steps": 60, "checkpoint.interval": 20})
    if not wait_for(lambda: steps_logged(dump) >= 1, first, ctx.timeout):
        first.kill9()
        return "run ended early"
    holder = first.rank_pid(0)
    second = Job(dump)
    code2 = second.wait(ctx.timeout)
    running = first.proc.poll() is None
    out2 = second.output()
    code1 = first.wait(ctx.timeout)
    if code2 == 0:
        return "SECOND WRITER ACCEPTED" if running else "first job ended before the second began"
    named = f"in use by another job: pid {holder} on " in out2
    got = read_metrics(dump)
    bad = [s for s in range(1, STEPS + 1) if got.get(s, {}).get("digest") != ctx.ref[s]["digest"]]
    why = (f"digests differ at {bad}" if bad else None) if code1 == 0 else f"exit {code1}"
    if code2 == 2 and named and why is None:
        return "refused, named the holder; first job ok"
    return f"second exit {code2}, named={named}; first: {why or 'ok'}"


def stopped_rank(ctx: Ctx, trial: int) -> str:
    dump = ctx.out / f"stopped-{trial}"
    shutil.rmtree(dump, ignore_errors=True)
    timeout_s = 10
    job = Job(dump, {"job.heartbeat_timeout_s": timeout_s, "training.steps": 200})
    if not wait_for(lambda: steps_logged(dump) >= 2, job, ctx.timeout):
        job.kill9()
        return "run ended early"
    pid = job.rank_pid(1)
    if pid is None:
        job.kill9()
        return "rank 1 not found"
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    code = job.wait(timeout_s + 60)
    took = time.monotonic() - t0
    leftovers = [p for p in job.tree() if p != job.proc.pid]
    job.kill9()
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    out = job.output()
    if code is None:
        return f"HUNG (> {timeout_s + 60}s)"
    # The silence the watchdog measured: at least its timeout (never early), and
    # within three of its checks (every 2 s) after it.
    said = re.search(r"rank 1 \(host .*\) sent no heartbeat for (\d+)s", out)
    silent = int(said.group(1)) if said else None
    named = silent is not None
    if code == 1 and named and not leftovers and timeout_s <= silent <= timeout_s + 6:
        return f"exited in {took:.0f}s naming rank 1, silent {silent}s (timeout {timeout_s}s)"
    return f"exit {code} after {took:.0f}s, silent {silent}s, named={named}, leftovers={leftovers}"


def _bad_record_recipe(ctx: Ctx, drop: bool) -> tuple[Path, str]:
    """A copy of the sample mix with one malformed line in a record that only
    rank 1 (of 2) reads in the first steps; returns (recipe, 'file:line')."""
    from zephon import ZephonLoader, load_recipe

    base = ctx.out / "bad-data"
    if not (base / "where.json").exists():
        shutil.rmtree(base, ignore_errors=True)
        shutil.copytree(REPO / "data" / "sample" / "prose", base / "prose")
        shutil.copytree(REPO / "data" / "sample" / "code", base / "code")
        src = (REPO / "train_configs" / "data" / "sample_mix.toml").read_text()
        src = src.replace("../../data/sample/", "")
        (base / "mix.toml").write_text(src)
        loader = ZephonLoader(
            load_recipe(base / "mix.toml"),
            REPO / "assets" / "tokenizer" / "tokenizer.json",
            64,
            16,
            2,
            dp_rank=1,
            dp_size=2,
            num_workers=0,
            prefetch=0,
            trace=True,
        )
        loader.next_batch()
        assert loader.traces is not None
        lane = min(loader.traces)
        source, doc = next((s, d) for s, d in loader.traces[lane] if s == 0)
        reader = loader.ctx.readers[source]
        part = int((reader.part_starts <= doc).nonzero()[0][-1])
        f = reader.parts[part]
        offset = int(f.starts[doc - int(reader.part_starts[part])])
        loader.close()
        data = Path(f.origin).read_bytes()
        line = data[:offset].count(b"\n") + 1
        end = data.index(b"\n", offset)
        Path(f.origin).write_bytes(data[:offset] + b'{"text": "unterminated' + data[end:])
        (base / "where.json").write_text(json.dumps({"where": f"{f.origin}:{line}"}))
    where = json.loads((base / "where.json").read_text())["where"]
    if not drop:
        return base / "mix.toml", where
    text = (base / "mix.toml").read_text().replace("[recipe]\n", '[recipe]\nbad_records = "drop"\n')
    (base / "mix_drop.toml").write_text(text)
    return base / "mix_drop.toml", where


def bad_record_rank1(ctx: Ctx, trial: int) -> str:
    recipe, where = _bad_record_recipe(ctx, drop=False)
    dump = ctx.out / f"bad-record-{trial}"
    shutil.rmtree(dump, ignore_errors=True)
    job = Job(dump, {"data.recipe": recipe})
    code = job.wait(ctx.timeout)
    out = job.output()
    shown = out.count(where)
    if code != 2 or shown != 1 or "Traceback" in out or "ChildFailedError" in out:
        return f"exit {code}, message shown {shown}x, traceback={'Traceback' in out}"
    recipe, _ = _bad_record_recipe(ctx, drop=True)
    dump = ctx.out / f"bad-record-drop-{trial}"
    shutil.rmtree(dump, ignore_errors=True)
    job = Job(dump, {"data.recipe": recipe})
    code = job.wait(ctx.timeout)
    dropped = [r.get("bad_records_dropped") for r in read_metrics(dump).values()]
    if code != 0 or not dropped or not dropped[-1]:
        return f"drop run: exit {code}, dropped {dropped[-1:] or None}"
    return f"exit 2, {where.rsplit('/', 1)[-1]} shown once; drop: ok, {dropped[-1]} dropped"


# -- driver -----------------------------------------------------------------------------------


class Ctx:
    def __init__(self, out: Path, seed: int, timeout: float):
        self.out, self.rng, self.timeout = out, random.Random(seed), timeout
        self.ref_dump = out / "reference"
        self.ref: dict[int, dict[str, Any]] = {}


def run_scenario(ctx: Ctx, name: str, trial: int) -> str:
    if name == "kill9_random":
        return kill9(ctx, trial, in_save=False)
    if name == "kill9_in_save":
        return kill9(ctx, trial, in_save=True)
    if name in CORRUPTIONS:
        return corruption(ctx, trial, name)
    if name == "kill_launcher_only":
        return kill_launcher_only(ctx, trial)
    if name == "second_job":
        return second_job(ctx, trial)
    if name == "stopped_rank":
        return stopped_rank(ctx, trial)
    return bad_record_rank1(ctx, trial)


def _good(outcome: str) -> bool:
    return outcome.startswith(("ok", "refused, named", "exited in", "exit 2,"))


def table(results: list[dict[str, Any]]) -> str:
    """One row per scenario: its trials over every seed and how they ended."""
    rows = ["| scenario | trials | outcome |", "|---|---|---|"]
    for r in results:
        counts: dict[str, int] = {}
        for t in r["trials"]:
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        text = "; ".join(f"{n}x {o}" for o, n in counts.items())
        rows.append(f"| {r['scenario']} | {len(r['trials'])} | {text} |")
    return "\n".join(rows)


def report(doc: dict[str, Any]) -> str:
    """The results page: the command, the setting and the table, from the raw JSON."""
    seeds = ", ".join(str(s) for s in doc["seeds"])
    return (
        "# Fault injection\n\n"
        f"`.venv/bin/python {doc['command']}`: {doc['steps']} steps of the debug model on 2 CPU "
        f"processes through `run_train.sh`, a checkpoint every {doc['checkpoint_interval']} "
        f"steps; seeds {seeds}, {doc['trials']} trial(s) per scenario and seed; "
        f"{doc['wall_s']:.0f} s in all on a shared 2-core machine. Generated by "
        "`scripts/experiments/fault_injection.py` from the raw results in the JSON beside this page "
        "(`--render JSON` regenerates it).\n\n" + table(doc["results"]) + "\n"
    )


def render(path: Path) -> int:
    """The page beside a results JSON and, for the committed one, the table in QUOTED_IN."""
    code = render_results(path, report)
    if code == 0 and path.resolve() == RESULTS.resolve():
        quote_in_page(
            QUOTED_IN, "fault_injection", table(json.loads(path.read_text())["results"]) + "\n"
        )
    return code


def seed_list(text: str) -> list[int]:
    """argparse type for seeds such as "0,1,2" (any integers)."""
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"expected at least one seed, got {text!r}")
    return seeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "fault_injection")
    p.add_argument("--results", type=Path, default=RESULTS, help="raw results JSON (.md beside)")
    p.add_argument("--trials", type=int, default=2, help="trials per scenario and seed")
    p.add_argument("--seeds", type=seed_list, default=[0], help="comma-separated, e.g. 0,1,2")
    p.add_argument("--seed", type=lambda v: seed_list(v)[:1], dest="seeds", help="one seed")
    p.add_argument("--time-limit", type=float, default=1800, help="seconds; no new trial after")
    p.add_argument("--run-timeout", type=float, default=300, help="seconds per training run")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    p.add_argument("--render", type=Path, default=None, help="no runs: results JSON -> .md")
    a = p.parse_args(argv)
    if a.render is not None:
        return render(a.render)
    names = pick_scenarios(p, a.scenarios, SCENARIOS)
    ensure_sample_data()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    ref_dump = out / "reference"
    shutil.rmtree(ref_dump, ignore_errors=True)
    ref = Job(ref_dump)
    if ref.wait(a.run_timeout) != 0:
        print(ref.output()[-3000:])
        print("error: the reference run failed", file=sys.stderr)
        return 2
    trials: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for seed in a.seeds:
        # One random stream per seed (kill moments, save steps), one reference for all.
        ctx = Ctx(out / f"seed-{seed}", seed, a.run_timeout)
        ctx.ref_dump, ctx.ref = ref_dump, read_metrics(ref_dump)
        for name in names:
            for trial in range(a.trials):
                if time.monotonic() - t_start > a.time_limit:
                    break
                t0 = time.monotonic()
                outcome = run_scenario(ctx, name, trial)
                took = round(time.monotonic() - t0, 1)
                trials[name].append({"seed": seed, "trial": trial, "outcome": outcome, "s": took})
                print(f"seed {seed} {name} #{trial}: {outcome} ({took:.0f}s)", flush=True)
    results = [{"scenario": name, "trials": trials[name]} for name in names]
    print(table(results))
    seeds = ",".join(str(s) for s in a.seeds)
    doc = {
        "command": f"scripts/experiments/fault_injection.py --seeds {seeds} --trials {a.trials} "
        f"--scenarios {','.join(names)}",
        "seeds": a.seeds,
        "trials": a.trials,
        "steps": STEPS,
        "checkpoint_interval": INTERVAL,
        "wall_s": round(time.monotonic() - t_start, 1),
        "results": results,
    }
    results_path = a.results.resolve()
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(doc, indent=1) + "\n")
    render(results_path)
    outcomes = [t["outcome"] for r in results for t in r["trials"]]
    if any(lie in o for o in outcomes for lie in LIES):
        return 1
    return 0 if all(_good(o) for o in outcomes) else 2


if __name__ == "__main__":
    sys.exit(main())
