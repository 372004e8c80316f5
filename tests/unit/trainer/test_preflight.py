"""What the launcher refuses before any worker starts (issue 40): a bad job setting
is one line and exit 2 every time (no race between ranks over who says it), and a
device choice that cannot work is named with what to do."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from helpers import REPO

from torchtitan.runtime import preflight

CONFIG = str(REPO / "train_configs" / "llama3_debugmodel.toml")


def test_a_bad_job_setting_is_found_before_the_workers_start():
    args = SimpleNamespace(
        module=True, training_script="torchtitan.train", nproc_per_node="2",
        training_script_args=["--job.config_file", CONFIG, "--training.stepz", "3"],
    )  # fmt: skip
    (problem,) = preflight.problems(args, environ={})
    assert "--training.stepz" in problem and "did you mean 'steps'?" in problem
    good = SimpleNamespace(**{**vars(args), "training_script_args": ["--job.config_file", CONFIG]})
    assert preflight.problems(good, environ={}) == []
    # another program, or a request for help, is the worker's own business
    assert preflight.job_config_problem(False, "x.py", ["--training.stepz", "3"]) is None
    assert preflight.job_config_problem(True, "torchtitan.train", ["--help"]) is None


@pytest.mark.parametrize(
    "nproc, environ, cuda, driver, build, words",
    [
        (2, {}, 0, 0, None, None),  # a CPU machine: processes on the CPU
        (2, {}, 0, 0, "13.0", None),  # a CUDA torch without a driver: the CPU, as asked
        (1, {}, 1, 1, "13.0", None),
        (4, {"CUDA_VISIBLE_DEVICES": "0"}, 1, 8, "13.0",
         "NGPU=4 (--nproc-per-node) but torch sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=0): set NGPU to at most 1"),
        (2, {}, 0, 2, None, "2 NVIDIA GPU(s), but torch"),  # a CPU build on a GPU node
        (2, {}, 0, 2, "13.0", "a torch built for this driver's CUDA version"),
        (2, {"TORCHTITAN_DEVICE": "cpu"}, 0, 2, None, None),  # asked for the CPU
        (8, {"TORCHTITAN_DEVICE": "cpu"}, 1, 1, "13.0", None),
        (1, {"TORCHTITAN_DEVICE": "cuda"}, 0, 0, "13.0",
         "TORCHTITAN_DEVICE=cuda, but torch"),
        (1, {"TORCHTITAN_DEVICE": "gpu"}, 1, 1, "13.0",
         "TORCHTITAN_DEVICE='gpu': expected one of auto, cuda, cpu"),
    ],
)  # fmt: skip
def test_device_choices(nproc, environ, cuda, driver, build, words):
    problem = preflight.device_problem(nproc, environ, cuda, driver, build)
    if words is None:
        assert problem is None
    else:
        assert problem is not None and words in problem and "\n" not in problem
    if problem and "NVIDIA GPU(s), but torch" in problem:
        assert "TORCHTITAN_DEVICE=cpu" in problem  # the way to train on the CPU anyway


def test_nvidia_gpus_counts_the_drivers_folders(tmp_path):
    assert preflight.nvidia_gpus(str(tmp_path / "none")) == 0
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (tmp_path / bus).mkdir()
    assert preflight.nvidia_gpus(str(tmp_path)) == 2


def test_run_train_sh_refuses_a_bad_setting_with_its_line_and_exit_2(tmp_path):
    """Through the launcher, as a user runs it: no worker starts, so the line and the
    status are the same every time, whichever rank would have said it first."""
    # Every Python process that torchrun starts as a rank (RANK is set) leaves a mark.
    (tmp_path / "sitecustomize.py").write_text(
        "import os\n"
        "if 'RANK' in os.environ:\n"
        f"    open({str(tmp_path / 'started')!r}, 'a').write(os.environ['RANK'])\n"
    )
    env = {"NGPU": "2", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(tmp_path)}  # fmt: skip
    proc = subprocess.run(
        ["bash", str(REPO / "run_train.sh"), "--training.stepz", "3"],
        cwd=REPO, env={**env, "PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "did you mean 'steps'" in lines[0]
    assert not (tmp_path / "started").exists()  # no worker ran
