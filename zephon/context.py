"""What every lane of a loader shares, and how it is opened from a recipe.

One place builds the sources' readers (under the recipe's bad-records
policy), their shuffle plans, and the scheduler, so that the loader, its
lanes and the tools all address a source the same way. `lane_docs` is where a
lane's documents of a source come from: today the shuffle plan's deal
(lane_docs.PlanLaneDocs); another deal is another LaneDocs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon.errors import LayoutError
from zephon.lane_docs import LaneDocs, PlanLaneDocs
from zephon.recipe import Recipe
from zephon.scheduler import DemandScheduler
from zephon.shuffle import SourcePlan
from zephon.sources import SourceReader
from zephon.tokenize import TokenizerInfo
from zephon.tolerant import with_policy


@dataclass
class PipelineContext:
    """What every lane of a loader shares: readers, plans, tokenizer, settings."""

    recipe: Recipe
    readers: list[Any]  # SourceReader, or its bad-records wrapper
    plans: list[SourcePlan]
    tok: TokenizerInfo
    row_len: int
    scheduler: DemandScheduler

    def lane_docs(self, source: int, lane: int) -> LaneDocs:
        """The lane's documents of a source, in visiting order, epoch by epoch."""
        repeat = self.recipe.sources[source].on_exhausted == "repeat"
        return PlanLaneDocs(self.plans[source], lane, repeat)


def open_sources(recipe: Recipe, cache_dir: str | None) -> tuple[list[Any], list[SourcePlan]]:
    """Every source's reader (under the bad-records policy) and shuffle plan."""
    readers = [with_policy(SourceReader(s, cache_dir), recipe.bad_records) for s in recipe.sources]
    try:
        plans = [
            SourcePlan(
                s.name,
                r.num_docs,
                recipe.lanes,
                recipe.shuffle.block_size,
                recipe.seed,
                recipe.shuffle.enabled,
            )
            for s, r in zip(recipe.sources, readers, strict=True)
        ]
    except LayoutError as exc:
        raise LayoutError(f"{recipe.path}: {exc}") from None
    return readers, plans
