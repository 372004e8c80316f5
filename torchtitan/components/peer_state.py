"""What a replica group that joins a fault-tolerant run copies from a live peer
(docs/fault_tolerance.md): model, optimizer, LR schedule and divergence guard,
as this process's local shards. Every group has the same mesh, so rank k of the
joining group takes exactly the shards rank k of the peer holds; nothing is read
from disk. The trainer adds its step and the loader state of every lane."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import _init_optim_state
from torch.distributed.tensor import DTensor

from torchtitan.components.divergence import DivergenceGuard


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def local_tree(obj: Any) -> Any:
    """`obj` with every DTensor replaced by this process's shard, on the CPU (what
    the transport sends)."""
    if isinstance(obj, torch.Tensor):
        return _local(obj).detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: local_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(local_tree(v) for v in obj)
    return obj


@torch.no_grad()
def _copy_into(dst: Any, src: Any, where: str) -> None:
    """Copy `src` (a local tree) into the live tensors of `dst`, bit for bit."""
    if isinstance(dst, torch.Tensor):
        local = _local(dst)
        if local.shape != src.shape:
            raise RuntimeError(
                f"{where}: a peer's shard has shape {tuple(src.shape)}, this group's "
                f"{tuple(local.shape)}: replica groups must have the same mesh"
            )
        local.copy_(src)
    elif isinstance(dst, dict):
        for k, v in dst.items():
            _copy_into(v, src[k], f"{where}.{k}")


def state_for_peer(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Any,
    guard: DivergenceGuard,
) -> dict[str, Any]:
    return {
        "model": local_tree(model.state_dict()),
        "optimizer": local_tree(optimizer.state_dict()),
        "lr_scheduler": lr_scheduler.state_dict(),
        "divergence": guard.state_dict(),
    }


def load_from_peer(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Any,
    guard: DivergenceGuard,
) -> None:
    _copy_into(model.state_dict(), state["model"], "model")
    # A group that never stepped has no optimizer state yet: make it (a zero step at
    # lr 0 changes no parameter), then overwrite it with the peer's.
    _init_optim_state(optimizer)
    mine = optimizer.state_dict()
    _copy_into(mine["state"], state["optimizer"]["state"], "optimizer")
    for group, theirs in zip(
        optimizer.param_groups, state["optimizer"]["param_groups"], strict=True
    ):
        for key, value in theirs.items():
            if key != "params":
                group[key] = value
    lr_scheduler.load_state_dict(state["lr_scheduler"])
    guard.load_state_dict(state["divergence"])
