"""FSDP2 / HSDP wrapping, model-agnostic: the model's blocks one by one, then the
root. Models call it last from their own `parallelize` (after tensor
parallelism, activation checkpointing and compile), as upstream does."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def apply_fsdp(
    roots: Sequence[torch.nn.Module],
    blocks: Sequence[torch.nn.Module],
    mesh: DeviceMesh,
    param_dtype: str,
    reduce_dtype: str,
    ignored: set[torch.nn.Parameter] | None = None,
) -> None:
    """Shard each of `blocks`, then each of `roots` (what is left: embeddings, final
    norm, output) over `mesh`; a 2-D (replicate, shard) mesh makes it HSDP. The
    roots are the modules the step calls: the model, or its pipeline stages.
    `param_dtype` / `reduce_dtype`: "bfloat16" or "float32"; `ignored`: parameters
    FSDP leaves alone (sharded otherwise, e.g. expert-parallel experts). Works on a
    meta model."""
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[param_dtype], reduce_dtype=_DTYPES[reduce_dtype])
    for i, block in enumerate(blocks):
        # The last block's parameters are needed right away by backward, so
        # keeping them unsharded after forward saves one all-gather.
        fully_shard(
            block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1,
            ignored_params=ignored or None,
        )  # fmt: skip
    for root in roots:
        fully_shard(root, mesh=mesh, mp_policy=mp, ignored_params=ignored or None)
