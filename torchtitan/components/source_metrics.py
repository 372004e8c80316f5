"""Per-source token and document counts of a step's global batch, for plotting the
realised mixture against the recipe.

The loader reports, per batch, `source_tokens` and `source_docs`: int64 arrays in
recipe source order counting this rank's rows (tokens taken from each source,
documents starting in them). One all-reduce sums them over the data-parallel ranks.
Loaders without these fields (the conventional hf baseline) report nothing.

With data phases, `PhaseMixture` sums the counts over each phase so far and
sets them against the shares the phase's weights schedule, so a run's metrics
alone draw the realised mixture against the schedule (`mixture_rows`, the same
rows `zephon mixture` computes from the loader).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torchtitan.distributed.replica_groups import ReplicaGroups


def has_source_counts(batch: Any) -> bool:
    return getattr(batch, "source_tokens", None) is not None


def global_source_counts(
    batch: Any,
    names: Sequence[str],
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    groups: ReplicaGroups | None = None,
) -> tuple[dict[str, int], dict[str, int]] | None:
    """Collective (every rank, same loader kind): ({source: tokens}, {source: documents})
    over the whole global batch, or None when the loader does not count. `group` is the
    data-parallel group: tensor-parallel peers hold the same rows and must not be counted
    twice; `groups`: the other replica groups' counts are added (fault tolerance)."""
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
    if groups is not None:
        groups.sum_(both)
    values = both.tolist()
    n = len(names)
    return dict(zip(names, values[:n], strict=True)), dict(zip(names, values[n:], strict=True))


def scheduled_shares(phase: Any, names: Sequence[str]) -> dict[str, float] | None:
    """The share of the batch a data phase's weights (`zephon.recipe.phases.Phase`) give
    each of `names` (0: paused); None for a recipe without phases."""
    if phase.name is None:
        return None
    weights = phase.weights_by_name
    total = sum(weights.values()) or 1.0
    return {n: weights.get(n, 0.0) / total for n in names}


class PhaseMixture:
    """Tokens per source summed over each phase's logged steps (rank 0).

    A resumed run seeds it from its metrics file, already trimmed to the start
    step, so the shares cover the phase from its start, not from the resume (in
    a new dump folder, from the first step it logs)."""

    def __init__(self) -> None:
        self._totals: dict[str | None, dict[str, int]] = {}

    @classmethod
    def from_jsonl(cls, path: str) -> PhaseMixture:
        mix = cls()
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue  # a torn line: its step is trained again
                    if "phase" in r and r.get("source_tokens"):
                        mix.add(r["phase"], r["source_tokens"])
        return mix

    def add(self, phase: str | None, tokens: dict[str, int]) -> dict[str, float]:
        """Count one step of `phase`; returns each source's share over the phase so far."""
        totals = self._totals.setdefault(phase, {})
        for name, n in tokens.items():
            totals[name] = totals.get(name, 0) + int(n)
        whole = sum(totals.values()) or 1
        return {name: n / whole for name, n in totals.items()}


def mixture_rows(records: Iterable[dict[str, Any]]) -> list[Any]:
    """`zephon.tools.mixture_report.MixtureRow`s (for its `table` and `plot`) from a run's
    metrics records of a recipe with phases: per step its phase, the scheduled
    shares, the step's realised shares and those over the phase so far."""
    from zephon import MixtureRow

    rows = []
    for r in sorted(records, key=lambda r: int(r["step"])):
        if "phase_shares" not in r:
            continue
        total = sum(r["source_tokens"].values()) or 1
        step_shares = {n: v / total for n, v in r["source_tokens"].items()}
        rows.append(
            MixtureRow(
                int(r["step"]), r["phase"], r["scheduled_shares"], step_shares, r["phase_shares"]
            )
        )
    return rows
