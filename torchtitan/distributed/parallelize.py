"""Applying FSDP2, activation checkpointing and torch.compile to the model."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from torchtitan.config.job_config import Training
from torchtitan.models.llama3.model import Transformer, apply_activation_checkpointing

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def parallelize_model(model: Transformer, mesh: DeviceMesh, training: Training) -> Transformer:
    """Shard each transformer block, then the root (embeddings, norm, output),
    over the data-parallel mesh. Works on a meta-device model."""
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
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model
