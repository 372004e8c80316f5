"""How one rank runs a step's batch through its model: the forward and backward
passes of training, and the forward passes of validation.

Two ways, one protocol, chosen once when the trainer starts:
- `MicroBatchLoop`: the whole model on this process; gradients accumulate over
  micro-batches of the phase's rows.
- `PipelineLoop`: this process holds pipeline stages; the schedule cuts the
  whole batch into pipeline micro-batches and runs them through every stage.
  Only the last stage computes a loss.

Either way the loss a rank reports is its sum of token losses (zero on a stage
without the loss), and the gradients are those of the global batch's summed
loss divided by its valid tokens, times the data-parallel size (FSDP averages
over the data-parallel ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.distributed.fsdp import FSDPModule

from torchtitan.components.loss import cross_entropy_sum
from torchtitan.distributed.device_io import to_device
from torchtitan.distributed.pipeline import PipelineSchedules
from torchtitan.models.spec import TrainingHooks


class ForwardBackward(Protocol):
    def train(self, batch: Any, rows: int, scale: float) -> torch.Tensor:
        """Forward and backward of this rank's batch in micro-batches of `rows`
        rows, the loss scaled by `scale`; returns this rank's loss sum."""
        ...

    def evaluate(self, batch: Any, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward only: (loss sum, valid tokens) this rank counts towards the
        global sums (both zero on a pipeline stage without the loss)."""
        ...


class MicroBatchLoop:
    """The whole model here: gradient accumulation over micro-batches.

    By default FSDP reduce-scatters after every micro-batch, so each rank only
    ever holds sharded gradients; `defer_grad_sync` reduces once, on the last
    micro-batch, at the cost of unsharded gradients meanwhile."""

    def __init__(
        self,
        model: torch.nn.Module,
        inputs: Callable[[Any, torch.device], dict[str, Any]],
        device: torch.device,
        defer_grad_sync: bool,
    ):
        self.model, self.inputs, self.device, self.defer = model, inputs, device, defer_grad_sync
        self.hooks: TrainingHooks | None = None
        """The model's hooks: each micro-batch's extra loss terms come from them."""

    def train(self, batch: Any, rows: int, scale: float) -> torch.Tensor:
        micro = batch.micro_batches(rows)
        loss_total = torch.zeros((), device=self.device)
        for i, mb in enumerate(micro):
            if self.defer:
                fsdp_root: FSDPModule = self.model  # type: ignore[assignment]
                fsdp_root.set_requires_gradient_sync(i == len(micro) - 1)
            logits = self.model(**self.inputs(mb, self.device))
            loss_sum, _ = cross_entropy_sum(logits, to_device(mb.labels, self.device))
            loss = loss_sum * scale
            extra = self.hooks.extra_loss() if self.hooks is not None else None
            (loss if extra is None else loss + extra).backward()
            loss_total += loss_sum.detach()
        return loss_total

    @torch.no_grad()
    def evaluate(self, batch: Any, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        for mb in batch.micro_batches(rows):
            logits = self.model(**self.inputs(mb, self.device))
            loss_sum, n_valid = cross_entropy_sum(logits, to_device(mb.labels, self.device))
            totals[0] += loss_sum.double()
            totals[1] += n_valid.double()
        return totals[0], totals[1]


class PipelineLoop:
    """This process's pipeline stages: the schedule runs the whole padded batch
    (the micro-batches of `rows` put back together), cut into pipeline
    micro-batches of `pipeline_parallel_microbatch_size` rows."""

    def __init__(
        self,
        schedules_of: Callable[[Callable[..., torch.Tensor]], PipelineSchedules],
        inputs: Callable[[Any, torch.device], tuple[torch.Tensor, dict[str, Any]]],
        device: torch.device,
    ):
        self.inputs, self.device = inputs, device
        self._scale = 1.0
        self._sums: list[torch.Tensor] = []
        self._counts: list[torch.Tensor] = []
        self.schedules = schedules_of(self._loss)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss_sum, n_valid = cross_entropy_sum(logits, labels)
        self._sums.append(loss_sum.detach())
        self._counts.append(n_valid)
        return loss_sum * self._scale

    def _run(self, batch: Any, rows: int, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        micro = batch.micro_batches(rows)  # padded like every rank's
        parts = [self.inputs(mb, self.device) for mb in micro]
        x = torch.cat([first for first, _ in parts])
        keywords = {k: torch.cat([kw[k] for _, kw in parts]) for k in parts[0][1]}
        labels = torch.cat([to_device(mb.labels, self.device) for mb in micro])
        self._sums, self._counts = [], []
        n = self.schedules.run(x, keywords, labels, train=train)
        zero = torch.zeros((), device=self.device)
        if not n:
            return zero, zero
        return torch.stack(self._sums[-n:]).sum(), torch.stack(self._counts[-n:]).sum()

    def train(self, batch: Any, rows: int, scale: float) -> torch.Tensor:
        self._scale = scale
        return self._run(batch, rows, train=True)[0]

    @torch.no_grad()
    def evaluate(self, batch: Any, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        loss, count = self._run(batch, rows, train=False)
        return loss.double(), count.double()
