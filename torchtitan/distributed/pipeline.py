"""Pipeline parallelism, model-agnostic: which stages a process runs, the checks a
pipeline layout must pass, and the `torch.distributed.pipelining` schedule over
this process's stages for each batch shape.

Stages are numbered 0..n-1 along the model. A process of pipeline rank r runs
stage r (GPipe, 1F1B), or the stages r, r + pp, r + 2 pp, ... (Interleaved1F1B:
`stages_per_rank` "virtual" stages).

A schedule's buffers follow the micro-batch shape, so a data phase that changes
seq_len or rows gets a schedule of its own, built at its first step (design
§12); each is kept for the phases that come back to its shape. Gradients are
not scaled by the schedule: the loss function it is given already divides by
the global batch's valid tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    get_schedule_class,
)

from torchtitan.config.job_config import ConfigError, Parallelism

SINGLE_STAGE = ("GPipe", "1F1B")


def stages_per_rank(p: Parallelism) -> int:
    """The stages each process runs: the setting, or the schedule's default."""
    if p.pipeline_parallel_stages_per_rank:
        return p.pipeline_parallel_stages_per_rank
    return 1 if p.pipeline_parallel_schedule in SINGLE_STAGE else 2


def stage_ids(p: Parallelism, pp_rank: int) -> list[int]:
    """The stages pipeline rank `pp_rank` runs, in the order the schedule takes them."""
    pp, v = p.pipeline_parallel_degree, stages_per_rank(p)
    return [pp_rank + k * pp for k in range(v)]


def check_pipeline(p: Parallelism, rows_per_rank: dict[str, int]) -> None:
    """Whether the schedule fits: its stages per rank, and micro-batches that cut
    every phase's rows per rank (`{phase: rows}`) evenly, at least one per
    pipeline rank (a multiple of them for the multi-stage schedules). One
    ConfigError naming every problem."""
    pp, name, v = p.pipeline_parallel_degree, p.pipeline_parallel_schedule, stages_per_rank(p)
    mb = p.pipeline_parallel_microbatch_size
    problems = []
    if name in SINGLE_STAGE and v != 1:
        problems.append(
            f"{name} runs one stage per rank, not pipeline_parallel_stages_per_rank {v}"
        )
    for phase, rows in rows_per_rank.items():
        n_mb, rest = divmod(rows, mb)
        where = f"{phase}: {rows} rows per data-parallel rank"
        if rest:
            problems.append(f"{where} do not split into micro-batches of {mb} rows")
        elif n_mb < pp:
            problems.append(
                f"{where} give {n_mb} micro-batch(es) of {mb} rows, fewer than the {pp} "
                "pipeline ranks (the pipeline would never fill)"
            )
        elif name not in SINGLE_STAGE and n_mb % pp:
            problems.append(
                f"{where} give {n_mb} micro-batches, not a multiple of the {pp} pipeline "
                f"ranks, which {name} needs"
            )
    if problems:
        raise ConfigError(
            f"parallelism: pipeline_parallel_degree {pp} with {name}: " + "; ".join(problems)
            + " (change pipeline_parallel_microbatch_size, the batch size or the schedule)"
        )  # fmt: skip


class PipelineSchedules:
    """This process's stages and the schedule that runs them, one per batch shape."""

    def __init__(
        self,
        stages: Sequence[torch.nn.Module],
        p: Parallelism,
        pp_rank: int,
        group: dist.ProcessGroup,
        device: torch.device,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ):
        self.modules = list(stages)
        self.ids = stage_ids(p, pp_rank)
        self.n_stages = p.pipeline_parallel_degree * stages_per_rank(p)
        self.name, self.rows = p.pipeline_parallel_schedule, p.pipeline_parallel_microbatch_size
        self.group, self.device, self.loss_fn = group, device, loss_fn
        self._by_shape: dict[tuple[int, ...], Any] = {}

    @property
    def has_first(self) -> bool:
        return 0 in self.ids

    @property
    def has_last(self) -> bool:
        return self.n_stages - 1 in self.ids

    def _schedule(self, shape: tuple[int, ...]) -> Any:
        if shape not in self._by_shape:
            n_mb = shape[0] // self.rows
            stages = [
                PipelineStage(m, s, self.n_stages, self.device, group=self.group)
                for m, s in zip(self.modules, self.ids, strict=True)
            ]
            cls = get_schedule_class(self.name)
            arg = stages[0] if issubclass(cls, PipelineScheduleSingle) else stages
            self._by_shape[shape] = cls(
                arg, n_microbatches=n_mb, loss_fn=self.loss_fn, scale_grads=False
            )
        return self._by_shape[shape]

    def run(
        self, x: torch.Tensor, keywords: dict[str, Any], target: torch.Tensor, train: bool = True
    ) -> int:
        """One pass of the whole (padded) batch through the pipeline: forward and
        backward, or forward only (`train=False`). `x` goes to the first stage,
        `keywords` to every stage, `target` to the loss on the last stage; every
        process holds all three (the coordinate group's broadcast). Returns how
        many micro-batch losses this process computed (0 off the last stage): the
        loss function's last calls (a new schedule's shape inference calls it
        once before, on a dry run)."""
        schedule = self._schedule(tuple(x.shape))
        args = (x,) if self.has_first else ()
        target_or_none = target if self.has_last else None
        losses: list[torch.Tensor] = []
        if train:
            schedule.step(*args, target=target_or_none, losses=losses, **keywords)
        else:
            schedule.eval(*args, target=target_or_none, losses=losses, **keywords)
        return len(losses)
