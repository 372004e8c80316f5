"""The merge projector: merge x merge patch vectors -> one decoder embedding.

The patches of each merge window are contiguous rows (zephon/images/pixels/patches.py
orders them so), and windows follow in row-major order, which is the order of
the image's placeholder tokens. So merging is a reshape of [N, dim] to
[N / merge², merge² * dim]: row k is window k, its patches side by side in
row-major order. Then LayerNorm per patch before the reshape, and a two-layer
MLP (GELU) to the decoder's width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan.models.vlm.vision import LayerNorm, Linear


class MergeProjector(nn.Module):
    """FQNs: `norm`, `fc1`, `fc2`."""

    def __init__(self, vision_dim: int, merge: int, hidden_dim: int, out_dim: int, eps: float):
        super().__init__()
        self.window = merge * merge
        self.norm = LayerNorm(vision_dim, eps=eps)
        self.fc1 = Linear(self.window * vision_dim, hidden_dim)
        self.fc2 = Linear(hidden_dim, out_dim)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """`[N, vision_dim]` patch vectors, windows contiguous -> `[N / merge², out_dim]`."""
        n, dim = patches.shape
        if n % self.window:
            raise ValueError(
                f"{n} patch vectors are not a whole number of {self.window}-patch windows"
            )
        windows = self.norm(patches).reshape(n // self.window, self.window * dim)
        return self.fc2(F.gelu(self.fc1(windows), approximate="tanh"))
