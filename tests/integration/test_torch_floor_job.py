"""The oldest supported torch trains and resumes like the pinned one (issue 40).

Run by .ci/run in the floor venv (requirements-floor.txt): `run_train.sh` on 2
processes with a checkpoint, then a resume at 1 process, under the floor torch;
and the same checkpoint resumed at 1 process under the pinned torch (the main
`.venv`). Every digest is equal, and the losses of the resumes agree. Under the
pinned torch itself there is nothing to compare, so the test skips there."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from helpers import REPO
from helpers.train import BASE_ARGS, STEPS, K, copy_checkpoint, ensure_sample_data, metrics

PINNED = re.search(r"^torch==(\S+)", (REPO / "requirements-ci.txt").read_text(), re.M).group(1)
PINNED_PYTHON = REPO / ".venv" / "bin" / "python"
# A resume at another size reduces in another order (test_train_elastic.py); another
# torch may pick other CPU kernels: the data decides the loss to far better than this.
LOSS_RTOL = 1e-4

pytestmark = pytest.mark.skipif(
    torch.__version__.split("+")[0] == PINNED,
    reason=f"compares another torch with the pinned {PINNED}: .ci/run runs it in .venv-floor",
)


def run_train(python: str, nproc: int, dump, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NGPU": str(nproc), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHON": python, "VIRTUAL_ENV": str(python).rsplit("/bin/", 1)[0]}  # fmt: skip
    cmd = ["bash", str(REPO / "run_train.sh"), *BASE_ARGS, *extra, "--job.dump_folder", str(dump)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{python}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc


def test_floor_torch_resumes_at_another_size_with_the_pinned_torchs_digests(tmp_path):
    assert PINNED_PYTHON.is_file(), f"{PINNED_PYTHON}: run `bash scripts/setup.sh` first"
    ensure_sample_data()
    run_train(sys.executable, 2, tmp_path / "floor2")
    ref = metrics(tmp_path / "floor2")
    assert sorted(ref) == list(range(1, STEPS + 1))
    runs = {}
    for name, python in (("floor1", sys.executable), ("pinned1", str(PINNED_PYTHON))):
        copy_checkpoint(tmp_path / "floor2", K, tmp_path / name)
        proc = run_train(python, 1, tmp_path / name)
        assert f"resumed from step {K} on 1 data-parallel rank(s)" in proc.stdout
        runs[name] = metrics(tmp_path / name)
        assert sorted(runs[name]) == list(range(K + 1, STEPS + 1)), name
    version = subprocess.run([str(PINNED_PYTHON), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert version.startswith(PINNED), version
    for step in range(K + 1, STEPS + 1):
        want = ref[step]
        for name, got in runs.items():
            assert got[step]["digest"] == want["digest"], (name, step)
            assert got[step]["loss"] == pytest.approx(want["loss"], rel=LOSS_RTOL), (name, step)
