"""Building this process's model on the mesh: what it holds (the whole model, or
its pipeline stages' share under their own names), parallelised, initialised from
the seed, and the `ForwardBackward` that runs a batch through it.

Under pipeline parallelism the model spec's `pipeline` splits the model
(`models/<name>/pipeline.py`); the stages are the FSDP roots and the schedule
calls them (`distributed/pipeline.py`). The model object the optimizer,
checkpoints and clipping see is the pruned model, whose parameter names are the
whole model's, so checkpoints move between pipeline degrees by name.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from torchtitan.components.forward_backward import ForwardBackward, MicroBatchLoop, PipelineLoop
from torchtitan.config.job_config import ConfigError, JobConfig
from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
from torchtitan.distributed.pipeline import (
    PipelineSchedules,
    check_pipeline,
    stage_ids,
    stages_per_rank,
)
from torchtitan.models.spec import ModelSpec, TrainingHooks, count_parameters

logger = logging.getLogger("torchtitan")


@dataclass
class ParallelModel:
    model: torch.nn.Module
    """What this process holds, under the whole model's parameter names."""
    passes: ForwardBackward
    hooks: TrainingHooks | None = None
    """The model's own work around each step (a mixture of experts' balance)."""


def check_pipeline_layout(
    spec: ModelSpec, args: Any, cfg: JobConfig, dims: ParallelDims, rows_per_rank: dict[str, int]
) -> None:
    """Before anything is built: the model can split into the stages, and the
    schedule's micro-batches fit every phase still to come. ConfigErrors."""
    if dims.pp == 1:
        return
    if spec.pipeline is None:
        raise ConfigError(
            f"parallelism.pipeline_parallel_degree = {dims.pp}: model {spec.name!r} has no "
            "pipeline split; train it with pipeline_parallel_degree = 1 (FSDP, HSDP, TP)"
        )
    check_pipeline(cfg.parallelism, rows_per_rank)
    counts = spec.pipeline.check(args, dims.pp * stages_per_rank(cfg.parallelism))
    if len(set(counts)) > 1:
        logger.info(
            f"pipeline: {args.n_layers} layers do not split evenly over {len(counts)} "
            f"stages: {', '.join(map(str, counts))} layers"
        )


def build_parallel_model(
    spec: ModelSpec,
    args: Any,
    cfg: JobConfig,
    mesh: ParallelMesh,
    device: torch.device,
    reduce: Callable[[torch.Tensor], None] | None = None,
) -> ParallelModel:
    """The model of this process, parallelised and initialised, with its passes and
    hooks; `reduce` sums a tensor over the global batch's ranks in place (for the
    hooks)."""
    with torch.device("meta"):
        model = spec.build(args)
    logger.info(
        f"model {spec.name}/{cfg.model.flavor}: {count_parameters(model):,} parameters, "
        f"{spec.describe(args)}"
    )
    training = cfg.training
    if device.type == "cpu" and training.mixed_precision_param == "bfloat16":
        logger.info("CPU run: computing in float32 (bfloat16 matmuls are slow on CPU)")
        training = replace(training, mixed_precision_param="float32")
    p = cfg.parallelism
    stages = None
    if mesh.pp is not None and spec.pipeline is not None:
        ids = stage_ids(p, mesh.pp_rank)
        stages = spec.pipeline.split(model, ids, mesh.dims.pp * stages_per_rank(p))
        logger.info(
            f"pipeline: {p.pipeline_parallel_schedule}, {len(ids) * mesh.dims.pp} stages, "
            f"micro-batches of {p.pipeline_parallel_microbatch_size} row(s); pipeline rank 0 "
            f"runs stage(s) {', '.join(map(str, ids))}"
        )
        spec.parallelize(model, mesh, training, stages=stages)
    else:
        spec.parallelize(model, mesh, training)
    model.to_empty(device=device)
    # Initialise from the seed on the CPU generator, full tensor by full tensor,
    # so the weights are the same for every data-parallel size and pipeline split.
    model.init_weights(torch.Generator(device="cpu").manual_seed(training.seed))
    if training.log_init_digest:
        h = hashlib.sha256()
        for name, param in model.named_parameters():
            full = param.detach()
            full = full.full_tensor() if isinstance(full, DTensor) else full
            h.update(name.encode())
            h.update(full.float().cpu().numpy().tobytes())
        logger.info(f"initial weights sha256 {h.hexdigest()}")
    passes: ForwardBackward
    if stages is not None and mesh.pp_group is not None and spec.pipeline is not None:
        pp_group, pp_rank = mesh.pp_group, mesh.pp_rank
        passes = PipelineLoop(
            lambda loss: PipelineSchedules(stages, p, pp_rank, pp_group, device, loss),
            spec.pipeline.inputs,
            device,
        )
    else:
        passes = MicroBatchLoop(model, spec.inputs, device, p.defer_grad_sync)
    hooks = None
    if spec.training_hooks is not None and reduce is not None:
        hooks = spec.training_hooks(model, cfg, mesh, reduce)
        passes.hooks = hooks
    return ParallelModel(model, passes, hooks)
