"""scripts/setup.sh's choice of torch (issue 40), seen through its dry run: what it
would install on a GPU node (a fake `nvidia-smi` on PATH), on a CPU machine, and
when asked to keep the environment's torch; nothing is installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

PINNED = re.search(r"^torch==(\S+)", (REPO / "requirements-ci.txt").read_text(), re.M).group(1)


def fake_nvidia_smi(folder: Path, gpus: int, cuda: str) -> None:
    listing = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})\\n" for i in range(gpus))
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-L" ]; then printf "{listing}"; exit 0; fi\n'
        f'echo "| NVIDIA-SMI 580.65   Driver Version: 580.65   CUDA Version: {cuda}     |"\n'
    )
    script.chmod(0o755)


def dry_run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """setup.sh with SETUP_DRY_RUN=1; PATH holds tmp_path (a fake nvidia-smi, if any)
    and the system's tools, never a real nvidia-smi."""
    full = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
            "SETUP_DRY_RUN": "1", "PYTHON": sys.executable, **env}  # fmt: skip
    return subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    "cuda, tag", [("13.0", "cu130"), ("13.2", "cu130"), ("12.9", "cu128"), ("12.6", "cu126")]
)
def test_a_gpu_node_gets_the_cuda_build_for_its_driver(tmp_path, cuda, tag):
    fake_nvidia_smi(tmp_path, 8, cuda)
    proc = dry_run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"torch {PINNED}, CUDA build from https://download.pytorch.org/whl/{tag}" in proc.stdout
    assert f"driver CUDA {cuda}, 8 GPU(s)" in proc.stdout
    assert f"TORCH=cuda torch_spec=torch=={PINNED}+{tag}" in proc.stdout


def test_a_driver_older_than_every_build_is_one_line(tmp_path):
    fake_nvidia_smi(tmp_path, 1, "12.2")
    proc = dry_run(tmp_path)
    assert proc.returncode == 2
    assert "supports CUDA 12.2, older than torch" in proc.stderr and "TORCH=keep" in proc.stderr


def test_a_machine_without_a_gpu_gets_the_pinned_torch(tmp_path):
    proc = dry_run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"TORCH=cpu torch_spec=torch=={PINNED} index=pip default" in proc.stdout
    # a GPU driver with no GPU listed is no GPU node
    fake_nvidia_smi(tmp_path, 0, "13.0")
    assert "TORCH=cpu" in dry_run(tmp_path).stdout
    forced = dry_run(tmp_path, TORCH="cuda", TORCH_INDEX_URL="https://example.org/whl")
    assert "index=--index-url https://example.org/whl" in forced.stdout


def test_keep_uses_the_environments_torch_and_the_floor_version(tmp_path):
    import torch

    proc = dry_run(tmp_path, TORCH="keep")
    assert proc.returncode == 0, proc.stderr
    assert f"torch {torch.__version__} kept from {sys.executable}" in proc.stdout
    assert "venv_args=--system-site-packages" in proc.stdout
    floor = dry_run(tmp_path, TORCH_VERSION="2.11.0")
    assert "torch_spec=torch==2.11.0" in floor.stdout


def test_keep_without_a_torch_and_unknown_choices_are_one_line(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    proc = dry_run(tmp_path, TORCH="keep", PYTHON=str(bare / "bin" / "python"))
    assert proc.returncode == 2 and "has no torch to keep" in proc.stderr
    proc = dry_run(tmp_path, TORCH="rocm")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "setup: TORCH=rocm: expected auto, cuda, cpu or keep"


def test_keep_refuses_a_torch_below_the_floor(tmp_path):
    old = tmp_path / "old"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(old)], check=True)
    (site,) = old.glob("lib/python3*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text('__version__ = "2.10.0+cu126"\n')
    proc = dry_run(tmp_path, TORCH="keep", PYTHON=str(old / "bin" / "python"))
    assert proc.returncode == 2
    assert "has torch 2.10.0+cu126, but this project needs torch >= 2.11.0" in proc.stderr
