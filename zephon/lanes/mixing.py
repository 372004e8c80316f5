"""Deterministic mixing: which source a lane's next document comes from.

Largest-deficit scheduling: every source is owed its weight's share of what
the lane has taken so far (in documents or tokens); the next document comes
from the source owed the most. No random draws, so there is nothing to seed
and the realised mixture never drifts: after n documents each source is within
one document (document unit) or one document's tokens (token unit) of its
exact share. Retired sources (exhausted under `stop`) drop out and the rest
are renormalised, and so do paused ones (weight 0 in a recipe phase): a
mixer over some paused sources picks exactly as one over the others alone.
"""

from __future__ import annotations

from collections.abc import Sequence


class Mixer:
    def __init__(self, weights: Sequence[float], unit: str, counts: Sequence[int] | None = None):
        self.weights = [float(w) for w in weights]
        self.by_tokens = unit == "tokens"
        self.counts = list(counts) if counts is not None else [0] * len(self.weights)
        self.total_w = sum(self.weights)
        # A weight of 0 pauses a source (a phase that leaves it out): never chosen.
        self.paused = [w <= 0 for w in self.weights] if 0 in self.weights else None

    def choose(self, active: Sequence[bool]) -> int:
        """Index of the active source with the largest deficit (lowest index on ties);
        -1 when every active source is paused."""
        weights, counts = self.weights, self.counts
        if self.paused is not None:
            active = [a and not p for a, p in zip(active, self.paused, strict=True)]
        if all(active):
            idx: Sequence[int] = range(len(weights))
            total_w, taken = self.total_w, sum(counts)
        else:
            idx = [i for i, a in enumerate(active) if a]
            # Summed in index order from 0, as for all sources: the same floats.
            total_w = sum(weights[i] for i in idx)
            taken = sum(counts[i] for i in idx)
        best, best_deficit = -1, 0.0
        for i in idx:
            # Scaled by total_w to keep the comparison exact for equal weights.
            deficit = weights[i] * taken - counts[i] * total_w
            if best < 0 or deficit > best_deficit:
                best, best_deficit = i, deficit
        return best

    def record(self, source: int, num_tokens: int) -> None:
        self.counts[source] += num_tokens if self.by_tokens else 1
