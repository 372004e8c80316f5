"""The training loop: `torchrun ... -m torchtitan.train --job.config_file X [--section.field v]`.

One process per device, on a (dp_replicate, dp_shard, tp) device mesh: FSDP2
or HSDP over the data-parallel dimensions, optionally tensor parallelism inside.
The loss is normalised by the valid tokens of the whole global batch, so
neither the mesh nor the micro-batch size changes what is optimised. The
recipe's data phases set each step's shape (`datasets/phase_timeline.py`): rows per
rank, seq_len and micro-batches follow them; a checkpoint is written at every
phase boundary, and the LR decay may span a phase.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchtitan.components.agreement import StepAgreement, agree
from torchtitan.components.checkpoint.manager import (
    CheckpointManager,
    read_loader_state,
    resume_step,
)
from torchtitan.components.divergence import DivergenceGuard, clip_grads, fold_loss_into_grads
from torchtitan.components.flops import model_flops_utilisation
from torchtitan.components.garbage_collection import ScheduledCollection
from torchtitan.components.goodput import Ledger, Report, open_ledger
from torchtitan.components.initial_load import initial_model_args, load_initial
from torchtitan.components.job_fence import Leave
from torchtitan.components.lr_scheduler import build_lr_scheduler, decay_window, lr_of_step
from torchtitan.components.metrics import (
    StepMetrics,
    peak_memory_gib,
    records_writer,
)
from torchtitan.components.model_setup import build_parallel_model, check_pipeline_layout
from torchtitan.components.optimizer import build_optimizer
from torchtitan.components.peer_state import load_from_peer, state_for_peer
from torchtitan.components.replica_group_steps import ReplicaGroupSteps
from torchtitan.components.source_metrics import global_source_counts, scheduled_shares
from torchtitan.components.step_driver import OneJob, StepDriver, data_parallel_sizes
from torchtitan.components.validation import validation_loss
from torchtitan.config.job_config import ConfigError, JobConfig, load_job_config
from torchtitan.datasets.dataloader import TrainDataLoader, check_data_startup, describe_work
from torchtitan.datasets.phase_timeline import DataTimeline, micro_rows
from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
from torchtitan.distributed.utils import DistInfo, exit_process, init_distributed
from torchtitan.models import check_model_name, get_model_spec
from torchtitan.runtime.guard import JobGuard, fail_before_start, set_phase, stop_requests
from torchtitan.runtime.preemption import exit_code as preemption_exit_code
from torchtitan.torch_compat import compile_problem, floor_message
from zephon import load_tokenizer

logger = logging.getLogger("torchtitan")


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
        force=True,
    )
    # torchft logs every quorum and commit (empty structured records), every failed
    # collective with a traceback and, on gloo too, NCCL's flight recorder: the
    # trainer's recovery line says what a user needs. TORCHTITAN_FT_DEBUG=1 shows
    # them (RUST_LOG, read at import, is torchft's native half).
    debug = os.environ.get("TORCHTITAN_FT_DEBUG") == "1"
    for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.CRITICAL)
    os.environ.setdefault("RUST_LOG", "info" if debug else "error")


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class Trainer:
    def __init__(self, cfg: JobConfig, dist_info: DistInfo, ledger: Ledger):
        self.cfg, self.info, self.ledger = cfg, dist_info, ledger
        self.goodput = Report(cfg.job.dump_folder, ledger)  # goodput.json, by the records' writer
        t = cfg.training
        dims = ParallelDims.from_config(cfg.parallelism, dist_info.world_size, dist_info.nodes)
        self.dp, self.rank, self.device = dims.dp, dist_info.rank, dist_info.device
        _seed(t, self.device)
        if t.compile and (why := compile_problem(self.device.type)):
            raise ConfigError(why)  # before anything is built

        tok = load_tokenizer(cfg.data.tokenizer)
        self.spec = get_model_spec(cfg.model.name)
        self.model_args = replace(
            initial_model_args(cfg, tok.vocab_size),
            attention_impl=_attention_impl(cfg.model.attention_impl, self.device),
        )
        self.resume_from = resume_step(cfg.checkpoint, cfg.job.dump_folder)
        start, dp = self.resume_from or 0, dims.dp
        self.plan, self.layouts = _plan_data(cfg, self.spec, self.model_args, dims, start)
        self.mesh = ParallelMesh(dims, self.device.type)
        # Who trains each step: this job alone, or each step's replica groups (torchft).
        self.driver: StepDriver = (
            ReplicaGroupSteps(
                cfg, self.rank, dist_info.world_size, dp, self.device, self._loader,
                self._own_state, self._load_own_state, start,
            )
            if cfg.fault_tolerance.enable
            else OneJob(self.rank, dp, self._loader)
        )  # fmt: skip
        self.data = self.driver.loader(self.mesh.dp_rank)

        # Refuse an incompatible resume before paying for the model.
        resume_doc: dict[str, Any] | None = None
        if self.resume_from is not None:
            resume_doc = read_loader_state(cfg.checkpoint, cfg.job.dump_folder, self.resume_from)
            self.data.check_resumable(resume_doc)

        built = build_parallel_model(
            self.spec, self.model_args, cfg, self.mesh, self.device, self._sum_over_batch
        )
        self.model, self.passes, self.hooks = built.model, built.passes, built.hooks
        self.expert_load: dict[str, float] | None = None  # the latest step's (mixture of experts)
        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        self.lr_scheduler = build_lr_scheduler(
            self.optimizer, cfg.lr_scheduler, max(t.steps, 1), self.plan.phases
        )
        self.ckpt = CheckpointManager(
            cfg.checkpoint, cfg.job.dump_folder, self.model, self.optimizer, self.lr_scheduler,
            boundaries=self.plan.boundaries(), shared=cfg.fault_tolerance.enable,
        )  # fmt: skip
        self.divergence = DivergenceGuard(
            t.max_nonfinite_steps, t.loss_spike_factor, log=self.rank == 0
        )
        self.last_loss: float | None = None  # the latest step's global loss, if computed
        self.step = 0
        if self.resume_from is not None and resume_doc is not None:
            with ledger.span("checkpoint_restore", self.resume_from):
                self.step = self.ckpt.load(self.resume_from)
                self.data.restore(resume_doc)
            self.driver.resumed(resume_doc)
            logger.info(
                f"resumed from step {self.step} on {dp} data-parallel rank(s) "
                f"({cfg.data.loader} loader, {self.mesh.describe()})"
            )
            if cfg.checkpoint.initial_load_path:
                logger.info(
                    f"checkpoint.initial_load_path {cfg.checkpoint.initial_load_path} not "
                    f"loaded: this run's own checkpoint (step {self.step}) wins"
                )
        elif cfg.checkpoint.initial_load_path:
            load_initial(cfg, self.model, self.optimizer, self.model_args)
        self.metrics = records_writer(None, *self.driver.records(self.step), cfg)  # if its turn
        self.collections = ScheduledCollection(t.gc_every_steps)  # last: turns Python's off

    def _loader(self, dp_rank: int, dp_size: int, recipe: str | None = None) -> TrainDataLoader:
        """This rank's loader at data-parallel coordinate `dp_rank` of `dp_size` (with
        replica groups: over all the groups of the step; a validation `recipe`: this
        group alone). Its TP peers and pipeline stages share one, run by the group's
        rank 0, which broadcasts each batch to the others (collective)."""
        m, val = self.mesh, recipe is not None
        return TrainDataLoader.from_config(
            self.cfg, dp_rank, dp_size, recipe, for_validation=val, dp_group=m.dp_group,
            coordinate_group=m.coordinate_group, device=self.device,
            groups=None if val else self.driver.groups,
        )  # fmt: skip

    def _own_state(self) -> dict[str, Any]:
        """The training state besides the data (what a joining replica group copies)."""
        state = state_for_peer(self.model, self.optimizer, self.lr_scheduler, self.divergence)
        return {**state, "step": self.step}

    def _load_own_state(self, state: dict[str, Any]) -> None:
        load_from_peer(state, self.model, self.optimizer, self.lr_scheduler, self.divergence)
        self.step = state["step"]

    def _forward_backward(self, batch: Any, n_valid_global: int) -> torch.Tensor:
        """This rank's passes over the step's batch (micro-batches: the phase's rows);
        returns its loss sum. FSDP averages gradients over data-parallel ranks;
        scaling by dp makes the result the gradient of (sum of token losses over
        the global batch) / valid tokens."""
        rows = self.plan.micro_rows(self.plan.phase_at(self.step))
        if self.hooks is not None:
            count = len(batch.micro_batches(rows))
            self.hooks.begin_step(n_valid_global, count, lambda: self.passes.evaluate(batch, rows))
        return self.passes.train(batch, rows, self.dp / max(n_valid_global, 1))

    def _sum_over_batch(self, t: torch.Tensor) -> None:
        """Collective: `t` summed in place over every rank of the global batch."""
        dist.all_reduce(t, group=self.mesh.dp_group)
        self.driver.sum_([t])

    def train_step(self, batch: Any, n_valid: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """One optimizer step: (this rank's loss sum, gradient norm, committed). The
        norm (whole mesh) and the global loss (when spikes are tracked, else reduced
        only when logged) decide whether the update is applied (divergence.py). With
        replica groups the gradients are summed over them (each holds its share of
        the global normalisation) and the update waits for every group's `commit`."""
        loss_sum = self._forward_backward(batch, n_valid)
        params = list(self.model.parameters())
        fold_loss_into_grads(loss_sum, params)
        self.expert_load = self.hooks.end_backward() if self.hooks is not None else None
        self.driver.sum_([_local(p.grad) for p in params if p.grad is not None])
        # Every gradient is a DTensor on the same mesh (FSDP x TP), so the norm
        # is taken across both; the stages' norms are then summed (PP).
        grad_norm = clip_grads(params, self.cfg.training.max_norm, self.mesh.pp_group)
        self.last_loss = None
        if self.divergence.tracks_loss or self.driver.loss_before_commit:
            self.last_loss = self._global_loss(loss_sum.clone(), n_valid)
        committed = self.driver.conclude(self.data)  # else it does not count: made again
        applied = committed and self.divergence.update_ok(
            self.step, float(grad_norm.item()), self.last_loss
        )
        if applied:
            self.optimizer.step()
        if self.hooks is not None:
            self.hooks.end_step(applied)
        if not committed:
            self.optimizer.zero_grad(set_to_none=True)
            return loss_sum, grad_norm, False
        self.lr_scheduler.step()  # a skipped step is still a step of the schedule
        self.optimizer.zero_grad(set_to_none=True)
        if self.divergence.should_stop():
            before = self.ckpt.newest_finite(below=self.divergence.safe_below)
            raise self.divergence.stop_error(self.step, before)
        return loss_sum, grad_norm, True

    def _batch_counts(self, batch: Any, stop: bool = False) -> StepAgreement:
        """Collective, the one all-reduce of every step (components/agreement.py), then
        over everyone who trains the step (the driver's `agree`)."""
        return self.driver.agree(self._group_counts(batch, stop))

    def _group_counts(self, batch: Any, stop: bool = False) -> StepAgreement:
        n_valid = batch.num_valid_tokens() if batch is not None else None
        return agree(n_valid, stop, self.mesh.dims.coordinate_size, self.device)

    def _global_loss(self, loss_sum: torch.Tensor, n_valid: int) -> float:
        """Collective: the global batch's mean token loss (called at log steps only)."""
        dist.all_reduce(loss_sum, group=self.mesh.loss_group)
        self.driver.sum_([loss_sum])
        return float(loss_sum.item()) / max(n_valid, 1)

    def validate(self) -> None:
        """Collective: the loss over the validation recipe (the same batches for every
        rank count), logged."""
        set_phase("validation", self.step)
        cfg, m = self.cfg, self.mesh
        t = cfg.training  # validation keeps the job's own shape, whatever the phase
        rows = micro_rows(t.local_batch_size, t.local_batch_tokens or None, t.seq_len)
        with self.ledger.span("validation", self.step):
            loss = validation_loss(
                self.passes, self._loader(m.dp_rank, m.dp_size, cfg.validation.recipe), rows,
                cfg.validation.steps, lambda b: self._group_counts(b).have_all, self.device,
                m.loss_group,
            )  # fmt: skip
        if self.metrics is not None:
            self.metrics.log_validation(self.step, loss)

    def run(self) -> int:
        cfg, steps = self.cfg, self.cfg.training.steps
        first = self.plan.phase_at(self.step + 1)
        logger.info(
            f"training steps {self.step + 1}..{steps} on {self.mesh.describe()}, device "
            f"{self.device.type}/{self.info.backend}, global batch {first.global_batch_size}"
            f" x {first.seq_len} tokens, micro-batch {self.plan.micro_rows(first)}"
        )
        for line in self.plan.report(self.layouts, self.step):
            logger.info(line)
        val_freq = cfg.validation.freq
        stops = stop_requests()
        redo = False  # the previous step did not count: this one makes it again
        while self.step < steps:
            t0 = time.perf_counter()
            self.ledger.open_step(self.step + 1)  # its quorum, data, compute (goodput.py)
            set_phase("quorum", self.step + 1)
            self.data = self.driver.begin(self.data, redo)  # who trains it, which lanes
            if (leave := self.driver.leave(self.step + 1, steps)) is not None:
                return _leave(leave, stops, self.rank, self.step)  # a stale replica group
            set_phase("data", self.step + 1)
            t_data = time.perf_counter()  # (the quorum's wait is not the data's)
            self.ledger.mark()
            batch = self.data.next_batch()
            data_wait = time.perf_counter() - t_data
            self.ledger.mark()
            set_phase("collective", self.step + 1)
            agreed = self._batch_counts(batch, stops is not None and stops.requested())
            if not agreed.have_all:
                logger.info(f"data exhausted after step {self.step}; stopping")
                self.ledger.drop_step()
                break
            self.step += 1
            # Everything logged is reduced only at log steps (the same on every rank).
            log_now = self.step % cfg.metrics.log_freq == 0 or self.step == steps
            digest = (
                self.data.global_digest(batch) if log_now and cfg.data.log_batch_digests else None
            )
            loss_sum, grad_norm, committed = self.train_step(batch, agreed.n_valid)
            redo = not committed
            if redo:
                self.step -= 1
                self.ledger.close_step(self.step + 1, committed=False)
                self.driver.failed(self.step + 1, t0)
                continue
            self.metrics = records_writer(self.metrics, *self.driver.committed(self.step, t0), cfg)
            self.collections.after_step(self.step)
            if log_now:
                _log_step(self, batch, loss_sum, grad_norm, agreed.n_valid, t0, data_wait, digest)
            self.ledger.close_step(self.step, committed=True)
            if (
                agreed.stop
                and stops is not None
                and (self.step < steps or not self.driver.stop_saves)
            ):
                return self._stop(stops)
            if cfg.validation.enable and val_freq > 0 and self.step % val_freq == 0:
                self.validate()
            if self.ckpt.should_save(self.step, steps) and self.driver.writes_checkpoints():
                set_phase("save", self.step)
                with self.ledger.span("checkpoint_save", self.step):  # its blocking part
                    self.ckpt.save(
                        self.step, lambda: self.driver.loader_state(self.data),
                        self.divergence.last_finite, loss=self.last_loss,
                    )  # fmt: skip
                if self.metrics is not None:  # (the records' writer)
                    self.goodput.refresh()
        with self.ledger.span("checkpoint_save", self.step):
            self.ckpt.wait()  # an asynchronous save still in flight becomes a resume point
        if cfg.validation.enable and (val_freq <= 0 or self.step % val_freq):
            self.validate()
        logger.info(describe_work(self.data.work_summary()))  # collective
        self.driver.finish(self.model, self.step)  # collective
        logger.info(f"training done at step {self.step}")
        return 0

    def _stop(self, stops: Any) -> int:
        """Every rank agreed to stop after this step: save it and end the job, or, where
        the others go on without this process (replica groups), just leave."""
        if not self.driver.stop_saves:
            return stops.finish(self.step, None)
        set_phase("save", self.step)
        with self.ledger.span("checkpoint_save", self.step):
            saved = self.ckpt.save_and_verify(
                self.step, self.data.gather_state, self.divergence.last_finite, self.last_loss
            )
        return stops.finish(self.step, saved)

    def close(self, code: int) -> None:
        self.collections.close()
        self.driver.close()
        self.data.close()
        self.ledger.end(code)
        if self.metrics is not None:
            self.metrics.log_goodput(self.step, self.goodput.final())
            self.metrics.close()


def _log_step(
    trainer: Trainer,
    batch: Any,
    loss_sum: torch.Tensor,
    grad_norm: torch.Tensor,
    n_valid: int,
    t0: float,
    data_wait: float,
    digest: str | None,
) -> None:
    """Collective: reduce the step's loss (and read the norm), then log on rank 0.
    Reading them syncs with the device, so the step time is the real one."""
    loss = trainer.last_loss  # reduced already when spikes are tracked
    if loss is None:
        loss = trainer._global_loss(loss_sum, n_valid)
    norm = float(_full(grad_norm).item())
    sources = global_source_counts(
        batch,
        trainer.data.source_names,
        trainer.device,
        trainer.mesh.dp_group,
        trainer.driver.groups,
    )
    dropped = trainer.data.bad_records_dropped()
    step_time = time.perf_counter() - t0
    if trainer.metrics is None:
        return
    phase = trainer.plan.phase_at(trainer.step)
    groups, lanes = trainer.driver.step_fields(phase.lanes)
    tokens = trainer.plan.step_tokens(phase)
    flops = trainer.spec.flops_per_token(trainer.model_args, phase.seq_len)
    mfu = model_flops_utilisation(flops, tokens, step_time, trainer.info.world_size, trainer.device)
    trainer.metrics.log(
        StepMetrics(
            step=trainer.step, loss=loss, grad_norm=norm, tokens=tokens, mfu=mfu,
            lr=lr_of_step(trainer.lr_scheduler, trainer.step), step_time_s=step_time,
            data_wait_s=data_wait, memory_gib=peak_memory_gib(trainer.device), digest=digest,
            source_tokens=sources[0] if sources else None,
            source_docs=sources[1] if sources else None,
            bad_records_dropped=dropped, skipped_updates=trainer.divergence.skipped,
            phase=phase.name if trainer.plan.named else None,
            scheduled_shares=scheduled_shares(phase, trainer.data.source_names),
            replica_groups=groups, lanes_per_group=lanes, expert_load=trainer.expert_load,
        )
    )  # fmt: skip
    trainer.metrics.log_goodput(trainer.step, trainer.goodput.take())  # made at a checkpoint


def _leave(leave: Leave, stops: Any, rank: int, step: int) -> int:
    """A replica group writes nothing more: its job finished without it (exit 0), or it
    is stale (the preemption status, with one line from the launcher: run it again to
    join)."""
    if leave.finished or stops is None or stops.folder is None:
        if rank == 0:
            logger.warning(leave.line)
        return 0 if leave.finished else preemption_exit_code()
    stops.write_record({"rank": rank, "step": step, "reason": leave.reason, "what": leave.line})
    return 0


def _seed(t: Any, device: torch.device) -> None:
    """torch's generator from training.seed; deterministic kernels if asked."""
    if t.deterministic:
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(t.seed)


def _plan_data(
    cfg: JobConfig, spec: Any, model_args: Any, dims: ParallelDims, start: int
) -> tuple[DataTimeline, dict[str | None, Any]]:
    """The data schedule and its layouts, checked from the step this run starts at:
    every phase still to come, at every data-parallel size the job may meet (with
    replica groups: each count of live groups; the last, all of them, is reported),
    before anything is built."""
    plan = DataTimeline.from_config(cfg)
    for seq_len in sorted({p.seq_len for p in plan.unfinished(start)}):
        spec.check_parallelism(model_args, dims, seq_len)
    for size in data_parallel_sizes(cfg.fault_tolerance, dims.dp):
        layouts = check_data_startup(cfg, size, model_args.max_seq_len, plan, start)
    rows = {}  # rows each data-parallel rank runs per step, by phase still to come
    for phase in plan.unfinished(start):
        layout = layouts.get(phase.name)
        name = f"phase {phase.name!r}" if phase.name is not None else "the data"
        rows[name] = layout.rows_per_rank if layout else -(-phase.global_batch_size // dims.dp)
    check_pipeline_layout(spec, model_args, cfg, dims, rows)
    decay_window(cfg.lr_scheduler, max(cfg.training.steps, 1), plan.phases)  # checked now
    return plan, layouts


def _attention_impl(choice: str, device: torch.device) -> str:
    """`model.attention_impl`: auto = FlexAttention on CUDA, the dense mask elsewhere
    (eager FlexAttention on CPU gains nothing and has no backward)."""
    if choice == "auto":
        return "flex" if device.type == "cuda" else "dense"
    if choice == "flex" and device.type != "cuda":
        raise ConfigError(
            "model.attention_impl = 'flex' needs a CUDA device: FlexAttention has no "
            "backward on CPU; use 'dense' or 'auto'"
        )
    return choice


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    _setup_logging(rank)
    too_old = floor_message()
    if too_old:  # (the launcher said it already; plain torchrun: rank 0 says it)
        exit_process(fail_before_start(rank, ConfigError(too_old)))
    try:
        cfg = load_job_config(argv)
        check_model_name(cfg)
    except ConfigError as exc:
        exit_process(fail_before_start(rank, exc))
    info = init_distributed()
    code = 0
    trainer: Trainer | None = None
    guard = JobGuard(cfg, info.rank, info.world_size)
    ledger = open_ledger(cfg, info.rank)
    try:
        guard.start()  # heartbeats; rank 0 takes the dump-folder lock
        trainer = Trainer(cfg, info, ledger)
        code = trainer.run()
    except BaseException as exc:
        ledger.failed()  # what follows is the failure's cost, not a step's
        # One message for the whole job, from whichever rank failed first (a
        # user-input error without a traceback); every other rank exits at once.
        code = guard.fail(exc)
    finally:
        if trainer is not None:
            trainer.close(code)
        else:
            ledger.end(code)
        guard.close(code)
    exit_process(code)
    return code


if __name__ == "__main__":
    main()
