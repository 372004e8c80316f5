"""Document-causal attention with FlexAttention: a block-sparse mask built from
``positions`` instead of a dense boolean [rows, 1, S, S] tensor.

This is the GPU path: on CUDA the block mask and the attention kernel are
compiled (flash-style, never materialising S x S scores). On CPU FlexAttention
runs eagerly and has no backward, so there it serves only to check that it
computes the same function as the dense path.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention


def document_ids(positions: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` document index per token: a new document starts at every
    ``positions == 0`` (also the first token of a row that starts one). Padding
    (positions -1) keeps the index of the document before it, as in the dense
    mask; its labels are ignored, so what it attends to never reaches the loss."""
    return torch.cumsum(positions == 0, dim=1)


def document_block_mask(positions: torch.Tensor) -> BlockMask:
    """Causal attention within each packed document of each row."""
    doc = document_ids(positions)
    rows, seq_len = positions.shape

    def doc_causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor):
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    return create_block_mask(
        doc_causal, rows, None, seq_len, seq_len, device=positions.device,
        _compile=positions.is_cuda,
    )  # fmt: skip


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    # Compiled once per process; eager flex attention is a slow reference
    # implementation that materialises the scores.
    return torch.compile(flex_attention, dynamic=False)


def flex_doc_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask
) -> torch.Tensor:
    """``q [B, Hq, S, D]``, ``k, v [B, Hkv, S, D]`` (grouped-query: query head h
    reads kv head h // (Hq / Hkv)) -> ``[B, Hq, S, D]``."""
    fn = _compiled_flex() if q.is_cuda else flex_attention
    return fn(q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
