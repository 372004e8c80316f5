"""Warmup-stable-decay learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from torchtitan.config.job_config import LRSchedulerConfig


def wsd_lr_factor(cfg: LRSchedulerConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the peak lr for 0-based step ``s`` (the lr used by training
    step ``s + 1``).

    - warmup, s < warmup_steps: (s + 1) / (warmup_steps + 1), rising from near 0
      (never exactly 0, which would waste a step) to reach 1 right after warmup;
    - stable: 1;
    - decay, the last round(decay_ratio * total_steps) steps: linear or cosine from
      1 down to min_lr_factor, reached exactly at the final step (s = total_steps - 1)
      and held after it. Decay never starts before warmup ends.
    """
    warmup = cfg.warmup_steps
    decay_steps = round(cfg.decay_ratio * total_steps)
    decay_start = max(warmup, total_steps - decay_steps)
    decay_steps = total_steps - decay_start
    floor = cfg.min_lr_factor

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / (warmup + 1)
        if decay_steps <= 0 or s < decay_start:
            return 1.0
        progress = min(1.0, (s - decay_start + 1) / decay_steps)
        if cfg.decay_type == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1 - (1 - floor) * progress

    return factor


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: LRSchedulerConfig, total_steps: int
) -> LambdaLR:
    """A LambdaLR following ``wsd_lr_factor``; call ``.step()`` once after each
    optimizer step. Its ``state_dict()`` holds only counters (``last_epoch``
    etc.), because the schedule is a closure rebuilt from the config."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    return LambdaLR(optimizer, wsd_lr_factor(cfg, total_steps))
