"""End-to-end on CPU/gloo: HSDP and tensor parallelism train on the same global
batches as pure FSDP, and checkpoints move between meshes (DCP reshards,
Zephon redistributes lanes) with identical digests.

The pure-FSDP reference is the shared 4-process run (`zephon_reference`). The
wider matrix (8 processes as replicate 2 x shard 4, ...) is in
`scripts/experiments/mesh_resume_matrix.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.shared import once
from helpers.train import (
    STEPS,
    K,
    copy_checkpoint,
    ensure_sample_data,
    logged_steps,
    metrics,
    ok,
    torchrun,
)
from torch.distributed.checkpoint import FileSystemReader

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


def saved_pieces(step_dir: Path) -> set[int]:
    """Into how many pieces each model tensor of a step folder was saved (DCP
    metadata): its shard degree, times the tensor-parallel degree where TP splits it."""
    meta = FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    return {len(m.chunks) for key, m in meta.items() if key.startswith("train.model.")}


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Full runs on 4 processes as (replicate 2, shard 2) -- saving asynchronously --
    and as (tp 2, shard 2); both checkpoint at step 3. name -> (dump folder, stdout)."""
    ensure_sample_data()
    runs = {}
    for name, extra in (("hsdp", [*HSDP, "--checkpoint.async_mode", "async"]), ("tp", TP)):

        def make(folder: Path, extra: list[str] = extra) -> None:
            (folder / "stdout.txt").write_text(ok(torchrun(4, folder / "dump", *extra)).stdout)

        made = once(tmp_path_factory, f"mesh-{name}", make)  # (one run for both workers)
        runs[name] = (made / "dump", (made / "stdout.txt").read_text())
    return runs


@pytest.mark.parametrize(
    ("name", "mesh_line", "pieces"),
    [
        ("hsdp", "mesh dp_replicate 2 x dp_shard 2 x tp 1 (data-parallel size 4)", {2}),
        # TP splits the projections (2 x 2 pieces), not the norms (2).
        ("tp", "mesh dp_replicate 1 x dp_shard 2 x tp 2 (data-parallel size 2)", {2, 4}),
    ],
)
def test_mesh_trains_on_the_same_batches_as_fsdp(
    zephon_reference, mesh_runs, name, mesh_line, pieces
):
    ref_dump, ref = zephon_reference
    dump, stdout = mesh_runs[name]
    assert f"training steps 1..{STEPS} on {mesh_line}" in stdout
    assert_matches(metrics(dump), ref, range(1, STEPS + 1))
    step_dir = dump / "checkpoint" / f"step-{K}"
    assert (step_dir / "COMPLETE.json").is_file()
    # The degrees took effect, not just the log line: HSDP shards each tensor over
    # 2 ranks and replicates it; pure FSDP on the same 4 processes shards it in 4.
    assert saved_pieces(step_dir) == pieces
    assert saved_pieces(ref_dump / "checkpoint" / f"step-{K}") == {4}
    # The loader state is gathered over the data-parallel group, not the world.
    state = json.loads((step_dir / "dataloader.json").read_text())
    assert state["dp_size"] == {"hsdp": 4, "tp": 2}[name]


def test_async_save_is_staged_then_completed(mesh_runs):
    """The HSDP run saved asynchronously: each step was staged while training went
    on, and completed (loader state and marker) by the next save or the end."""
    dump, stdout = mesh_runs["hsdp"]
    for step in (K, STEPS):
        step_dir = dump / "checkpoint" / f"step-{step}"
        assert f"checkpoint {step_dir}: staged in " in stdout
        assert f"saved checkpoint {step_dir} (waited " in stdout
        assert (step_dir / "COMPLETE.json").is_file()
    _, tp_stdout = mesh_runs["tp"]
    assert "staged in" not in tp_stdout  # the default, synchronous save


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
    copy_checkpoint(mesh_runs[saved_on][0], K, tmp_path)
    proc = ok(torchrun(nproc, tmp_path, *extra))
    assert f"resumed from step {K}" in proc.stdout and mesh_line in proc.stdout
    assert logged_steps(tmp_path) == list(range(K + 1, STEPS + 1))
    assert_matches(metrics(tmp_path), ref, range(K + 1, STEPS + 1))
    shutil.rmtree(tmp_path / "checkpoint")
