#!/usr/bin/env python
"""Two "nodes" on this machine, then the same run resumed on one.

1. Two `run_train.sh` launches with NNODES=2, NODE_RANK=0/1, NGPU=2 each and a
   c10d rendezvous at 127.0.0.1:PORT form one 4-process job: HSDP with one
   replica per node (data_parallel_replicate_degree 2 x shard 2), 6 steps,
   checkpoint at step 3, both nodes writing to one dump folder.
2. The step-3 checkpoint is resumed by a single `run_train.sh` node (NGPU=2,
   pure FSDP over 2 processes).
3. The resumed steps must log the two-node run's global-batch digests and
   losses within 1e-4 (relative).

Writes docs/results/two_node_resume.{json,md}; exits 1 on any mismatch.

    .venv/bin/python scripts/experiments/two_node_resume.py
    .venv/bin/python scripts/experiments/two_node_resume.py --render docs/results/two_node_resume.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.train import (
    REPO,
    copy_checkpoint,
    ensure_sample_data,
    read_metrics,
    render_results,
    results_args,
)
from torchtitan.distributed.utils import free_port

STEPS, K, LOSS_RTOL = 6, 3, 1e-4
ARGS = [
    "--training.seq_len", "64", "--training.global_batch_size", "16",
    "--training.local_batch_size", "2", "--training.steps", str(STEPS),
    "--checkpoint.interval", str(K), "--lr_scheduler.warmup_steps", "2",
    "--data.log_batch_digests", "true",
]  # fmt: skip


def launch(dump: Path, extra: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NGPU": "2", **env}
    return subprocess.Popen(
        ["./run_train.sh", *ARGS, "--job.dump_folder", str(dump), *extra],
        cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], what: str, log: Path) -> str:
    out, _ = proc.communicate(timeout=900)
    log.write_text(out)
    if proc.returncode:
        sys.exit(f"{what} exited {proc.returncode}:\n" + "\n".join(out.splitlines()[-30:]))
    return out


def main() -> int:
    a = results_args(__doc__)
    if a.render is not None:
        return render_results(a.render, page)
    ensure_sample_data()
    with tempfile.TemporaryDirectory() as tmp:
        two, one = Path(tmp) / "two_nodes", Path(tmp) / "one_node"
        rdzv = {"NNODES": "2", "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "RDZV_ID": "two"}
        hsdp = ["--parallelism.data_parallel_replicate_degree", "2"]
        nodes = [launch(two, hsdp, {**rdzv, "NODE_RANK": str(r)}) for r in (0, 1)]
        outs = [finish(n, f"node {r}", Path(tmp) / f"node{r}.log") for r, n in enumerate(nodes)]
        ref = read_metrics(two)
        copy_checkpoint(two, K, one)
        out = finish(launch(one, [], {}), "one-node resume", Path(tmp) / "one.log")
        got = read_metrics(one)
    mesh_line = next((ln for ln in outs[0].splitlines() if "training steps" in ln), "")
    resumed = next((ln for ln in out.splitlines() if "resumed from step" in ln), "")
    rows = []
    for s in range(K + 1, STEPS + 1):
        rel = abs(got[s]["loss"] - ref[s]["loss"]) / abs(ref[s]["loss"])
        rows.append(
            {
                "step": s,
                "two_node_digest": ref[s]["digest"],
                "one_node_digest": got[s]["digest"],
                "two_node_loss": ref[s]["loss"],
                "one_node_loss": got[s]["loss"],
                "rel_dloss": rel,
            }
        )
    ok = all(
        r["two_node_digest"] == r["one_node_digest"] and r["rel_dloss"] <= LOSS_RTOL for r in rows
    )
    a.out.mkdir(parents=True, exist_ok=True)
    mesh_line = mesh_line[mesh_line.find("training steps") :]
    resumed = resumed[resumed.find("resumed from") :]
    doc = {"two_node_mesh": mesh_line, "resume": resumed, "steps": rows, "ok": ok}
    results = a.out / "two_node_resume.json"
    results.write_text(json.dumps(doc, indent=1))
    render_results(results, page)
    return 0 if ok else 1


def page(doc: dict[str, Any]) -> str:
    """The results page, from the raw results (two_node_resume.json)."""
    lines = [
        "Two run_train.sh nodes on one machine (NNODES=2, NGPU=2 each, c10d rendezvous on "
        "127.0.0.1; HSDP replicate 2 x shard 2), checkpoint at step 3, resumed on one node "
        "(NGPU=2, FSDP over 2 processes).",
        "",
        "| step | digest (2 nodes) | digest (1 node) | loss (2 nodes) | loss (1 node) | rel. diff |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["steps"]:
        lines.append(
            f"| {r['step']} | {r['two_node_digest'][:16]} | {r['one_node_digest'][:16]} "
            f"| {r['two_node_loss']:.6f} | {r['one_node_loss']:.6f} | {r['rel_dloss']:.1e} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
