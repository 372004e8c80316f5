"""Steps/s, tokens/s and data-wait share of the debug model on 1, 2, 4 CPU processes.

    .venv/bin/python benchmarks/bench_trainer.py [--procs 1,2,4] [--steps 12] [-- extra trainer args]

Runs the default job config through torchrun for each process count (one run
at a time), skips the first `--warmup` steps, and reports medians from each
run's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from torchtitan.launch import REPO, read_metrics, torchrun_train


def run(nproc: int, steps: int, dump: Path, extra: list[str]) -> list[dict]:
    args = [
        "--job.config_file", str(REPO / "train_configs" / "llama3_debugmodel.toml"),
        "--training.steps", str(steps), "--checkpoint.enable", "false", *extra,
    ]  # fmt: skip
    proc = torchrun_train(nproc, dump, args)
    if proc.returncode:
        sys.exit(f"{nproc} processes failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    recs = read_metrics(dump)
    return [recs[s] for s in sorted(recs)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", default="1,2,4")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out")
    p.add_argument("extra", nargs="*", help="trainer overrides, after --")
    a = p.parse_args()
    print(
        f"{'procs':>5} {'steps/s':>8} {'tokens/s':>9} {'step s':>7} {'data wait':>10} {'share':>6}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in a.procs.split(",")):
            recs = run(n, a.steps, Path(tmp) / f"p{n}", a.extra)[a.warmup :]
            step_s = statistics.median(r["step_time_s"] for r in recs)
            tps = statistics.median(r["tokens_per_s"] for r in recs)
            wait = statistics.median(r["data_wait_s"] for r in recs)
            print(
                f"{n:>5} {1 / step_s:>8.3f} {tps:>9,.0f} {step_s:>7.3f} "
                f"{wait:>9.4f}s {100 * wait / step_s:>5.1f}%"
            )


if __name__ == "__main__":
    main()
