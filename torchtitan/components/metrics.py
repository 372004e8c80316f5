"""Per-step training metrics: one log line, optional TensorBoard scalars and an
optional JSONL record. Meant for rank 0 only; the trainer reduces values first."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, replace
from typing import Any, TextIO

import torch

from torchtitan.components.source_metrics import PhaseMixture
from torchtitan.config.job_config import JobConfig, MetricsConfig
from zephon import atomic_write

logger = logging.getLogger("torchtitan")


@dataclass
class StepMetrics:
    step: int
    loss: float
    """Global-batch loss (already normalised by the global valid-token count)."""
    grad_norm: float
    lr: float
    tokens: int
    """Tokens in the step's global batch, summed over all ranks."""
    step_time_s: float
    data_wait_s: float
    """Time the step spent blocked waiting for batches."""
    memory_gib: float | None = None
    digest: str | None = None
    """Hex digest of the global batch, if the loader computes one."""
    source_tokens: dict[str, int] | None = None
    """Tokens of the global batch from each source, if the loader counts them."""
    source_docs: dict[str, int] | None = None
    """Documents starting in the global batch, per source."""
    mfu: float | None = None
    """Model FLOPs utilisation (GPU only)."""
    bad_records_dropped: int | None = None
    """Records replaced by empty documents so far (recipe bad_records = "drop")."""
    skipped_updates: int = 0
    """Steps of this run whose update was skipped (non-finite loss or gradient norm)."""
    phase: str | None = None
    """The recipe's data phase of this step (None: a recipe without phases)."""
    phase_shares: dict[str, float] | None = None
    """Token share of each source over the phase's logged steps so far."""
    scheduled_shares: dict[str, float] | None = None
    """The share the phase's weights give each source (0: paused)."""
    replica_groups: list[int] | None = None
    """Fault-tolerant runs: the replica ids of the groups that trained the step, in
    their data-parallel order."""
    lanes_per_group: list[int] | None = None
    """Fault-tolerant runs: how many lanes each of those groups held."""
    expert_load: dict[str, float] | None = None
    """Mixture of experts: the step's expert loads over the global batch (the smallest
    and largest share of an expert in a layer, the largest load over the mean)."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_s / self.step_time_s if self.step_time_s > 0 else 0.0


def format_step(m: StepMetrics) -> str:
    """The human-readable log line for one step."""
    parts = [
        f"step {m.step:>6}",
        f"loss {m.loss:8.4f}",
        f"grad_norm {m.grad_norm:7.4f}",
        f"lr {m.lr:.3e}",
        f"tok/s {m.tokens_per_s:,.0f}",
        f"data_wait {m.data_wait_s:.3f}s ({100 * m.data_wait_share:.1f}%)",
    ]
    if m.memory_gib is not None:
        parts.append(f"mem {m.memory_gib:.2f}GiB")
    if m.mfu is not None:
        parts.append(f"mfu {100 * m.mfu:.1f}%")
    if m.digest:
        parts.append(f"digest {m.digest[:16]}")
    if m.phase is not None:
        parts.append(f"phase {m.phase}")
    if m.source_tokens:
        total = sum(m.source_tokens.values()) or 1
        parts.append(
            "mix " + " ".join(f"{k} {100 * v / total:.0f}%" for k, v in m.source_tokens.items())
        )
    if m.phase_shares and m.scheduled_shares:
        so_far = " ".join(f"{k} {100 * v:.0f}%" for k, v in m.phase_shares.items())
        target = " ".join(f"{100 * v:.0f}%" for v in m.scheduled_shares.values())
        parts.append(f"{m.phase} so far {so_far} (target {target})")
    if m.bad_records_dropped:
        parts.append(f"bad records dropped {m.bad_records_dropped}")
    if m.skipped_updates:
        parts.append(f"updates skipped {m.skipped_updates}")
    if m.replica_groups is not None and m.lanes_per_group is not None:
        held = " ".join(
            f"{g}:{n}" for g, n in zip(m.replica_groups, m.lanes_per_group, strict=True)
        )
        parts.append(f"groups (id:lanes) {held}")
    if m.expert_load is not None:
        e = m.expert_load
        parts.append(
            f"experts {100 * e['expert_share_min']:.0f}-{100 * e['expert_share_max']:.0f}% "
            f"x{e['expert_imbalance']:.2f}"
        )
    return " | ".join(parts)


def _source_scalars(m: StepMetrics) -> dict[str, float]:
    out: dict[str, float] = {}
    total = sum((m.source_tokens or {}).values()) or 1
    for name, v in (m.source_tokens or {}).items():
        out[f"source_tokens/{name}"] = v
        out[f"source_token_share/{name}"] = v / total
    for name, v in (m.source_docs or {}).items():
        out[f"source_docs/{name}"] = v
    for name, v in (m.phase_shares or {}).items():
        out[f"phase_source_share/{name}"] = v
    for name, v in (m.scheduled_shares or {}).items():
        out[f"scheduled_source_share/{name}"] = v
    return out


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak CUDA memory allocated on ``device`` since the last reset, or None off-GPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def _finite_or_none(x: float) -> float | None:
    # Strict JSON has no NaN/Infinity; a diverged loss is recorded as null.
    return x if math.isfinite(x) else None


def drop_records_after(path: str, step: int) -> int:
    """Remove the JSONL records of steps after `step` (a resume trains them
    again, so they would appear twice); returns how many were removed."""
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            later = int(json.loads(line)["step"]) > step
        except (ValueError, KeyError, TypeError):
            later = False  # a torn last line from a crash, or not ours: keep as is
            if not line.endswith("\n"):
                continue  # torn: drop it
        if not later:
            keep.append(line)
    if len(keep) != len(lines):
        atomic_write(path, "".join(keep))
    return len(lines) - len(keep)


def trim_logs_to_start(cfg: MetricsConfig, dump_folder: str, start_step: int) -> int:
    """Before a run appends to the dump folder's JSONL logs: drop their records of
    the steps after `start_step`, the step this run starts from. A resume trains
    those steps again; so does a restart with no complete checkpoint (start 0),
    whose folder may hold the records of a run killed before its first save.
    Returns how many records were dropped."""
    if not cfg.jsonl_file:
        return 0
    names = (cfg.jsonl_file, "validation.jsonl")
    return sum(drop_records_after(os.path.join(dump_folder, n), start_step) for n in names)


class MetricsLogger:
    """Writes each step to the log, and to TensorBoard / a JSONL file when enabled.

    The JSONL file is appended to (a resumed run continues the same file) and
    flushed every line, so it is complete up to a crash. With data phases it
    also sums each phase's per-source tokens (seeded from the file's earlier
    records), so every step carries the phase's realised mixture so far.
    """

    def __init__(
        self,
        tb_folder: str | None = None,
        jsonl_path: str | None = None,
        val_jsonl_path: str | None = None,
        wandb_sink: Any = None,
    ) -> None:
        self._wandb = wandb_sink  # a WandbSink, or None
        self._tb: Any = None
        if tb_folder:
            # Imported lazily: tensorboard is an optional dependency.
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=tb_folder)
        self._jsonl: TextIO | None = None
        self._mixture = PhaseMixture.from_jsonl(jsonl_path) if jsonl_path else PhaseMixture()
        if jsonl_path:
            os.makedirs(os.path.dirname(jsonl_path) or ".", exist_ok=True)
            self._jsonl = open(jsonl_path, "a", encoding="utf-8")
        self._val_jsonl_path = val_jsonl_path

    @classmethod
    def from_config(
        cls, cfg: MetricsConfig, dump_folder: str, run_config: dict[str, Any] | None = None
    ) -> MetricsLogger:
        """TensorBoard, JSONL and wandb paths are taken relative to ``dump_folder``;
        ``run_config`` (the job config) is recorded in the wandb run."""
        tb = os.path.join(dump_folder, cfg.save_tb_folder) if cfg.enable_tensorboard else None
        jsonl = os.path.join(dump_folder, cfg.jsonl_file) if cfg.jsonl_file else None
        val = os.path.join(dump_folder, "validation.jsonl") if cfg.jsonl_file else None
        sink = None
        if cfg.enable_wandb:
            from torchtitan.components.wandb_logger import WandbSink

            sink = WandbSink(dump_folder, cfg.wandb_project, run_config)
        return cls(tb_folder=tb, jsonl_path=jsonl, val_jsonl_path=val, wandb_sink=sink)

    def log(self, m: StepMetrics) -> str:
        """Record one step; returns the log line."""
        if m.phase is not None and m.source_tokens and m.phase_shares is None:
            m = replace(m, phase_shares=self._mixture.add(m.phase, m.source_tokens))
        line = format_step(m)
        logger.info(line)
        if self._tb is not None or self._wandb is not None:
            scalars = {
                "loss": m.loss,
                "grad_norm": m.grad_norm,
                "lr": m.lr,
                "tokens_per_s": m.tokens_per_s,
                "data_wait_s": m.data_wait_s,
                "data_wait_share": m.data_wait_share,
            }
            if m.memory_gib is not None:
                scalars["memory_gib"] = m.memory_gib
            if m.mfu is not None:
                scalars["mfu"] = m.mfu
            scalars.update(_source_scalars(m))
            scalars.update({f"moe/{k}": v for k, v in (m.expert_load or {}).items()})
            if self._tb is not None:
                for name, value in scalars.items():
                    self._tb.add_scalar(f"train/{name}", value, m.step)
            if self._wandb is not None:
                self._wandb.log({f"train/{k}": v for k, v in scalars.items()}, m.step)
        if self._jsonl is not None:
            record = {
                "step": m.step,
                "loss": _finite_or_none(m.loss),
                "grad_norm": _finite_or_none(m.grad_norm),
                "lr": m.lr,
                "tokens_per_s": m.tokens_per_s,
                "step_time_s": m.step_time_s,
                "data_wait_s": m.data_wait_s,
                "digest": m.digest,
                "time": round(time.time(), 3),  # wall clock: when the step was logged
            }
            if m.source_tokens is not None:  # absent for loaders that do not count
                record["source_tokens"] = m.source_tokens
                record["source_docs"] = m.source_docs
            if m.mfu is not None:
                record["mfu"] = m.mfu
            if m.memory_gib is not None:
                record["memory_gib"] = m.memory_gib
            if m.bad_records_dropped is not None:
                record["bad_records_dropped"] = m.bad_records_dropped
            if m.skipped_updates:
                record["skipped_updates"] = m.skipped_updates
            if m.phase is not None:  # recipes with [[phase]] tables only
                record["phase"] = m.phase
                record["tokens"] = m.tokens
                if m.phase_shares is not None:
                    record["phase_shares"] = m.phase_shares
                    record["scheduled_shares"] = m.scheduled_shares
            if m.replica_groups is not None:
                record["replica_groups"] = m.replica_groups
                record["lanes_per_group"] = m.lanes_per_group
            if m.expert_load is not None:
                record.update(m.expert_load)
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        return line

    def log_validation(self, step: int, loss: float) -> str:
        """Record a validation loss: log line, TensorBoard, and `validation.jsonl`
        beside the training JSONL (whose rows are all training steps)."""
        line = f"validation step {step:>6} | loss {loss:8.4f}"
        logger.info(line)
        if self._tb is not None:
            self._tb.add_scalar("validation/loss", loss, step)
        if self._wandb is not None:
            self._wandb.log({"validation/loss": loss}, step)
        if self._val_jsonl_path:
            # Full precision (the log line shows 4 decimals): experiments compare these.
            with open(self._val_jsonl_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "val_loss": loss}) + "\n")
        return line

    def log_goodput(self, step: int, summary: Any) -> None:
        """The job's goodput so far (a `goodput.Summary`, or None) to TensorBoard and
        wandb: the productive share and the seconds of each cause of badput."""
        if summary is None:
            return
        scalars = {"goodput": summary.goodput, "productive_s": summary.productive_seconds}
        scalars.update({f"badput_{k}_s": v for k, v in summary.badput_seconds.items()})
        if self._tb is not None:
            for name, value in scalars.items():
                self._tb.add_scalar(f"goodput/{name}", value, step)
        if self._wandb is not None:
            self._wandb.log({f"goodput/{k}": v for k, v in scalars.items()}, step)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.close()
            self._wandb = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def records_writer(
    writer: MetricsLogger | None, writes: bool, trim_after: int | None, cfg: JobConfig
) -> MetricsLogger | None:
    """This rank's writer of the job's records, as the step driver says: opened when
    it is this rank's turn (the records after `trim_after` dropped first: steps
    trained again), closed when it is not, else `writer` as it is."""
    if writes and writer is None:
        if trim_after is not None:
            trim_logs_to_start(cfg.metrics, cfg.job.dump_folder, trim_after)
        return MetricsLogger.from_config(cfg.metrics, cfg.job.dump_folder, cfg.to_dict())
    if not writes and writer is not None:
        writer.close()
        return None
    return writer
