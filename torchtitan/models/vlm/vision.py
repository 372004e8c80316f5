"""The vision tower: a ViT-style encoder over the patches of a micro-batch's images.

Input: the uint8 patch rows of `zephon.images.batch.ImageBatch` (every image
of the micro-batch, one after another) and each image's grid. Output: one
vector per patch, in the same order, for the merge projector.

- Patch embedding: uint8 values mapped to [-1, 1] by the fixed x / 127.5 - 1
  (no per-dataset statistics to carry around; the linear layer after it learns
  any per-channel shift and scale), then one linear layer, which is a p x p
  convolution with stride p on a channel-major patch.
- Positions: 2-D rotary embeddings from `zephon.images.pixels.patches.patch_positions`,
  half the rotated pairs of each head by the patch's row, half by its column.
  Chosen over interpolated learned positions because images come in any grid
  (the resize keeps the aspect ratio): rotary angles exist for every (row,
  column) with no table to interpolate, have no parameters, and make attention
  depend on the offset between two patches, the same in every image.
- Attention: bidirectional within each image only. The images of a micro-batch
  are concatenated into one sequence, so the mask is block-diagonal (a dense
  boolean mask for SDPA; its size is the square of the micro-batch's patches).

Under tensor parallelism the tower is not split: its parameters are replicated
DTensors on the TP mesh (see parallelize.py) and it computes on their local
copies, hence the `Linear` and `LayerNorm` here that read `_local` weights.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from torchtitan.models.llama3.model import apply_rope
from torchtitan.models.vlm.args import VisionArgs
from zephon.images import patch_positions


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.to_local() if isinstance(t, DTensor) else t


class Linear(nn.Linear):
    """`nn.Linear` computing on the local copy of replicated (DTensor) weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, _local(self.weight), _local(self.bias))


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` computing on the local copy of replicated (DTensor) weights,
    in float32 even under bf16 mixed precision."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = _local(self.weight), _local(self.bias)
        out = F.layer_norm(x.float(), self.normalized_shape, w.float(), b.float(), self.eps)
        return out.type_as(x)


def image_layout(grids: list[tuple[int, int]], merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions [N, 2] int64: each patch's (row, column) in its image's grid,
    image [N] int64: the index of the image each patch belongs to) for the
    concatenated patches of images with these grids."""
    positions = np.concatenate([patch_positions(g, merge) for g in grids])
    image = np.repeat(np.arange(len(grids)), [h * w for h, w in grids])
    return positions, image


def rope_2d(positions: np.ndarray, head_dim: int, theta: float) -> torch.Tensor:
    """[1, N, head_dim / 2, 2] (cos, sin) per patch: the first head_dim / 4 pairs
    rotate by the row, the last head_dim / 4 by the column (angles in float64)."""
    quarter = head_dim // 4
    inv_freq = 1.0 / theta ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    pos = torch.from_numpy(positions).to(torch.float64)
    angles = torch.cat([torch.outer(pos[:, 0], inv_freq), torch.outer(pos[:, 1], inv_freq)], 1)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float().unsqueeze(0)


def block_diagonal_mask(image: torch.Tensor) -> torch.Tensor:
    """Boolean [1, 1, N, N] (True = may attend): patches of the same image only."""
    return (image.unsqueeze(0) == image.unsqueeze(1)).view(1, 1, len(image), len(image))


class VisionAttention(nn.Module):
    def __init__(self, args: VisionArgs) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = Linear(args.dim, args.dim)
        self.wk = Linear(args.dim, args.dim)
        self.wv = Linear(args.dim, args.dim)
        self.wo = Linear(args.dim, args.dim)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        q = self.wq(x).view(1, n, -1, self.head_dim)
        k = self.wk(x).view(1, n, -1, self.head_dim)
        v = self.wv(x).view(1, n, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [1, H, N, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(1, n, -1))


class VisionMLP(nn.Module):
    def __init__(self, args: VisionArgs) -> None:
        super().__init__()
        self.fc1 = Linear(args.dim, args.ffn_hidden_dim)
        self.fc2 = Linear(args.ffn_hidden_dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class VisionBlock(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then + mlp(norm(.))."""

    def __init__(self, args: VisionArgs) -> None:
        super().__init__()
        self.attention_norm = LayerNorm(args.dim, eps=args.norm_eps)
        self.attention = VisionAttention(args)
        self.mlp_norm = LayerNorm(args.dim, eps=args.norm_eps)
        self.mlp = VisionMLP(args)
        # Set by parallelize.apply_activation_checkpointing (a flag, as in Llama's
        # blocks, so parameter names do not change).
        self.checkpoint_activations = False

    def _block(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask)
        return h + self.mlp(self.mlp_norm(h))

    def forward(self, x: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_activations and torch.is_grad_enabled():
            return checkpoint(self._block, x, rope, mask, use_reentrant=False)
        return self._block(x, rope, mask)


class VisionEncoder(nn.Module):
    """Patches of concatenated images -> one `dim` vector per patch.

    FQNs: `patch_embed`, `layers.<i>` (`attention_norm`, `attention.{wq,wk,wv,wo}`,
    `mlp_norm`, `mlp.{fc1,fc2}`), `norm`."""

    def __init__(self, args: VisionArgs) -> None:
        super().__init__()
        self.args = args
        self.patch_embed = Linear(args.patch_dim, args.dim)
        self.layers = nn.ModuleDict({str(i): VisionBlock(args) for i in range(args.n_layers)})
        self.norm = LayerNorm(args.dim, eps=args.norm_eps)

    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int]]) -> torch.Tensor:
        """`patches [N, 3 p²]` uint8 (images one after another, each in the
        order of zephon/images/pixels/patches.py) and each image's (h, w) grid ->
        `[N, dim]`."""
        a = self.args
        if patches.dtype != torch.uint8 or patches.shape[1:] != (a.patch_dim,):
            raise ValueError(
                f"image patches: expected uint8 [N, {a.patch_dim}] (3 x patch_size {a.patch_size}"
                f" squared), got {patches.dtype} {tuple(patches.shape)}"
            )
        if patches.shape[0] != sum(h * w for h, w in grids):
            raise ValueError(
                f"image patches: {patches.shape[0]} rows, but the grids {grids} hold "
                f"{sum(h * w for h, w in grids)} patches"
            )
        positions, image = image_layout(grids, a.merge)
        device = patches.device
        rope = rope_2d(positions, a.head_dim, a.rope_theta).to(device)
        mask = block_diagonal_mask(torch.from_numpy(image).to(device))
        weight = _local(self.patch_embed.weight)
        x = (patches.float() / 127.5 - 1.0).to(weight.dtype)
        h = self.patch_embed(x).unsqueeze(0)  # [1, N, dim]: one sequence, masked per image
        for layer in self.layers.values():
            h = layer(h, rope, mask)
        return self.norm(h).squeeze(0)
