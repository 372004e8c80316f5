"""Launch the trainer with torchrun (gloo on CPU) and read what it logged."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from harness.train import (  # noqa: F401  (re-exported for the tests)
    copy_checkpoint,
    ensure_sample_data,
    read_metrics,
    read_validation,
    torchrun_train,
)
from helpers import REPO

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


def checkpoint_state(step_dir: Path) -> dict[str, Any]:
    """Everything a step folder's DCP files hold (model, optimizer, LR scheduler,
    step), read in this process as full tensors and plain values, keyed by their
    dotted path (`train.model.norm.weight`, `train.optimizer.state.<fqn>.exp_avg`)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.pt"
        dcp_to_torch_save(step_dir, path)
        return _flatten(torch.load(path, weights_only=True))


def _flatten(value: Any, key: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return {key: value}
    out: dict[str, Any] = {}
    for k, v in items:
        out |= _flatten(v, f"{key}.{k}" if key else str(k))
    return out


def state_differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """The keys of two `checkpoint_state`s that one lacks or that differ: tensors in
    dtype, shape or any element (exactly), other values by equality."""
    out = sorted(set(got) ^ set(want))
    for key in sorted(set(got) & set(want)):
        a, b = got[key], want[key]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        else:
            same = type(a) is type(b) and a == b
        if not same:
            out.append(key)
    return out


def logged_steps(dump: Path, name: str = "metrics.jsonl") -> list[int]:
    """The step of every record in the run's JSONL log, in file order: unlike
    `metrics` (one record per step), a step logged twice shows up twice."""
    path = dump / name
    lines = path.read_text().splitlines() if path.is_file() else []
    return [int(json.loads(line)["step"]) for line in lines if line.strip()]


# A tiny phase recipe on the sample data: a batch-size ramp (8 -> 16 rows), a
# seq_len change (32 -> 64), then a new mixture with a source used for the first
# time and a lane-count change (4 -> 8). Boundary checkpoints: steps 2, 4 and 6.
PHASE_STEPS = 8
PHASE_NAMES = ["ramp"] * 2 + ["main"] * 2 + ["long"] * 2 + ["anneal"] * 2
PHASE_SHAPES = [(8, 32)] * 2 + [(16, 32)] * 2 + [(16, 64)] * 4  # (global batch, seq_len)
PHASES = """
[[phase]]
name = "ramp"
start_step = 0
global_batch_size = 8
seq_len = 32
weights = { prose = 0.7, code = 0.3 }

[[phase]]
name = "main"
start_step = 2
global_batch_size = 16

[[phase]]
name = "long"
start_step = 4
seq_len = 64

[[phase]]
name = "anneal"
start_step = 6
lanes = 8
weights = { prose = 0.3, code = 0.2, curated = 0.5 }
"""


def phase_recipe(folder: Path, phases: str = PHASES) -> Path:
    """Write the tiny phase recipe (absolute paths to the sample data) into `folder`."""
    data = REPO / "data" / "sample"
    sources = [("prose", "prose/part-0000[0-2].jsonl"), ("code", "code/*.jsonl.gz"),
               ("curated", "prose/part-00003.jsonl")]  # fmt: skip
    text = (
        '[recipe]\nname = "tiny-phases"\nseed = 1234\nlanes = 4\n\n'
        '[mixture]\nunit = "tokens"\non_exhausted = "repeat"\n\n'
        '[shuffle]\nblock_size = 64\n\n[packing]\nalgorithm = "concat"\nflush_interval = 8\n\n'
        "[execution]\nworkers = 1\nprefetch = 1\n\n"
        + "".join(f'[[source]]\nname = "{n}"\npath = "{data / p}"\n\n' for n, p in sources)
        + phases
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "phases.toml"
    path.write_text(text)
    return path
