#!/usr/bin/env python
"""How long the save after a preemption signal takes, to size the warning time.

    .venv/bin/python scripts/experiments/preempt_save_time.py [--trials 3] [--configs debugmodel,1B]

Two measurements:
- the debug config through `run_train.sh` (2 CPU processes): SIGTERM to the
  launcher at step 2; the seconds the ranks report for writing and verifying
  the checkpoint of the step they stopped at ("preempted at step N ...: written
  and verified in X s");
- each config on its own, in one process with no training step: the model and
  an AdamW state (both moments, as after a first step) built from the config,
  then the same save as a stop does (`CheckpointManager.save` + `verify`:
  DCP files, checksums, manifest, full re-read). Skipped, and recorded as such,
  when the state does not fit in the memory available (state + 4 GiB margin).

Writes docs/results/preempt_save_time.json and .md (generated from the JSON;
`--render JSON` regenerates it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.train import REPO, ensure_sample_data, render_results

CONFIGS = {
    "debugmodel": REPO / "train_configs" / "llama3_debugmodel.toml",
    "1B": REPO / "train_configs" / "llama3_1b.toml",
}
MARGIN = 4 << 30


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def through_run_train(trials: int, out: Path) -> list[dict[str, Any]]:
    """SIGTERM to the launcher of a debug-config run at step 2, `trials` times."""
    from harness import faults as fi

    rows = []
    for trial in range(trials):
        dump = out / f"sigterm-{trial}"
        shutil.rmtree(dump, ignore_errors=True)
        # The debug config as shipped (the harness's defaults shrink it for speed).
        overrides = {"job.config_file": CONFIGS["debugmodel"], "training.seq_len": 256,
                     "training.global_batch_size": 32, "training.local_batch_size": 4,
                     "lr_scheduler.warmup_steps": 5, "training.steps": 40,
                     "checkpoint.interval": 1000}  # fmt: skip
        job = fi.Job(dump, overrides, nproc=2)
        if not fi.wait_for(lambda d=dump: fi.steps_logged(d) >= 2, job, 600):
            job.kill9()
            rows.append({"trial": trial, "problem": "no step 2"})
            continue
        os.kill(job.proc.pid, signal.SIGTERM)
        code = job.wait(600)
        text = job.output()
        m = re.search(r"preempted at step (\d+) .*written and verified in ([0-9.]+)s", text)
        if m is None:
            job.kill9()
        step = int(m.group(1)) if m else None
        rows.append({
            "config": "debugmodel", "method": "run_train.sh, 2 processes, SIGTERM", "trial": trial,
            "exit": code, "stopped_at_step": step,
            "save_and_verify_s": float(m.group(2)) if m else None,
            "bytes": _folder_bytes(dump / "checkpoint" / f"step-{step}") if m else None,
        })  # fmt: skip
    return rows


def one(config: str, dump: Path) -> dict[str, Any]:
    """In this process: build the config's model and optimizer state, save as a stop does."""
    import torch

    from torchtitan.components.checkpoint.manager import CheckpointManager
    from torchtitan.components.initial_load import initial_model_args
    from torchtitan.components.lr_scheduler import build_lr_scheduler
    from torchtitan.components.optimizer import build_optimizer
    from torchtitan.config.job_config import load_job_config
    from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
    from torchtitan.distributed.utils import init_distributed
    from torchtitan.models import get_model_spec
    from torchtitan.models.spec import count_parameters
    from zephon import load_tokenizer

    cfg = load_job_config(["--job.config_file", str(CONFIGS[config]),
                           "--job.dump_folder", str(dump)])  # fmt: skip
    info = init_distributed()
    spec = get_model_spec(cfg.model.name)
    args = initial_model_args(cfg, load_tokenizer(cfg.data.tokenizer).vocab_size)
    with torch.device("meta"):
        model = spec.build(args)
    n_params = count_parameters(model)
    state_bytes = 12 * n_params  # fp32 parameters + two AdamW moments
    available = _available_bytes()
    row: dict[str, Any] = {"config": config, "method": "in process, no training step",
                           "parameters": n_params, "state_bytes": state_bytes}  # fmt: skip
    if available < state_bytes + MARGIN:
        return {**row, "skipped": f"needs {state_bytes / 2**30:.1f} GiB + 4 GiB margin, "
                f"{available / 2**30:.1f} GiB available"}  # fmt: skip
    training = cfg.training
    training.mixed_precision_param = "float32"
    mesh = ParallelMesh(ParallelDims.from_config(cfg.parallelism, info.world_size), "cpu")
    spec.parallelize(model, mesh, training)
    model.to_empty(device="cpu")
    model.init_weights(torch.Generator(device="cpu").manual_seed(0))
    optimizer = build_optimizer(model, cfg.optimizer)
    for group in optimizer.param_groups:  # the state a first step would create
        for p in group["params"]:
            optimizer.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": torch.zeros_like(p)}  # fmt: skip
    sched = build_lr_scheduler(optimizer, cfg.lr_scheduler, cfg.training.steps)
    ckpt = CheckpointManager(cfg.checkpoint, str(dump), model, optimizer, sched)
    t0 = time.perf_counter()
    ckpt.save(1, lambda: {"format": "measurement", "step": 1}, True, wait=True)
    t1 = time.perf_counter()
    ckpt.verify(1)
    t2 = time.perf_counter()
    return {**row, "save_s": round(t1 - t0, 2), "verify_s": round(t2 - t1, 2),
            "save_and_verify_s": round(t2 - t0, 2),
            "bytes": _folder_bytes(Path(ckpt.step_dir(1)))}  # fmt: skip


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def table(doc: dict[str, Any]) -> str:
    rows = [
        "| config | how | parameters | checkpoint | save + verify (s) |",
        "|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        size = f"{r['bytes'] / 2**20:.1f} MiB" if r.get("bytes") else "-"
        secs = r.get("save_and_verify_s")
        what = f"{secs:.2f}" if secs is not None else r.get("skipped", r.get("problem", "-"))
        if "save_s" in r:
            what += f" ({r['save_s']:.2f} write, {r['verify_s']:.2f} verify)"
        params = f"{r['parameters']:,}" if r.get("parameters") else "-"
        trial = f" #{r['trial']}" if "trial" in r else ""
        rows.append(f"| {r['config']} | {r['method']}{trial} | {params} | {size} | {what} |")
    return "\n".join(rows)


def report(doc: dict[str, Any]) -> str:
    return (
        "# Preemption save time\n\n"
        f"`.venv/bin/python {doc['command']}` on {doc['machine']}. The stop path writes "
        "the DCP files, checksums them into the manifest, then re-reads every file against "
        'it (`checkpoint.verify = "full"`). Generated from `preempt_save_time.json`.\n\n'
        + table(doc)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--configs", default="debugmodel,1B")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "preempt_save_time")
    p.add_argument("--results", type=Path, default=REPO / "docs" / "results")
    p.add_argument("--render", type=Path, default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.render is not None:
        return render_results(a.render, report)
    if a.one is not None:
        print(json.dumps(one(a.one, a.out)))
        return 0
    ensure_sample_data()
    a.out.mkdir(parents=True, exist_ok=True)
    results = through_run_train(a.trials, a.out)
    for config in [c for c in a.configs.split(",") if c]:
        with tempfile.TemporaryDirectory(dir=a.out) as tmp:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"}
            proc = subprocess.run(
                [sys.executable, __file__, "--one", config, "--out", tmp],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=3600,
            )  # fmt: skip
        if proc.returncode:
            results.append({"config": config, "method": "in process, no training step",
                            "problem": f"exit {proc.returncode}: {proc.stderr[-300:]}"})  # fmt: skip
            continue
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    doc = {
        "command": f"scripts/experiments/preempt_save_time.py --trials {a.trials} --configs {a.configs}",
        "machine": f"{os.cpu_count()} CPU cores shared with other work, local disk",
        "results": results,
    }
    a.results.mkdir(parents=True, exist_ok=True)
    path = a.results / "preempt_save_time.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return render_results(path, report)


if __name__ == "__main__":
    sys.exit(main())
