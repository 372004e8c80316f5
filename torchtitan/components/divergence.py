"""The divergence guard: a step whose loss or gradient norm is not finite is not
applied, and a run that keeps producing such steps stops instead of training,
and checkpointing, garbage.

Every rank must take the same decision, or their optimizer states drift apart.
The gradient norm is reduced over the whole mesh, so it is the signal every rank
sees alike; a rank whose own loss is not finite poisons one element of its
gradients first (on the device, no sync), so the norm carries that too. A
skipped step still consumes its batch and advances the LR schedule, so batches
stay aligned with step numbers and a resume sees the same data.

Checkpoints: `params_finite` is the cheap check before a save (a reduction over
the local shards, then one all-reduce), so a checkpoint with non-finite
parameters is never written; the manifest records whether the saved step was
finite, and pruning keeps the newest finite one (see checkpoint/manager.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

logger = logging.getLogger("torchtitan")


class TrainingDiverged(RuntimeError):
    """Too many non-finite steps in a row: the run's settings (learning rate...) are
    at fault, so the job stops with the input-error status and is not restarted."""


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def fold_loss_into_grads(loss_sum: torch.Tensor, params: Iterable[torch.nn.Parameter]) -> None:
    """If this rank's loss is not finite, make one gradient element NaN, so the
    global gradient norm is not finite on every rank. A finite loss changes nothing
    (`where` keeps the element's bits)."""
    for p in params:
        if p.grad is None:
            continue
        local = _local(p.grad)
        if local.numel() == 0:
            continue
        first = (0,) * local.dim()  # an element of the storage, whatever the layout
        local[first] = torch.where(torch.isfinite(loss_sum), local[first], torch.nan)
        return


@torch.no_grad()
def clip_grads(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradients to `max_norm`; returns their global norm as a plain tensor,
    reduced over the whole mesh by the one all-reduce that clipping needs anyway, so
    reading it costs no further collective."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


@torch.no_grad()
def params_finite(params: Iterable[torch.nn.Parameter], device: torch.device) -> bool:
    """Collective over the world: whether every parameter element is finite."""
    bad = torch.zeros((), dtype=torch.int64, device=device)
    for p in params:
        local = _local(p)
        if local.numel():
            bad += (~torch.isfinite(local).all()).to(torch.int64)
    if dist.is_initialized():
        dist.all_reduce(bad)
    return int(bad.item()) == 0


class DivergenceGuard:
    """Counts non-finite steps and says whether to apply each update."""

    def __init__(self, max_in_a_row: int, log: bool = True):
        self.max_in_a_row = max_in_a_row
        self.log = log  # rank 0 only: the decision is the same everywhere
        self.in_a_row = 0
        self.skipped = 0
        self.first_bad = 0

    @property
    def last_finite(self) -> bool:
        """Whether the latest step's update was applied."""
        return self.in_a_row == 0

    def update_ok(self, step: int, grad_norm: float) -> bool:
        """Whether to apply step `step`'s update, given its (global) gradient norm."""
        if math.isfinite(grad_norm):
            self.in_a_row = 0
            return True
        if self.in_a_row == 0:
            self.first_bad = step
        self.in_a_row += 1
        self.skipped += 1
        if self.log:
            logger.warning(
                f"step {step}: loss or gradient norm not finite ({grad_norm}): update skipped "
                f"({self.in_a_row} in a row, training.max_nonfinite_steps = "
                f"{self.max_in_a_row}; {self.skipped} skipped in this run)"
            )
        return False

    def should_stop(self) -> bool:
        return self.in_a_row >= self.max_in_a_row

    def stop_error(self, step: int, newest_finite: tuple[int, str] | None) -> TrainingDiverged:
        """The one message of a divergence stop, naming the newest finite checkpoint
        (its step and folder), if there is one."""
        where = "no finite checkpoint was written"
        if newest_finite is not None:
            good, path = newest_finite
            where = (
                f"the newest finite checkpoint is step {good} ({path}): resume from it with "
                f"--checkpoint.load_step {good} and a smaller --optimizer.lr"
            )
        return TrainingDiverged(
            f"training diverged: the loss or gradient norm was not finite at steps "
            f"{self.first_bad}..{step} ({self.in_a_row} in a row, training.max_nonfinite_steps "
            f"= {self.max_in_a_row}); their updates were skipped and the job stops. {where}"
        )
