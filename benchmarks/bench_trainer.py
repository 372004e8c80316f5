"""Steps/s, tokens/s and data-wait share of the debug model on 1, 2, 4 CPU processes.

    .venv/bin/python benchmarks/bench_trainer.py [--procs 1,2,4] [--steps 12] [-- extra trainer args]

Runs the default job config through run_train.sh for each process count (one run
at a time), skips the first `--warmup` steps, and reports medians from each
run's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_train(
    nproc: int, dump: Path, config: str, args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`NGPU=nproc CONFIG_FILE=config ./run_train.sh ARGS`: the launch a user runs,
    on CPU unless `env` gives GPUs back; output captured, never raises on failure."""
    full_env = {
        **os.environ, "NGPU": str(nproc), "CONFIG_FILE": str(REPO / "train_configs" / config),
        "CUDA_VISIBLE_DEVICES": "", **(env or {}),
    }  # fmt: skip
    cmd = ["bash", str(REPO / "run_train.sh"), *args, "--job.dump_folder", str(dump)]
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True)


def read_metrics(dump: Path) -> dict[int, dict[str, Any]]:
    """step -> the record the trainer logged for it in `metrics.jsonl`."""
    path = dump / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return {int(r["step"]): r for r in map(json.loads, filter(str.strip, lines))}


def run(nproc: int, steps: int, dump: Path, extra: list[str]) -> list[dict]:
    args = ["--training.steps", str(steps), "--checkpoint.enable", "false", *extra]
    proc = run_train(nproc, dump, "llama3_debugmodel.toml", args)
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
