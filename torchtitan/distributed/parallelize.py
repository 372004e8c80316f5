"""Applying tensor parallelism, activation checkpointing, torch.compile and
FSDP2/HSDP to the model, in that order (as upstream: TP first, FSDP on top)."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from torchtitan.config.job_config import Training
from torchtitan.distributed.mesh import ParallelMesh
from torchtitan.distributed.tensor_parallel import apply_tensor_parallel
from torchtitan.models.llama3.model import Transformer, apply_activation_checkpointing

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def parallelize_model(model: Transformer, mesh: ParallelMesh, training: Training) -> Transformer:
    """Tensor-parallel plan over the TP mesh (if any), then FSDP over the
    data-parallel mesh: each transformer block, then the root (embeddings, norm,
    output). A 2-D (replicate, shard) mesh makes it HSDP. Works on a meta model."""
    if mesh.tp is not None:
        apply_tensor_parallel(model, mesh.tp)
    if training.activation_checkpoint == "full":
        apply_activation_checkpointing(model)
    if training.compile:
        # Per block and in place (Module.compile), so parameter names and
        # checkpoint keys are the same with or without compile.
        for block in model.layers.values():
            block.compile()
    mp = MixedPrecisionPolicy(
        param_dtype=_DTYPES[training.mixed_precision_param],
        reduce_dtype=_DTYPES[training.mixed_precision_reduce],
    )
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # The last block's parameters are needed right away by backward, so
        # keeping them unsharded after forward saves one all-gather.
        fully_shard(block, mesh=mesh.fsdp, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=mesh.fsdp, mp_policy=mp)
    return model
