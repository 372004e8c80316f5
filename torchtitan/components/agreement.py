"""What every rank must agree on before a step, in the one all-reduce each step
runs anyway: whether every rank has a batch, the global batch's valid tokens
(the loss is normalised by them), and whether any rank was asked to stop.

The reduction runs over the whole world, not the data-parallel group: a stop
request can reach any rank (a signal to one process, a launcher's mark on one
node), and a rank of another tensor-parallel coordinate is in another
data-parallel group. Tensor-parallel peers hold the same batch, so the token
sum counts each batch `tp` times and is divided back (exact: integers in
float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class StepAgreement:
    have_all: bool
    """Every rank has a batch for this step (else the data is exhausted)."""
    n_valid: int
    """Valid (non-ignored) tokens of the global batch."""
    stop: bool
    """Some rank was asked to stop: every rank trains this step, saves it and exits."""


def agree(n_valid_local: int | None, stop: bool, tp: int, device: torch.device) -> StepAgreement:
    """Collective over the world; `n_valid_local` is None for a rank without a batch."""
    have = n_valid_local is not None
    local = [float(have), float(n_valid_local or 0), float(stop)]
    counts = torch.tensor(local, dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    have_sum, n_valid, stops = counts.tolist()
    return StepAgreement(int(have_sum) == dist.get_world_size(), int(n_valid) // tp, stops > 0)
