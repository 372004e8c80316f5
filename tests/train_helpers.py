"""Launch the trainer with torchrun (gloo on CPU) and read what it logged."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from train_harness import (  # noqa: F401  (re-exported for the tests)
    copy_checkpoint,
    ensure_sample_data,
    read_metrics,
    torchrun_train,
)

REPO = Path(__file__).resolve().parents[1]

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


def torchrun(
    nproc: int, dump: Path, *extra: str, env: dict[str, str] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """Run the test job on `nproc` CPU processes; returns the finished process."""
    return torchrun_train(nproc, dump, [*BASE_ARGS, *extra], env=env, timeout=timeout)


def run_train_sh(
    nproc: int, dump: Path, *extra: str, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """The test job through `NGPU=nproc ./run_train.sh`, as a user launches it (the
    launcher wrapper, which reports a failing rank once); returns the finished process."""
    env = {**os.environ, "NGPU": str(nproc), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    cmd = ["bash", str(REPO / "run_train.sh"), *BASE_ARGS, *extra, "--job.dump_folder", str(dump)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


metrics = read_metrics


def logged_steps(dump: Path, name: str = "metrics.jsonl") -> list[int]:
    """The step of every record in the run's JSONL log, in file order: unlike
    `metrics` (one record per step), a step logged twice shows up twice."""
    path = dump / name
    lines = path.read_text().splitlines() if path.is_file() else []
    return [int(json.loads(line)["step"]) for line in lines if line.strip()]
