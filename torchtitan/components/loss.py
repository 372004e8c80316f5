"""Token-level cross-entropy, summed so that the trainer normalises once per global batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def cross_entropy_sum(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sum of per-token losses, number of non-ignored tokens)``.

    ``logits [..., V]`` are upcast to float32; ``labels`` equal to -100 are
    ignored. Summing (not averaging) per micro-batch lets the trainer divide by
    the valid-token count of the whole global batch, so every token weighs the
    same whatever the micro-batch split or padding. Both results are tensors on
    the logits' device (no host sync).
    """
    loss_sum = F.cross_entropy(
        logits.flatten(0, -2).float(),
        labels.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    n_valid = (labels != IGNORE_INDEX).sum()
    return loss_sum, n_valid
