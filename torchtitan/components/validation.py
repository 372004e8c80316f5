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

from torchtitan.components.loss import cross_entropy_sum
from torchtitan.distributed.device_io import to_device


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module,
    inputs: Callable[[Any, torch.device], dict[str, Any]],
    loader: Any,
    rows: int,
    steps: int,
    every_rank_has: Callable[[Any], bool],
    device: torch.device,
    dp_group: dist.ProcessGroup | None,
) -> float:
    """Mean token loss over `steps` batches of `loader` (-1: until it ends), in
    micro-batches of `rows`. `inputs` gives the model's arguments of a micro-batch
    (the model spec's); `every_rank_has(batch)` is the trainer's per-step collective
    (all ranks stop together when one runs out). Closes the loader."""
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    n = 0
    try:
        while steps < 0 or n < steps:
            batch = loader.next_batch()
            if not every_rank_has(batch):
                break
            for mb in batch.micro_batches(rows):
                logits = model(**inputs(mb, device))
                loss_sum, n_valid = cross_entropy_sum(logits, to_device(mb.labels, device))
                totals[0] += loss_sum.double()
                totals[1] += n_valid.double()
            n += 1
    finally:
        loader.close()
    dist.all_reduce(totals, group=dp_group)
    return float(totals[0] / totals[1].clamp(min=1))
