"""What every lane of a loader shares, and how it is opened from a recipe.

One place builds the sources' readers (under the recipe's bad-records
policy), their shuffles, and the scheduler, so that the loader, its
lanes and the tools all address a source the same way. `lane_docs` is where a
lane's documents of a source come from: the shuffle's deal for the lane
count (lanes.documents.ShuffledLaneDocs), or, after a lane-count change, the documents
the old lanes left, dealt to the new ones (deal.py). `fetch` reads and
tokenizes one document by its index: the tail of a document a lane carries
across a phase boundary. `images` is the worker side of images
(images/work.py) when the recipe has sources with images, else None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon.demand.executor import DemandExecutor
from zephon.errors import LayoutError
from zephon.lanes.documents import LaneDocs, ShuffledLaneDocs
from zephon.lanes.packing import held_rows
from zephon.lanes.shuffle import SourceShuffle
from zephon.recipe.phases import Segment, SegmentSteps
from zephon.schema.recipe import Recipe
from zephon.sources import SourceReader
from zephon.sources.bad_records import with_policy
from zephon.stage_profile import StageProfile
from zephon.state.lane_count_deal import Record, build_lane_docs
from zephon.tokenize.long_pieces import encode_documents
from zephon.tokenize.tokenizer import TokenizerInfo, check_token_ids


@dataclass
class PipelineContext:
    """What every lane of a loader shares: readers, shuffles, tokenizer, settings.

    deals: per source name, the lane-count changes whose dealt epochs lanes may
    still reach (deal.py); empty before any change."""

    recipe: Recipe
    readers: list[Any]  # SourceReader, or its bad-records wrapper
    shuffles: list[SourceShuffle]  # for the recipe's (first phase's) lane count
    tok: TokenizerInfo
    scheduler: DemandExecutor
    images: Any = None  # ImageWork (images/work.py), for recipes with image sources
    deals: dict[str, list[Record]] = field(default_factory=dict)
    _plans: dict[tuple[int, int], SourceShuffle] = field(default_factory=dict)
    _dealt: dict[tuple[int, int], list[LaneDocs]] = field(default_factory=dict)

    def shuffle_of(self, source: int, lanes: int) -> SourceShuffle:
        """The source's shuffle for `lanes` lanes."""
        if lanes == self.recipe.lanes:
            return self.shuffles[source]
        key = (source, lanes)
        if key not in self._plans:
            s, shuffle = self.recipe.sources[source], self.recipe.shuffle
            n = self.readers[source].num_docs
            self._plans[key] = SourceShuffle(
                s.name, n, lanes, shuffle.block_size, self.recipe.seed, shuffle.enabled
            )
        return self._plans[key]

    def step_map(self, segment: Segment) -> SegmentSteps:
        """The need planner's step map over `segment` for this recipe's packer."""
        return step_map(self.recipe, segment)

    def set_deals(self, deals: dict[str, list[Record]]) -> None:
        self.deals = {k: v for k, v in deals.items() if v}
        self._dealt = {}

    def images_of(self, source: int) -> Any:
        """The image work for documents of `source` (None: a text source)."""
        return self.images if self.recipe.sources[source].multimodal else None

    def lane_docs(self, source: int, lane: int, lanes: int) -> LaneDocs:
        """The lane's documents of a source, in visiting order, epoch by epoch."""
        spec = self.recipe.sources[source]
        repeat = spec.on_exhausted == "repeat"
        chain = self.deals.get(spec.name)
        if not chain or int(chain[-1]["lanes_after"]) != lanes:
            return ShuffledLaneDocs(self.shuffle_of(source, lanes), lane, repeat)
        key = (source, lanes)
        if key not in self._dealt:
            shuffle = self.recipe.shuffle.enabled
            self._dealt[key] = build_lane_docs(
                chain,
                lambda n: self.shuffle_of(source, n),
                repeat,
                self.recipe.seed,
                spec.name,
                shuffle,
            )
        return self._dealt[key][lane]

    def fetch(self, source: int, doc: int) -> np.ndarray:
        """Document `doc` of a source, read and tokenized now (counted as work)."""
        reader, spec = self.readers[source], self.recipe.sources[source]
        value = reader.read_range(doc, doc + 1)[0]
        if spec.pretokenized:
            ids = check_token_ids([value], [doc], spec, self.tok)[0]
        elif spec.multimodal:
            ids = self.images.encode([self.images.size(value)], [(reader, doc)])[0]
        else:
            ids = encode_documents([value], self.tok)[0]
        self.scheduler.count_fetched(len(ids), spec.pretokenized)
        return ids


def step_map(recipe: Recipe, segment: Segment) -> SegmentSteps:
    """Which step needs a lane's stream at an offset of `segment`, for the recipe's
    packer (best_fit needs a document its open bins' rows earlier)."""
    packing = recipe.packing
    return SegmentSteps(segment, held_rows(packing.algorithm, packing.open_bins))


def open_sources(recipe: Recipe, cache_dir: str | None) -> tuple[list[Any], list[SourceShuffle]]:
    """Every source's reader (under the bad-records policy) and shuffle."""
    readers = [with_policy(SourceReader(s, cache_dir), recipe.bad_records) for s in recipe.sources]
    try:
        shuffles = [
            SourceShuffle(
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
    return readers, shuffles


def build_context(
    recipe: Recipe,
    readers: list[Any],
    shuffles: list[SourceShuffle],
    tok: TokenizerInfo,
    workers: int,
    budgets: tuple[int, int],
    first: Segment,
    profile: StageProfile | None = None,
) -> PipelineContext:
    """The lanes' shared context and its scheduler, with `budgets` (tokens, image
    bytes) of lookahead, planning for segment `first`; the image work only when a
    source has images; `profile`: where the threads charge their CPU by stage
    (None: not profiled)."""
    images = None
    if any(s.multimodal for s in recipe.sources):
        from zephon.images.work import ImageWork  # Pillow only where images are read

        images = ImageWork(recipe.image, tok, decoders=workers, profile=profile)
    tokens, image_bytes = budgets
    unit = recipe.mixture.unit
    scheduler = DemandExecutor(
        tok, workers, tokens, step_map(recipe, first), unit,
        budget_bytes=image_bytes, images=images, profile=profile,
    )  # fmt: skip
    return PipelineContext(recipe, readers, shuffles, tok, scheduler, images=images)
