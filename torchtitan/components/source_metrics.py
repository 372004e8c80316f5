"""Per-source token and document counts of a step's global batch, for plotting the
realised mixture against the recipe.

The loader reports, per batch, `source_tokens` and `source_docs`: int64 arrays in
recipe source order counting this rank's rows (tokens taken from each source,
documents starting in them). One all-reduce sums them over the data-parallel ranks.
Loaders without these fields (the conventional hf baseline) report nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def has_source_counts(batch: Any) -> bool:
    return getattr(batch, "source_tokens", None) is not None


def global_source_counts(
    batch: Any,
    names: Sequence[str],
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> tuple[dict[str, int], dict[str, int]] | None:
    """Collective (every rank, same loader kind): ({source: tokens}, {source: documents})
    over the whole global batch, or None when the loader does not count. `group` is the
    data-parallel group: tensor-parallel peers hold the same rows and must not be counted twice."""
    if not has_source_counts(batch):
        return None
    tokens = np.asarray(batch.source_tokens, dtype=np.int64)
    docs = np.asarray(batch.source_docs, dtype=np.int64)
    if tokens.shape != (len(names),) or docs.shape != (len(names),):
        raise ValueError(
            f"batch source counts have shapes {tokens.shape} / {docs.shape}; "
            f"expected ({len(names)},) for sources {list(names)}"
        )
    both = torch.from_numpy(np.concatenate([tokens, docs])).to(device)
    if dist.is_initialized():
        dist.all_reduce(both, group=group)
    values = both.tolist()
    n = len(names)
    return dict(zip(names, values[:n], strict=True)), dict(zip(names, values[n:], strict=True))
