"""Launch the trainer with torchrun (gloo on CPU) and read what it logged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"

K = 3  # checkpoint step of the reference runs
STEPS = 6

# A short, small job on the bundled sample data; every test starts from these.
BASE_ARGS = [
    "--job.config_file",
    str(REPO / "train_configs" / "llama3_debugmodel.toml"),
    "--training.seq_len",
    "64",
    "--training.global_batch_size",
    "16",
    "--training.local_batch_size",
    "2",
    "--training.steps",
    "6",
    "--checkpoint.interval",
    "3",
    "--lr_scheduler.warmup_steps",
    "2",
    "--data.log_batch_digests",
    "true",
    "--data.recipe",
    str(REPO / "train_configs" / "data" / "sample_mix.toml"),
    "--data.tokenizer",
    str(REPO / "assets" / "tokenizer" / "tokenizer.json"),
]


def ensure_sample_data() -> None:
    if not (SAMPLE / "MANIFEST.json").is_file():
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "build_sample_data.py"), "--out", str(SAMPLE)],
            check=True,
        )


def torchrun(
    nproc: int, dump: Path, *extra: str, env: dict[str, str] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """Run the trainer on `nproc` CPU processes; returns the finished process."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "torchtitan.train",
        *BASE_ARGS,
        "--job.dump_folder",
        str(dump),
        *extra,
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(
        cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def metrics(dump: Path) -> dict[int, dict]:
    """step -> the last JSONL record logged for it."""
    out = {}
    with open(dump / "metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            out[rec["step"]] = rec
    return out


def copy_checkpoint(src_dump: Path, step: int, dst_dump: Path) -> None:
    """Start a new run folder from one step of another run's checkpoints."""
    dst = dst_dump / "checkpoint" / f"step-{step}"
    shutil.copytree(src_dump / "checkpoint" / f"step-{step}", dst)
