"""Unattended runs (issue 17, the runtime half): the divergence guard, finite
checkpoints and pruning, stop requests and the stop-step agreement, the elastic
agent's policy, the dump-folder lock across restarts, and the launch options of
run_train.sh. Two end-to-end runs go through scripts/elastic_scenarios.py: an
elastic job on 2 processes over 3 lanes (uneven) that loses an agent and is then
stopped with Ctrl-C, and a run that diverges."""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from train_harness import data_digests, overrides, read_metrics
from train_helpers import checkpoint_state, copy_checkpoint, state_differences

from torchtitan.components.checkpoint import manifest
from torchtitan.components.checkpoint.manager import FAULT_ENV, CheckpointManager
from torchtitan.components.divergence import DivergenceGuard, fold_loss_into_grads
from torchtitan.config.job_config import Checkpoint, ConfigError, Parallelism, Training
from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
from torchtitan.models import get_model_spec
from torchtitan.models.llama3.args import get_model_args
from torchtitan.runtime import agent, preemption
from torchtitan.runtime.dump_lock import LOCK_FILE, DumpFolderLocked, DumpLock

REPO = Path(__file__).resolve().parents[1]


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


HANG_S = 120  # far above the few seconds a run takes: only mismatched collectives get here
MESHES = {"fsdp2": 1, "tp": 2}  # tensor-parallel degree over the 2 processes


def _poisoned_saves(rank: int, world: int, out: Path, tp: int, finite_first: bool) -> dict:
    """The llama3 model sharded over `world` processes (FSDP2, or TP when `tp` is 2)
    and a CheckpointManager over it in `out`: optionally one finite save (step 1),
    then, for every parameter and every rank in turn, a NaN or inf at a random
    element of that rank's local shard only, and a save of the next step."""
    spec = get_model_spec("llama3")
    args = get_model_args("debugmodel", vocab_size=64, dim=32, n_layers=3, n_heads=2,
                          n_kv_heads=2, multiple_of=16, max_seq_len=32)  # fmt: skip
    dims = ParallelDims.from_config(Parallelism(tensor_parallel_degree=tp), world)
    with torch.device("meta"):
        model = spec.build(args)
    spec.parallelize(model, ParallelMesh(dims, "cpu"), Training(mixed_precision_param="float32"))
    model.to_empty(device="cpu")
    model.init_weights(torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt = CheckpointManager(Checkpoint(), str(out), model, opt, sched)
    loader_calls: list[int] = []

    def loader_state(step: int) -> Any:
        return lambda: loader_calls.append(step) or {"step": step}

    saves = []
    if finite_first:
        saves.append({"param": "", "bad_rank": -1, "saved": ckpt.save(1, loader_state(1))})
    gen = torch.Generator().manual_seed(1234)  # the same draws on every rank
    step = 1
    for name, p in model.named_parameters():
        for bad_rank in range(world):
            step += 1
            with torch.no_grad():
                local = p.to_local()  # a view of this rank's piece (a DTensor's local shard)
                assert local.numel() > 0, name  # every rank holds a piece to poison
                flat = int(torch.randint(local.numel(), (), generator=gen))
                where = torch.unravel_index(torch.tensor(flat), local.shape)
                kept = local[where].clone()
                if rank == bad_rank:
                    local[where] = float("nan") if step % 2 else float("inf")
                saved = ckpt.save(step, loader_state(step))
                local[where] = kept
            saves.append({"param": name, "bad_rank": bad_rank, "saved": saved})
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    return {"saves": saves, "loader_calls": loader_calls, "sharded": sharded}


def _refuse_rank(rank: int, world: int, init_file: str, out: str) -> None:
    """One rank of the test below: both meshes in turn; what each save did, and the
    log lines, go to rank{rank}.json."""
    torch.set_num_threads(1)  # forked from pytest: never enter its OpenMP pool
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=30))  # fmt: skip
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("torchtitan").addHandler(handler)
    try:
        result = {}
        for mesh, tp in MESHES.items():
            result[mesh] = _poisoned_saves(rank, world, Path(out, mesh), tp, mesh == "fsdp2")
            result[mesh]["log"], lines[:] = list(lines), []
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_a_nonfinite_element_of_any_parameter_on_any_rank_refuses_the_save_on_every_rank(
    tmp_path,
):
    """Whatever parameter holds it and whichever rank's shard (FSDP2 and TP over 2
    processes): every rank refuses together (no step folder, no loader state taken,
    a warning naming the step), while the same manager saves a finite model."""
    world = 2
    # fork: the children start with torch and the trainer imported.
    ctx = torch.multiprocessing.start_processes(
        _refuse_rank, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world,
        join=False, start_method="fork",
    )  # fmt: skip
    deadline = time.monotonic() + HANG_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks hung: they did not take the same decision to save")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for mesh in MESHES:
        mine = [r[mesh] for r in results]
        assert all(m["sharded"] for m in mine), mine
        saves = mine[0]["saves"]
        assert all(m["saves"] == saves for m in mine), "the ranks decided differently"
        finite, poisoned = (saves[:1], saves[1:]) if mesh == "fsdp2" else ([], saves)
        assert all(s["saved"] for s in finite)
        assert len(poisoned) >= 20 * world and {s["bad_rank"] for s in poisoned} == {0, 1}
        assert [(s["param"], s["bad_rank"]) for s in poisoned if s["saved"]] == []
        written = ["step-1"] if finite else []
        folder = tmp_path / mesh / "checkpoint"
        assert (sorted(os.listdir(folder)) if folder.is_dir() else []) == written
        assert all(m["loader_calls"] == [1] * len(finite) for m in mine)
        steps = range(2, 2 + len(poisoned))
        refusals = [f"step {s}: parameters are not finite: checkpoint NOT written" for s in steps]
        assert [ln for ln in mine[0]["log"] if "not finite" in ln] == refusals
    assert (tmp_path / "fsdp2" / "checkpoint" / "step-1" / manifest.COMPLETE_FILE).is_file()


