"""Unattended runs (issue 17, the runtime half), in process: the divergence guard,
finite checkpoints and pruning, stop requests, the elastic agent's policy, the
dump-folder lock across restarts, and the launch options of run_train.sh. The
checks across processes and the end-to-end runs are
tests/integration/test_train_unattended.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import REPO

from torchtitan.components.checkpoint import manifest
from torchtitan.components.divergence import DivergenceGuard, fold_loss_into_grads
from torchtitan.config.job_config import ConfigError, Parallelism
from torchtitan.distributed.mesh import ParallelDims
from torchtitan.runtime import agent, preemption
from torchtitan.runtime.dump_lock import LOCK_FILE, DumpFolderLocked, DumpLock

# -- divergence guard ---------------------------------------------------------------------------


def test_guard_skips_nonfinite_steps_and_stops_naming_the_finite_checkpoint():
    guard = DivergenceGuard(3, log=False)
    assert guard.update_ok(1, 1.5) and guard.last_finite
    assert not guard.update_ok(2, float("nan")) and not guard.last_finite
    assert guard.update_ok(3, 2.0)  # a finite step resets the count in a row
    assert [guard.update_ok(s, float("inf")) for s in (4, 5)] == [False, False]
    assert not guard.should_stop()
    assert not guard.update_ok(6, float("nan")) and guard.should_stop()
    assert guard.skipped == 4
    assert guard.safe_below == 3  # step 3's update produced step 4's bad loss
    msg = str(guard.stop_error(6, (2, "/d/checkpoint/step-2", 4.25)))
    assert "trouble began at step 4 (loss or gradient norm not finite" in msg
    assert "steps 4..6 were bad (3 in a row" in msg
    assert "The checkpoint of step 3, if any, holds the update that led to it" in msg
    assert "from before the trouble began is step 2 (/d/checkpoint/step-2, loss 4.25)" in msg
    assert "--checkpoint.load_step 2" in msg
    assert "No checkpoint from before step 3 was kept" in str(guard.stop_error(6, None))


def test_a_nonfinite_loss_poisons_the_gradient_norm_and_a_finite_one_changes_no_bit():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([-0.0, 1.5, -2.25])
    before = p.grad.clone()
    fold_loss_into_grads(torch.tensor(4.0), [p])
    assert torch.equal(p.grad, before) and torch.signbit(p.grad[0])  # bits, sign of zero too
    fold_loss_into_grads(torch.tensor(float("inf")), [p])
    assert torch.isnan(torch.nn.utils.get_total_norm([p.grad]))


# -- finite checkpoints and pruning -----------------------------------------------------------


def _marked(folder: Path, step: int, finite: bool | None) -> None:
    d = folder / f"step-{step}"
    d.mkdir(parents=True)
    doc = manifest.manifest_document(step, 1, {})
    if finite is None:
        del doc["finite"]  # written before the field existed
    else:
        doc["finite"] = finite
    (d / manifest.COMPLETE_FILE).write_text(json.dumps(doc))


def test_pruning_keeps_the_two_newest_finite_steps(tmp_path):
    for step, finite in ((1, True), (2, None), (4, True), (6, False), (8, False), (10, False)):
        _marked(tmp_path, step, finite)
    assert manifest.newest_finite(str(tmp_path)) == 4
    assert manifest.newest_finite(str(tmp_path), below=4) == 2  # a legacy manifest: finite
    # step 4 may hold the update that began the trouble: 2 is kept as well
    assert manifest.steps_to_prune(str(tmp_path), 2) == [1, 6]
    assert manifest.steps_to_prune(str(tmp_path), 0) == []
    (tmp_path / "step-4" / manifest.COMPLETE_FILE).unlink()
    assert manifest.newest_finite(str(tmp_path)) == 2
    assert manifest.steps_to_prune(str(tmp_path), 1) == [6, 8]


# -- stop requests --------------------------------------------------------------------------


def test_a_signal_or_the_launchers_mark_requests_a_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTITAN_ERROR_DIR", str(tmp_path))
    saved = {s: signal.getsignal(s) for s in preemption.STOP_SIGNALS}
    try:
        stops = preemption.StopRequests(rank=1)
        assert not stops.requested()
        (tmp_path / preemption.STOP_REQUEST).write_text(json.dumps({"signal": "SIGTERM"}))
        assert stops.requested() and stops.reason() == "SIGTERM to the launcher"
        (tmp_path / preemption.STOP_REQUEST).unlink()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stops.requested() and stops.reason() == "SIGUSR1"
        assert stops.finish(7, ("/d/step-7", 0.5)) == 0  # the launcher exits 3 for us
        rec = json.loads((tmp_path / "stopped-1.json").read_text())
        assert rec["step"] == 7 and "step-7 written and verified" in rec["what"]
        assert preemption.stop_records(str(tmp_path)) == [rec]
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_the_agents_own_sigterm_exits_at_once_and_a_second_signal_too(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTITAN_ERROR_DIR", str(tmp_path))

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(preemption.os, "_exit", exit_now)
    saved = {s: signal.getsignal(s) for s in preemption.STOP_SIGNALS}
    try:
        # The agent marks its folder before it stops its workers: not a preemption.
        (tmp_path / preemption.AGENT_STOPPING).touch()
        told: list[dict[str, Any]] = []
        stops = preemption.StopRequests(rank=1, on_stop_at_once=told.append)
        with pytest.raises(SystemExit, match=str(128 + signal.SIGTERM)):
            stops._on_signal(signal.SIGTERM, None)
        assert not stops.requested() and not told
        assert preemption.stop_records(str(tmp_path)) == []
        # A preemption: the first signal is a request, the second exits at once, with
        # the documented status (a scheduler requeues on it), a record for the
        # launcher and word to the peers (whose collectives are about to break).
        (tmp_path / preemption.AGENT_STOPPING).unlink()
        stops._on_signal(signal.SIGTERM, None)
        assert stops.requested()
        with pytest.raises(SystemExit, match="^3$"):
            stops._on_signal(signal.SIGINT, None)
        [rec] = preemption.stop_records(str(tmp_path))
        assert rec["rank"] == 1 and rec["at_once"] and rec["original"]
        assert rec["reason"] == "second SIGINT"
        assert told == [rec]
        assert agent.no_restart_reason({3}, str(tmp_path)) is not None  # a stop: no restart
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    monkeypatch.delenv("PREEMPT_EXIT_CODE", raising=False)
    assert preemption.exit_code() == 3
    monkeypatch.setenv("PREEMPT_EXIT_CODE", "7")
    assert preemption.exit_code() == 7


# -- the elastic agent's policy ---------------------------------------------------------------


def test_restart_records_are_cleared_and_the_root_cause_described(tmp_path):
    crash = {
        "rank": 2,
        "kind": "crash",
        "time": 2.0,
        "message": "RuntimeError: pair closed (raised at x.py:3 in f)\nTraceback (most recent "
        "call last):\n  File x\nRuntimeError: pair closed",
    }
    user = {"rank": 3, "kind": "user", "time": 3.0, "message": "bad.toml: no such file\nmore"}
    (tmp_path / "rank-2.json").write_text(json.dumps(crash))
    assert agent.describe_failure(str(tmp_path), None) == (
        "rank 2 failed (crash): RuntimeError: pair closed (raised at x.py:3 in f)"
    )
    (tmp_path / "rank-3.json").write_text(json.dumps(user))
    assert agent.describe_failure(str(tmp_path), None) == (
        "rank 3 failed (user): bad.toml: no such file"
    )
    (tmp_path / preemption.STOP_REQUEST).write_text("{}")
    agent.clear_records(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [preemption.STOP_REQUEST]  # a pending stop stays
    assert "no status" in agent.describe_failure(str(tmp_path), None)


def test_input_errors_and_pending_stops_are_not_retried(tmp_path):
    assert agent.no_restart_reason({1, -9}, str(tmp_path)) is None  # a crash: restart
    assert agent.no_restart_reason({2, 1}, str(tmp_path)) == "an input error (exit 2)"
    (tmp_path / preemption.STOP_REQUEST).write_text("{}")
    assert agent.no_restart_reason({1}, str(tmp_path)) == "a stop request"


# -- the dump-folder lock across restarts -----------------------------------------------------


def test_the_lock_of_an_earlier_attempt_of_this_job_is_taken_over_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-17")
    # The lock of rank 0 before the restart, on another host, its lease still fresh.
    old = {"host": "node-a", "pid": 1, "renewed": time.time(), "lease_s": 60, "run_id": "job-17"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(old))
    taker = DumpLock(str(tmp_path))
    taker.acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    # The old holder, if it still runs, must not renew over its successor.
    loser = DumpLock(str(tmp_path))
    loser.held, loser.me = True, {**loser.me, "pid": 1, "host": "node-a"}
    loser.renew()
    assert not loser.held and json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    taker.release()
    # Another job (another run id) is still refused while the lease is fresh.
    (tmp_path / LOCK_FILE).write_text(json.dumps({**old, "run_id": "job-18"}))
    with pytest.raises(DumpFolderLocked, match="pid 1 on node-a"):
        DumpLock(str(tmp_path)).acquire()


# -- the mesh follows the node count --------------------------------------------------------


def test_replicate_minus_one_is_one_replica_per_node():
    p = Parallelism(data_parallel_replicate_degree=-1)
    d = ParallelDims.from_config(p, 8, nodes=2)
    assert (d.dp_replicate, d.dp_shard, d.dp) == (2, 4, 8)
    d = ParallelDims.from_config(p, 4, nodes=1)  # after losing a node
    assert (d.dp_replicate, d.dp_shard) == (1, 4)
    with pytest.raises(ConfigError, match="one replica per node, but 6 processes on 4 node"):
        ParallelDims.from_config(p, 6, nodes=4)


# -- run_train.sh's launch options --------------------------------------------------------------


def _launch_args(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    full = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "RDZV_ID")}
    full |= {"PYTHON": str(fake), "VIRTUAL_ENV": str(tmp_path), "NGPU": "2", **env}
    return subprocess.run(["bash", str(REPO / "run_train.sh")], env=full, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_run_train_launches_a_node_range_elastically(tmp_path):
    one = _launch_args(tmp_path)
    assert "--standalone --nnodes 1 --max-restarts 0" in one.stdout
    ranged = _launch_args(tmp_path, NNODES="1:4", RDZV_ENDPOINT="10.0.0.1:29400")
    args = ranged.stdout
    assert "--nnodes 1:4" in args and "--rdzv-backend c10d" in args and "--standalone" not in args
    assert "--max-restarts 3" in args and "keep_alive_interval=5" in args
    run_id = args.split("--rdzv-id ")[1].split()[0]
    assert run_id.startswith("tt-")  # the same on every node: derived from the endpoint
    assert run_id in _launch_args(tmp_path, NNODES="1:4", RDZV_ENDPOINT="10.0.0.1:29400").stdout
    other = _launch_args(tmp_path, NNODES="1:4", RDZV_ENDPOINT="10.0.0.2:29400").stdout
    assert run_id not in other
    slurm = _launch_args(tmp_path, NNODES="2", RDZV_ENDPOINT="h:1", SLURM_JOB_ID="77").stdout
    assert "--rdzv-id slurm-77-0" in slurm and "--nnodes 2:2" in slurm
    requeued = _launch_args(
        tmp_path, NNODES="2", RDZV_ENDPOINT="h:1", SLURM_JOB_ID="77", SLURM_RESTART_COUNT="2"
    ).stdout
    assert "--rdzv-id slurm-77-2" in requeued  # etcd keeps the first launch's rendezvous closed
    for bad, why in (("1:x", "expected a node count N or a range"), ("1:4", "needs RDZV_ENDPOINT")):
        proc = _launch_args(tmp_path, NNODES=bad)
        assert proc.returncode == 2 and why in proc.stderr and not proc.stdout
