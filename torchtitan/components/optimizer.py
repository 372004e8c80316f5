"""AdamW construction."""

from __future__ import annotations

import torch
from torch import nn

from torchtitan.config.job_config import OptimizerConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW over ``model``'s parameters (call after ``fully_shard`` so it holds the
    sharded DTensors).

    Weight decay applies to matrices (ndim >= 2: linear weights and the
    embedding, which doubles as the output projection when tied) and not to
    vectors (norm gains, biases): decaying a gain pulls it towards 0 rather than
    towards its identity value 1. Group order is fixed (decay, then no-decay),
    so optimizer state dicts line up across runs.
    """
    if cfg.name != "AdamW":
        raise ValueError(f"optimizer.name {cfg.name!r} is not supported: expected 'AdamW'")
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": params, "weight_decay": wd}
        for params, wd in ((decay, cfg.weight_decay), (no_decay, 0.0))
        if params
    ]
    # foreach=True batches the per-parameter update kernels; it works for plain
    # tensors on CPU and GPU and for FSDP2 DTensors.
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=True
    )
