#!/usr/bin/env python
"""Checkpoints moved between device meshes: every resume must log the same
global-batch digests as the pure-FSDP reference, and losses within 1e-4.

Full runs (debug model, 6 steps, checkpoint at step 3) on 4 CPU processes as
shard 4 (the reference), (replicate 2, shard 2), (tp 2, shard 2), and with
pipeline parallelism (pp 2, shard 2) and (pp 2, tp 2); then each one's step-3
checkpoint resumed on other meshes, among them shard 2 and (pp 2, shard 1) on
2 processes, shard 3 (PP 1, uneven lanes) and (replicate 2, shard 4) on 8. Writes
docs/results/mesh_resume_matrix.{json,md}; exits 1 if any digest differs or a
loss is further than 1e-4 (relative) from the reference.

    .venv/bin/python scripts/experiments/mesh_resume_matrix.py [--out docs/results]
    .venv/bin/python scripts/experiments/mesh_resume_matrix.py --render docs/results/mesh_resume_matrix.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.train import (
    REPO,
    compare,
    copy_checkpoint,
    ensure_sample_data,
    read_metrics,
    render_results,
    results_args,
    run_logged,
)

STEPS, K, LOSS_RTOL = 6, 3, 1e-4
# name -> (processes, (replicate, shard, tp, pp)); pipelines run 1F1B
MESHES = {
    "shard4": (4, (1, 4, 1, 1)),
    "hsdp2x2": (4, (2, 2, 1, 1)),
    "tp2xshard2": (4, (1, 2, 2, 1)),
    "pp2xshard2": (4, (1, 2, 1, 2)),
    "pp2xtp2": (4, (1, 1, 2, 2)),
    "shard2": (2, (1, 2, 1, 1)),
    "shard3": (3, (1, 3, 1, 1)),
    "pp2xshard1": (2, (1, 1, 1, 2)),
    "hsdp2x4": (8, (2, 4, 1, 1)),
}
SAVED_ON = ["shard4", "hsdp2x2", "tp2xshard2", "pp2xshard2", "pp2xtp2"]
RESUMES = {
    "shard4": ["hsdp2x2", "tp2xshard2", "shard2", "hsdp2x4", "pp2xshard2", "pp2xshard1"],
    "hsdp2x2": ["tp2xshard2", "shard2", "hsdp2x4"],
    "tp2xshard2": ["shard4", "hsdp2x2", "shard2", "hsdp2x4", "pp2xtp2"],
    "pp2xshard2": ["shard3", "shard4", "pp2xshard1", "tp2xshard2", "pp2xtp2"],
    "pp2xtp2": ["shard2", "pp2xshard2"],
}
BASE = [
    "--job.config_file", str(REPO / "train_configs" / "llama3_debugmodel.toml"),
    "--training.seq_len", "64", "--training.global_batch_size", "16",
    "--training.local_batch_size", "2", "--training.steps", str(STEPS),
    "--checkpoint.interval", str(K), "--lr_scheduler.warmup_steps", "2",
    "--data.log_batch_digests", "true",
]  # fmt: skip


def run(name: str, dump: Path) -> dict[int, dict]:
    nproc, (rep, shard, tp, pp) = MESHES[name]
    args = [
        *BASE,
        "--parallelism.data_parallel_replicate_degree", str(rep),
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--parallelism.tensor_parallel_degree", str(tp),
        "--parallelism.pipeline_parallel_degree", str(pp),
    ]  # fmt: skip
    run_logged(nproc, dump, args, timeout=900)
    return read_metrics(dump)


def page(rows: list[dict[str, Any]]) -> str:
    """The results page, from the raw rows (mesh_resume_matrix.json)."""
    lines = [
        f"Debug model, {STEPS} steps, checkpoint at step {K}; reference: pure FSDP on 4 "
        "processes (shard4). Meshes: hsdp2x2 = replicate 2 x shard 2, tp2xshard2 = tensor "
        "parallel 2 x shard 2, pp2xshard2 = pipeline 2 (1F1B) x shard 2, pp2xtp2 = pipeline "
        "2 x tensor parallel 2, pp2xshard1 = pipeline 2 on 2 processes, shard3 = 3 "
        "processes (8 lanes: uneven), hsdp2x4 = replicate 2 x shard 4 (8 processes).",
        "",
        "| run | steps compared | digests equal | max relative loss difference |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['steps']} | {r['digests_equal']} | {r['max_rel_dloss']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    a = results_args(__doc__)
    if a.render is not None:
        return render_results(a.render, page)
    ensure_sample_data()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        full = {name: run(name, Path(tmp) / name) for name in SAVED_ON}
        ref = full["shard4"]
        for name in SAVED_ON[1:]:
            rows.append(compare(f"{name} (from scratch)", full[name], ref, range(1, STEPS + 1)))
        for saved in SAVED_ON:
            for target in RESUMES[saved]:
                dump = Path(tmp) / f"{saved}-to-{target}"
                copy_checkpoint(Path(tmp) / saved, K, dump)
                got = run(target, dump)
                rows.append(compare(f"{saved} -> {target}", got, ref, range(K + 1, STEPS + 1)))
                print(rows[-1], flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    results = a.out / "mesh_resume_matrix.json"
    results.write_text(json.dumps(rows, indent=1))
    render_results(results, page)
    bad = [r for r in rows if not r["digests_equal"] or r["max_rel_dloss"] > LOSS_RTOL]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
