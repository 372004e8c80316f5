"""Unattended runs (issue 17) across processes: a non-finite parameter on any rank
refuses the save on every rank (FSDP2 and TP over 2 processes), every rank agrees
on the stop step; and two end-to-end runs through
scripts/experiments/elastic_scenarios.py: an elastic job on 2 processes over 3 lanes
(uneven) that loses an agent and is then stopped with Ctrl-C, and a run that
diverges. The in-process checks are tests/unit/trainer/test_unattended.py."""

from __future__ import annotations

import datetime
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

import elastic_scenarios as es
import pytest
import torch
import torch.distributed as dist
from helpers import REPO
from helpers.spawned import leave_process_group
from helpers.train import checkpoint_state, copy_checkpoint, state_differences
from torch.distributed.tensor import DTensor

from harness.train import data_digests, overrides, read_metrics
from torchtitan.components.checkpoint import manifest
from torchtitan.components.checkpoint.manager import FAULT_ENV, CheckpointManager
from torchtitan.config.job_config import Checkpoint, Parallelism, Training
from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
from torchtitan.distributed.utils import exit_process
from torchtitan.models import get_model_spec
from torchtitan.models.llama3.args import get_model_args

HANG_S = 120  # far above the few seconds a run takes: only mismatched collectives get here
MESHES = {"fsdp2": 1, "tp": 2}  # tensor-parallel degree over the 2 processes


# -- finite checkpoints on every rank --------------------------------------------------------


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
    result = {}
    for mesh, tp in MESHES.items():
        result[mesh] = _poisoned_saves(rank, world, Path(out, mesh), tp, mesh == "fsdp2")
        result[mesh]["log"], lines[:] = list(lines), []
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    exit_process(0)  # barrier, then no gloo teardown after FSDP2 (it can crash a rank)


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

    from torchtitan.components.agreement import agree

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
        leave_process_group()


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


# -- end to end through run_train.sh ----------------------------------------------------------


def _three_lane_recipe(folder: Path) -> Path:
    """The sample recipe on 3 lanes: 2 processes do not divide it (uneven at the same
    cost as an even pair of processes; 8 lanes need 3 to be uneven)."""
    text = (REPO / "train_configs" / "data" / "sample_mix.toml").read_text()
    assert "lanes = 8" in text and "../../data/" in text
    path = folder / "three_lanes.toml"
    path.write_text(text.replace("lanes = 8", "lanes = 3").replace("../../data/", f"{REPO}/data/"))
    return path


def test_an_uneven_elastic_job_goes_on_without_a_killed_agent_then_stops_on_ctrl_c(tmp_path):
    """Two agents of one process on 3 lanes (12 rows a step): rank 0 owns lane 0 and
    pads its 4 rows to rank 1's 8. kill -9 of the second launcher: its rank exits by
    itself, the first agent re-forms the job on 1 process from the newest checkpoint,
    written by the padded layout, with the same batches; then Ctrl-C saves the current
    step, tensor for tensor the one a run without the stop saves there, and exits 3."""
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
    # The goodput ledger of both attempts: the steps after the resume point trained
    # twice count once as redone, the restart's gap and restore under their causes.
    doc = json.loads((run.dump / "goodput.json").read_text())
    assert (doc["attempts"], doc["steps_committed"]) == (2, stopped), doc
    # (and the step in flight when the agent stopped it, if rank 0 had begun it)
    assert lost - resumed <= doc["steps_redone"] <= lost - resumed + 1, (doc, lost, resumed)
    bad = doc["badput_seconds"]
    assert bad["between_attempts"] > 0 and bad["checkpoint_restore"] > 0, doc
    assert bad["steps_redone"] > 0 or lost == resumed, doc
    # The first attempt's teardown after its collective broke (the peer's report
    # awaited, 3 heartbeats at most) is recovery, wherever the break came: a step or a save.
    assert bad["recovery"] > 1.0, doc
    assert doc["productive_seconds"] + sum(bad.values()) == pytest.approx(
        doc["job_seconds"], abs=0.01
    )
    assert bad["other"] < 0.05 * doc["job_seconds"], doc


def fi_digests(dump: Path, ref: dict[int, str], last: int) -> str | None:
    """None if steps 1..last were each logged once with the data's digest."""
    got = read_metrics(dump)
    if sorted(got) != list(range(1, last + 1)):
        return f"steps {sorted(got)}"
    bad = [s for s in got if got[s]["digest"] != ref[s]]
    return f"digests differ at {bad}" if bad else None


def test_a_diverging_run_stops_with_one_message_and_keeps_its_finite_checkpoint(tmp_path):
    r = es.divergence(tmp_path, {}, 300)
    assert r["exit"] == [2] and not r["traceback"] and r["orphans"] == 0, r
    assert len(r["error_lines"]) == 1 and r["names_finite"], r
    kept = r["checkpoints_finite"]
    # keep_latest_k 1: the newest checkpoint (not finite) and the newest finite one.
    assert len(kept) == 2 and sorted(kept.values()) == [False, True], kept