# -- the stop-step agreement over the whole world ------------------------------------------


def _agree_rank(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from torchtitan.runtime.agreement import agree

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))  # fmt: skip
    try:
        # Two tensor-parallel peers of one data-parallel rank (each its own
        # data-parallel group): both hold the same batch of 10 valid tokens.
        cpu = torch.device("cpu")
        quiet = agree(10, False, 2, cpu)
        asked = agree(10, rank == 1, 2, cpu)  # only the peer of TP coordinate 1 is asked
        empty = agree(None if rank == 1 else 10, False, 2, cpu)
        # The heartbeat keys' group id is the same on every rank (restart counts are
        # not, after a membership change).
        from torchtitan.runtime.monitor import worker_group_id

        result = [quiet.__dict__, asked.__dict__, empty.__dict__, worker_group_id()]
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_every_rank_agrees_on_the_stop_step_and_the_group_id(tmp_path):
    world = 2
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_agree_rank, args=(r, world, str(tmp_path / "s"), str(tmp_path)))
             for r in range(world)]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in procs] == [0] * world
    ids = set()
    for rank in range(world):
        quiet, asked, empty, group = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert quiet == {"have_all": True, "n_valid": 10, "stop": False}
        assert asked == {"have_all": True, "n_valid": 10, "stop": True}
        assert not empty["have_all"]
        ids.add(group)
    assert len(ids) == 1


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


# -- end to end through run_train.sh ----------------------------------------------------------


