"""The validation loss: the same batches for every rank count, summed exactly.

Every rank runs its rows of each validation batch (padded like training rows,
so collectives line up), and the loss is the sum of token losses over all
ranks divided by the valid tokens of all ranks: the same number whatever the
data-parallel size, up to reduction order (docs/design.md §7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from torchtitan.components.forward_backward import ForwardBackward


@torch.no_grad()
def validation_loss(
    passes: ForwardBackward,
    loader: Any,
    rows: int,
    steps: int,
    every_rank_has: Callable[[Any], bool],
    device: torch.device,
    loss_group: dist.ProcessGroup | None,
) -> float:
    """Mean token loss over `steps` batches of `loader` (-1: until it ends), in
    micro-batches of `rows`, run by `passes` (forward only); `every_rank_has(batch)`
    is the trainer's per-step collective (all ranks stop together when one runs
    out); `loss_group` counts every batch's loss once. Closes the loader."""
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    n = 0
    try:
        while steps < 0 or n < steps:
            batch = loader.next_batch()
            if not every_rank_has(batch):
                break
            loss_sum, n_valid = passes.evaluate(batch, rows)
            totals[0] += loss_sum
            totals[1] += n_valid
            n += 1
    finally:
        loader.close()
    dist.all_reduce(totals, group=loss_group)
    return float(totals[0] / totals[1].clamp(min=1))
