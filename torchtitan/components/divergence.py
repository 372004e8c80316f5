"""The divergence guard: a step whose loss or gradient norm is not finite is not
applied, and a run that keeps producing such steps stops instead of training,
and checkpointing, garbage.

Every rank must take the same decision, or their optimizer states drift apart.
The gradient norm is reduced over the whole mesh, so it is the signal every rank
sees alike; a rank whose own loss is not finite poisons one element of its
gradients first (on the device, no sync), so the norm carries that too. A
skipped step still consumes its batch and advances the LR schedule, so batches
stay aligned with step numbers and a resume sees the same data.

A loss spike counts as trouble too (`training.loss_spike_factor`): a finite global
loss above that many times the median of the last applied steps' losses is not
applied either. Finite but ruined parameters (a learning rate far too high)
are what a spike catches: the first bad step's loss was computed from the
previous step's update, so the checkpoint to go back to is one from at least two
steps before the trouble began, and the stop message names it with its loss.

Checkpoints: `params_finite` is the cheap check before a save (a reduction over
the local shards, then one all-reduce), so a checkpoint with non-finite
parameters is never written; the manifest records whether the saved step was
finite (and its loss), pruning keeps the two newest finite ones, and a plain
relaunch refuses a newest checkpoint that is not finite (see checkpoint/).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Iterable
from typing import Any

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
def clip_grads(
    params: list[torch.nn.Parameter],
    max_norm: float,
    pp_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Clip the gradients to `max_norm`; returns their global norm as a plain tensor,
    reduced over the whole mesh by the one all-reduce that clipping needs anyway, so
    reading it costs no further collective. Under pipeline parallelism each stage
    holds other parameters: their squared norms are summed over `pp_group`."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if pp_group is not None:
        squared = total.double() ** 2
        dist.all_reduce(squared, group=pp_group)
        total = squared.sqrt().to(total.dtype)
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


SPIKE_WINDOW = 32  # applied steps whose losses give the running median
SPIKE_WARMUP = 8  # losses seen before a spike can be called


class DivergenceGuard:
    """Counts bad steps (non-finite, or a loss spike) and says whether to apply each
    update. No collectives: it is fed the global gradient norm and loss."""

    def __init__(self, max_in_a_row: int, spike_factor: float = 0.0, log: bool = True):
        self.max_in_a_row = max_in_a_row
        self.spike_factor = spike_factor  # 0: spikes are not tracked
        self.log = log  # rank 0 only: the decision is the same everywhere
        self.in_a_row = 0
        self.skipped = 0
        self.first_bad = 0
        self.first_reason = ""
        self._losses: deque[float] = deque(maxlen=SPIKE_WINDOW)

    def state_dict(self) -> dict[str, Any]:
        """What a replica group that joins copies from a live peer (the counts and the
        losses the spike median is taken over)."""
        names = ("in_a_row", "skipped", "first_bad", "first_reason")
        return {**{n: getattr(self, n) for n in names}, "losses": list(self._losses)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("in_a_row", "skipped", "first_bad", "first_reason"):
            setattr(self, name, state[name])
        self._losses = deque(state["losses"], maxlen=SPIKE_WINDOW)

    @property
    def tracks_loss(self) -> bool:
        """Whether every step's global loss is needed (`update_ok`'s `loss`)."""
        return self.spike_factor > 0

    @property
    def last_finite(self) -> bool:
        """Whether the latest step's update was applied."""
        return self.in_a_row == 0

    def _trouble(self, grad_norm: float, loss: float | None) -> str | None:
        """Why a step must not be applied, or None."""
        if not math.isfinite(grad_norm) or (loss is not None and not math.isfinite(loss)):
            return f"loss or gradient norm not finite (norm {grad_norm}, loss {loss})"
        if loss is None or not self.tracks_loss or len(self._losses) < SPIKE_WARMUP:
            return None
        median = statistics.median(self._losses)
        if loss > self.spike_factor * median:
            return (
                f"loss spike: {loss:.4g} > {self.spike_factor:g} x {median:.4g}, the median of "
                f"the last {len(self._losses)} applied steps (training.loss_spike_factor)"
            )
        return None

    def update_ok(self, step: int, grad_norm: float, loss: float | None = None) -> bool:
        """Whether to apply step `step`'s update, given its global gradient norm and,
        when spikes are tracked, its global mean token loss."""
        why = self._trouble(grad_norm, loss)
        if why is None:
            self.in_a_row = 0
            if loss is not None:
                self._losses.append(loss)
            return True
        if self.in_a_row == 0:
            self.first_bad, self.first_reason = step, why
        self.in_a_row += 1
        self.skipped += 1
        if self.log:
            logger.warning(
                f"step {step}: {why}: update skipped ({self.in_a_row} in a row, "
                f"training.max_nonfinite_steps = {self.max_in_a_row}; {self.skipped} skipped "
                "in this run)"
            )
        return False

    def should_stop(self) -> bool:
        return self.in_a_row >= self.max_in_a_row

    @property
    def safe_below(self) -> int:
        """Checkpoints of steps below this are from before the trouble began: the
        first bad step's loss came from the update of the step before it."""
        return self.first_bad - 1

    def stop_error(
        self, step: int, before: tuple[int, str, float | None] | None
    ) -> TrainingDiverged:
        """The one message of a divergence stop. `before`: (step, folder, loss) of the
        newest finite checkpoint from before the trouble began, if there is one."""
        if before is not None:
            good, path, loss = before
            at = f", loss {loss:.4g}" if loss is not None else ""
            where = (
                f"The newest checkpoint from before the trouble began is step {good} ({path}"
                f"{at}): resume from it with --checkpoint.load_step {good} and a smaller "
                "--optimizer.lr"
            )
        else:
            where = (
                f"No checkpoint from before step {self.safe_below} was kept: start again "
                "(another --job.dump_folder) with a smaller --optimizer.lr"
            )
        led = (
            f" The checkpoint of step {self.safe_below}, if any, holds the update that led to it."
            if self.safe_below >= 1
            else ""
        )
        return TrainingDiverged(
            f"training diverged: trouble began at step {self.first_bad} "
            f"({self.first_reason}); steps {self.first_bad}..{step} were bad ({self.in_a_row} "
            f"in a row, training.max_nonfinite_steps = {self.max_in_a_row}), their updates "
            f"were skipped and the job stops.{led} {where}"
        )