def _scenarios() -> Any:
    path = REPO / "scripts" / "elastic_scenarios.py"
    spec = importlib.util.spec_from_file_location("elastic_scenarios", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _three_lane_recipe(folder: Path) -> Path:
    """The sample recipe on 3 lanes: 2 processes do not divide it (uneven at the same
    cost as an even pair of processes; 8 lanes need 3 to be uneven)."""
    text = (REPO / "train_configs" / "data" / "sample_mix.toml").read_text()
    assert "lanes = 8" in text and "../../data/" in text
    path = folder / "three_lanes.toml"
    path.write_text(text.replace("lanes = 8", "lanes = 3").replace("../../data/", f"{REPO}/data/"))
    return path


@pytest.mark.slow
def test_an_uneven_elastic_job_goes_on_without_a_killed_agent_then_stops_on_ctrl_c(tmp_path):
    """Two agents of one process on 3 lanes (12 rows a step): rank 0 owns lane 0 and
    pads its 4 rows to rank 1's 8. kill -9 of the second launcher: its rank exits by
    itself, the first agent re-forms the job on 1 process from the newest checkpoint,
    written by the padded layout, with the same batches; then Ctrl-C saves the current
    step, tensor for tensor the one a run without the stop saves there, and exits 3."""
    es = _scenarios()
    steps, interval, rows = 14, 2, 12
    recipe = _three_lane_recipe(tmp_path)
    extra = {"training.steps": steps, "checkpoint.interval": interval, "data.recipe": recipe,
             "training.global_batch_size": rows}  # fmt: skip
    run = es.Run(tmp_path / "job", extra)
    host = run.agent(1)
    victim = run.agent(1)
    assert run.trained_at(2, 3, 300), run.output()[-3000:]
    assert (
        "padded layout: 3 lanes over 2 data-parallel ranks, rows per rank 4 on 1 rank, 8 on 1 rank"
        in run.output()
    )
    os.kill(victim.proc.pid, signal.SIGKILL)
    end = time.monotonic() + 300
    resumed, seen = None, 0.0
    while time.monotonic() < end and host.proc.poll() is None:
        found = re.search(r"resumed from step (\d+) ", host.output())
        seen = seen or (time.time() if found else 0.0)
        # Two steps trained by the re-formed job, then Ctrl-C.
        if found and sum(r["time"] > seen for r in read_metrics(run.dump).values()) >= 2:
            resumed = int(found.group(1))
            break
        time.sleep(0.1)
    assert resumed is not None, host.output()[-3000:]
    os.killpg(host.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    result = run.finish(300)
    out = host.output()
    assert result["exit"][0] == 3 and result["orphans"] == 0, (result, out[-3000:])
    # The step the stop saved holds that step's model, optimizer and schedule, tensor
    # for tensor: those of the same job trained on, on one process, from its checkpoint
    # before, and saved at that step by the regular path. The reference is one plain
    # process (no launcher to start) and stops once those files are written (the
    # crash hook): training on to the last step would cost a second a step.
    steps_saved = manifest.marked_steps(str(run.dump / "checkpoint"))
    saved, before = steps_saved[-1], steps_saved[-2]
    assert f"preempted at step {saved} (" in out, out[-3000:]  # the stop wrote `saved`
    ref = tmp_path / "reference"
    copy_checkpoint(run.dump, before, ref)
    fields = {**es.fi.BASE, **es.BASE, **extra, "checkpoint.interval": 1, "job.dump_folder": ref}
    config = ["--job.config_file", str(REPO / "train_configs" / "llama3_debugmodel.toml")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", FAULT_ENV: str(saved)}
    proc = subprocess.run([sys.executable, "-m", "torchtitan.train", *config, *overrides(fields)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    ref_out = proc.stdout + proc.stderr
    assert proc.returncode == 17, ref_out[-3000:]
    assert f"resumed from step {before} on 1 data-parallel rank(s)" in ref_out, ref_out[-3000:]
    got, want = (checkpoint_state(d / "checkpoint" / f"step-{saved}") for d in (run.dump, ref))
    assert sum(k.startswith("train.model.") for k in want) >= 10, sorted(want)
    assert any(k.endswith(".exp_avg") for k in want) and want["train.train_state.step"] == saved
    differ = state_differences(got, want)
    assert [k for k in differ if k.startswith("train.model.")] == []
    assert differ == []
    assert out.count("restarted the workers: rank") == 1
    assert run.formed()[-2:] == [2, 1]
    assert f"resumed from step {resumed} on 1 data-parallel rank(s)" in out
    # The resume point was written by the two padded ranks.
    state = run.dump / "checkpoint" / f"step-{resumed}" / "dataloader.json"
    assert json.loads(state.read_text())["dp_size"] == 2
    lost = max(m for t, m in run.steps if t < read_metrics(run.dump)[resumed + 1]["time"])
    assert resumed % interval == 0 and 0 <= lost - resumed <= interval
    # Ctrl-C: one line from the launcher, no traceback, the current step saved.
    assert "Traceback" not in out and out.count("SIGINT: the job finishes its current step") == 1
    stopped = max(read_metrics(run.dump))
    assert f"stopped at step {stopped} (SIGINT to the launcher)" in out
    marker = run.dump / "checkpoint" / f"step-{stopped}" / manifest.COMPLETE_FILE
    assert json.loads(marker.read_text())["finite"] is True
    ref = data_digests(stopped, 64, rows, recipe)
    assert fi_digests(run.dump, ref, stopped) is None


def fi_digests(dump: Path, ref: dict[int, str], last: int) -> str | None:
    """None if steps 1..last were each logged once with the data's digest."""
    got = read_metrics(dump)
    if sorted(got) != list(range(1, last + 1)):
        return f"steps {sorted(got)}"
    bad = [s for s in got if got[s]["digest"] != ref[s]]
    return f"digests differ at {bad}" if bad else None


@pytest.mark.slow
def test_a_diverging_run_stops_with_one_message_and_keeps_its_finite_checkpoint(tmp_path):
    es = _scenarios()
    r = es.divergence(tmp_path, {}, 300)
    assert r["exit"] == [2] and not r["traceback"] and r["orphans"] == 0, r
    assert len(r["error_lines"]) == 1 and r["names_finite"], r
    kept = r["checkpoints_finite"]
    # keep_latest_k 1: the newest checkpoint (not finite) and the newest finite one.
    assert len(kept) == 2 and sorted(kept.values()) == [False, True], kept
