"""Warmup-stable-decay learning-rate schedule, its decay optionally tied to a data
phase of the recipe (`lr_scheduler.decay_phase`, e.g. the anneal)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch.optim.lr_scheduler import LambdaLR

from torchtitan.config.job_config import ConfigError, LRSchedulerConfig

logger = logging.getLogger("torchtitan")


class PhaseSteps(Protocol):
    """What the schedule needs of a data phase (`zephon.recipe.phases.Phase`)."""

    name: str | None
    start_step: int
    end_step: int | None


def decay_window(
    cfg: LRSchedulerConfig, total_steps: int, phases: Sequence[PhaseSteps] = ()
) -> tuple[int, int]:
    """(first 0-based step of the decay, its number of steps).

    Default: the last round(decay_ratio * total_steps) steps, never before warmup
    ends. With `decay_phase`: exactly that phase's steps (up to total_steps), so
    its first step decays and its last reaches min_lr_factor; a ConfigError when
    the recipe has no such phase, or it overlaps warmup or starts after the run."""
    warmup = cfg.warmup_steps
    if not cfg.decay_phase:
        decay_start = max(warmup, total_steps - round(cfg.decay_ratio * total_steps))
        return decay_start, total_steps - decay_start
    named = [p for p in phases if p.name is not None]
    phase = next((p for p in named if p.name == cfg.decay_phase), None)
    if phase is None:
        known = ", ".join(repr(p.name) for p in named) or "none: it has no [[phase]] tables"
        raise ConfigError(
            f"lr_scheduler.decay_phase = {cfg.decay_phase!r} names no phase of the data "
            f"recipe (its phases: {known})"
        )
    start = phase.start_step
    end = total_steps if phase.end_step is None else min(phase.end_step, total_steps)
    if start >= total_steps:
        raise ConfigError(
            f"lr_scheduler.decay_phase = {cfg.decay_phase!r} starts after step {start}, but "
            f"training.steps is {total_steps}: the learning rate would never decay"
        )
    if start < warmup:
        raise ConfigError(
            f"lr_scheduler.decay_phase = {cfg.decay_phase!r} starts after step {start}, "
            f"inside the warmup (lr_scheduler.warmup_steps = {warmup}); shorten the warmup"
        )
    return start, end - start


def wsd_lr_factor(
    cfg: LRSchedulerConfig, total_steps: int, window: tuple[int, int] | None = None
) -> Callable[[int], float]:
    """Multiplier of the peak lr for 0-based step ``s`` (the lr used by training
    step ``s + 1``).

    - warmup, s < warmup_steps: (s + 1) / (warmup_steps + 1), rising from near 0
      (never exactly 0, which would waste a step) to reach 1 right after warmup;
    - stable: 1;
    - decay over `window` (`decay_window`: by default the last
      round(decay_ratio * total_steps) steps): linear or cosine from 1 down to
      min_lr_factor, reached exactly at the window's last step and held after it.
      Decay never starts before warmup ends.
    """
    warmup = cfg.warmup_steps
    decay_start, decay_steps = window or decay_window(cfg, total_steps)
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
    optimizer: torch.optim.Optimizer,
    cfg: LRSchedulerConfig,
    total_steps: int,
    phases: Sequence[PhaseSteps] = (),
) -> LambdaLR:
    """A LambdaLR following ``wsd_lr_factor``; call ``.step()`` once after each
    optimizer step. Its ``state_dict()`` holds only counters (``last_epoch``
    etc.), because the schedule is a closure rebuilt from the config (and the
    recipe's `phases`, for `decay_phase`)."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    window = decay_window(cfg, total_steps, phases)
    if cfg.decay_phase:
        logger.info(
            f"lr decay over steps {window[0] + 1}..{sum(window)} (phase {cfg.decay_phase!r})"
        )
    return LambdaLR(optimizer, wsd_lr_factor(cfg, total_steps, window))


def lr_of_step(scheduler: LambdaLR, step: int) -> float:
    """The learning rate training step `step` (counted from 1) used, whether or not
    the scheduler has stepped past it since (the first parameter group's)."""
    return scheduler.base_lrs[0] * scheduler.lr_lambdas[0](step - 1)
