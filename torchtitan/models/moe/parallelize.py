"""How the mixture-of-experts model is parallelised: expert parallelism (the routed
experts split over groups of data-parallel ranks, expert_parallel.py), activation
checkpointing, per-block compile, then FSDP2 over the data-parallel mesh for
everything but the expert-parallel experts; and the checks a mesh must pass."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from torchtitan.config.job_config import ConfigError, Training
from torchtitan.distributed.fsdp import apply_fsdp
from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
from torchtitan.models.moe.args import MoEArgs
from torchtitan.models.moe.expert_parallel import shard_experts
from torchtitan.models.moe.model import MoETransformer


def parallelize_moe(
    model: MoETransformer,
    mesh: ParallelMesh,
    training: Training,
    stages: Sequence[nn.Module] | None = None,
) -> MoETransformer:
    """Works on a meta model. The expert-parallel expert weights stay out of FSDP
    (`model.expert_params`: the trainer's balance divides their gradients)."""
    model.expert_params = []
    if mesh.dims.ep > 1:
        model.expert_params = shard_experts(model, model.moe_layers(), mesh.fsdp, mesh.dims.ep)
    if training.activation_checkpoint == "full":
        for block in model.layers.values():
            block.checkpoint_activations = True
    if training.compile:
        for block in model.layers.values():
            block.compile()
    apply_fsdp(
        [model],
        list(model.layers.values()),
        mesh.fsdp,
        training.mixed_precision_param,
        training.mixed_precision_reduce,
        ignored=set(model.expert_params),
    )
    return model


def check_parallelism(args: MoEArgs, dims: ParallelDims, seq_len: int) -> None:
    """What the mesh must be for this model; every problem in one ConfigError."""
    problems = []
    if dims.tp > 1 or dims.pp > 1:
        problems.append(
            "parallelism: the moe model runs with data and expert parallelism only: expected "
            "tensor_parallel_degree and pipeline_parallel_degree of 1"
        )
    if args.n_experts % dims.ep:
        problems.append(
            f"parallelism.expert_parallel_degree = {dims.ep}: the model's {args.n_experts} "
            "experts are not divisible by it"
        )
    elif dims.ep > 1 and args.n_experts % dims.dp:
        problems.append(
            f"parallelism.expert_parallel_degree = {dims.ep}: each of the {dims.dp} "
            f"data-parallel ranks stores an equal share of the {args.n_experts} experts, so "
            "their count must be divisible by the data-parallel size"
        )
    if problems:
        raise ConfigError("; ".join(problems))
