"""End-to-end on CPU/gloo: HSDP and tensor parallelism train on the same global
batches as pure FSDP, and checkpoints move between meshes (DCP reshards,
Zephon redistributes lanes) with identical digests.

The pure-FSDP reference is the shared 4-process run (`zephon_reference`). The
wider matrix (8 processes as replicate 2 x shard 4, ...) is in
`scripts/mesh_resume_matrix.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from train_helpers import STEPS, K, copy_checkpoint, ensure_sample_data, metrics, ok, torchrun

pytestmark = pytest.mark.slow

# As in test_train_elastic: other reduction orders move the last bits only.
LOSS_RTOL = 1e-4
HSDP = ["--parallelism.data_parallel_replicate_degree", "2"]
TP = ["--parallelism.tensor_parallel_degree", "2"]


def assert_matches(got: dict, ref: dict, steps: range) -> None:
    assert sorted(got) == list(steps)
    for step in steps:
        assert got[step]["digest"] == ref[step]["digest"], step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
        assert got[step]["grad_norm"] == pytest.approx(ref[step]["grad_norm"], rel=LOSS_RTOL), step


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Full runs on 4 processes as (replicate 2, shard 2) -- saving asynchronously --
    and as (tp 2, shard 2); both checkpoint at step 3."""
    ensure_sample_data()
    runs = {}
    for name, extra in (("hsdp", [*HSDP, "--checkpoint.async_mode", "async"]), ("tp", TP)):
        dump = tmp_path_factory.mktemp(name)
        proc = ok(torchrun(4, dump, *extra))
        assert "dp_replicate" in proc.stdout
        runs[name] = dump
    return runs


@pytest.mark.parametrize("name", ["hsdp", "tp"])
def test_mesh_trains_on_the_same_batches_as_fsdp(zephon_reference, mesh_runs, name):
    _, ref = zephon_reference
    assert_matches(metrics(mesh_runs[name]), ref, range(1, STEPS + 1))
    step_dir = mesh_runs[name] / "checkpoint" / f"step-{K}"
    assert (step_dir / "COMPLETE.json").is_file()
    # The loader state is gathered over the data-parallel group, not the world.
    state = json.loads((step_dir / "dataloader.json").read_text())
    assert state["dp_size"] == {"hsdp": 4, "tp": 2}[name]


@pytest.mark.parametrize(
    ("saved_on", "nproc", "extra", "mesh_line"),
    [
        ("hsdp", 4, TP, "dp_replicate 1 x dp_shard 2 x tp 2"),  # HSDP -> TP x FSDP
        ("tp", 2, [], "dp_replicate 1 x dp_shard 2 x tp 1"),  # TP x FSDP -> FSDP on 2
    ],
)
def test_resume_on_another_mesh(
    zephon_reference, mesh_runs, tmp_path, saved_on, nproc, extra, mesh_line
):
    _, ref = zephon_reference
    copy_checkpoint(mesh_runs[saved_on], K, tmp_path)
    proc = ok(torchrun(nproc, tmp_path, *extra))
    assert f"resumed from step {K}" in proc.stdout and mesh_line in proc.stdout
    assert_matches(metrics(tmp_path), ref, range(K + 1, STEPS + 1))
    shutil.rmtree(tmp_path / "checkpoint")
