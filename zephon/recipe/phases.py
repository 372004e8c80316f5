"""The data schedule: a recipe's phases resolved, and the lane segments they form.

A recipe may list `[[phase]]` tables, each starting at a global step and
changing any of: the mixture weights (by source name), the global batch size,
seq_len and the lane count; a phase that omits a setting keeps the one
before. A recipe without phases is one phase. This module resolves the tables
into `Phase`s (inheritance applied, the first phase's seq_len and global batch
size taken from the job when the recipe does not set them) and groups them
into **segments**: the runs of phases one lane stream spans. Within a segment
(same lanes, seq_len and weights) a lane's rows never depend on the global
batch size, so a batch-size change only changes how many rows each lane gives
per step; every other change ends the segment, and each lane cuts exactly at
its boundary row (docs/design.md, "Phases").

Steps: `start_step = b` counts steps done. The phase's first batch is the
trainer's step b + 1, which is batch index b counted from 0 (the loader's
`Batch.step` and the scheduler's steps count from 0).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cached_property

from zephon.errors import LayoutError, RecipeError
from zephon.recipe.layout import Layout, resolve_layout
from zephon.schema.recipe import Recipe

NEVER = sys.maxsize  # a step no batch of the segment reaches


@dataclass(frozen=True)
class Phase:
    """One phase of the schedule, every setting resolved.

    name: None for the one phase of a recipe without `[[phase]]` tables.
    start_step: steps done before its first batch; end_step: the next phase's
    start_step (None for the last). weights: per recipe source, in `[[source]]`
    order; 0 pauses the source (never picked, never read ahead, cursor kept).
    lanes_from: the phase whose table sets the lane count (this one or an earlier
    one it keeps it from); None: `[recipe] lanes`.
    """

    name: str | None
    start_step: int
    end_step: int | None
    global_batch_size: int
    seq_len: int
    lanes: int
    weights: tuple[float, ...]
    source_names: tuple[str, ...]
    lanes_from: str | None = None

    @property
    def label(self) -> str:
        """How messages name the phase."""
        return f"phase '{self.name}'" if self.name is not None else "the recipe"

    @property
    def lanes_setting(self) -> str:
        """Where the phase's lane count is set, in the recipe's words."""
        if self.lanes_from is None:
            return "[recipe] lanes"
        if self.lanes_from == self.name:
            return f"`lanes` of [[phase]] '{self.name}'"
        return f"`lanes` of [[phase]] '{self.lanes_from}' (phase '{self.name}' keeps its count)"

    @property
    def weights_by_name(self) -> dict[str, float]:
        """The active sources' weights, by name (paused sources left out)."""
        return {n: w for n, w in zip(self.source_names, self.weights, strict=True) if w > 0}

    @property
    def rows_per_lane(self) -> int:
        """Rows each lane gives per step (the layout check makes it whole)."""
        return self.global_batch_size // self.lanes

    def steps(self) -> int | None:
        return None if self.end_step is None else self.end_step - self.start_step

    def identity(self, recipe: Recipe, paths: bool = False) -> str:
        """The phase's identity digest: the recipe's data identity with this phase's
        lanes and active sources at its weights. A first phase equal to a recipe
        without phases has that recipe's digest, so adding phases to a running
        job's recipe keeps its checkpoints valid. `paths`: over source paths
        relative to the recipe folder, as states of version 2 and older recorded."""
        blob = recipe.data_identity(self.lanes, self.weights_by_name, paths)
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Segment:
    """Consecutive phases with the same lanes, seq_len and weights: one lane stream.

    Rows are counted from the segment's start (what flush points and replay
    count in); `end_row` is every lane's boundary row, None for the last segment.
    """

    index: int
    phases: tuple[Phase, ...]

    @property
    def first(self) -> Phase:
        return self.phases[0]

    @property
    def start_step(self) -> int:
        return self.first.start_step

    @property
    def end_step(self) -> int | None:
        return self.phases[-1].end_step

    @property
    def lanes(self) -> int:
        return self.first.lanes

    @property
    def seq_len(self) -> int:
        return self.first.seq_len

    @property
    def row_len(self) -> int:
        return self.first.seq_len + 1

    @property
    def weights(self) -> tuple[float, ...]:
        return self.first.weights

    def phase_of(self, index: int) -> Phase:
        """The phase of batch `index` (counted from 0), which lies in the segment."""
        for p in reversed(self.phases):
            if p.start_step <= index:
                return p
        raise ValueError(f"batch {index} is before segment {self.index}")

    def rows_before(self, index: int) -> int:
        """Rows each lane gave for the segment's batches before batch `index`."""
        rows = 0
        for p in self.phases:
            if index <= p.start_step:
                break
            end = index if p.end_step is None else min(index, p.end_step)
            rows += (end - p.start_step) * p.rows_per_lane
        return rows

    @cached_property
    def end_row(self) -> int | None:
        return None if self.end_step is None else self.rows_before(self.end_step)


@dataclass(frozen=True)
class SegmentSteps:
    """The need planner's StepMap over one segment: which batch (counted from 0)
    needs a lane's stream at a token offset from the segment's start. Offsets
    past the segment's end belong to no batch of it (NEVER): lookahead stops at
    the boundary.

    held_rows: rows' worth of tokens a lane's packer may hold before it emits
    any of them (packing.held_rows: best_fit's open bins), so its lane needs a
    document that much before the rows that hold it (`need_step`)."""

    segment: Segment
    held_rows: int = 0

    @cached_property
    def _spans(self) -> tuple[tuple[int | None, int, int], ...]:
        """Per phase: (its tokens per lane, None for the last; first step; tokens per step)."""
        row_len, out = self.segment.row_len, []
        for p in self.segment.phases:
            per_step, n = p.rows_per_lane * row_len, p.steps()
            out.append((None if n is None else n * per_step, p.start_step, per_step))
        return tuple(out)

    def need_step(self, offset: int) -> int:
        """The step whose production first needs the document at `offset`: the
        step of the rows `held_rows` before it (NEVER past the segment's end)."""
        step = self.step_of(offset)
        if step == NEVER or not self.held_rows:
            return step
        return self.step_of(max(0, offset - self.held_rows * self.segment.row_len))

    def step_of(self, offset: int) -> int:
        """The step whose rows hold `offset`."""
        for tokens, start, per_step in self._spans:  # the planner asks once per document
            if tokens is None or offset < tokens:
                return start + offset // per_step
            offset -= tokens
        return NEVER

    def lane_tokens(self, step: int) -> int:
        p = self.segment.phase_of(max(step, self.segment.start_step))
        return p.rows_per_lane * self.segment.row_len


MicroBatch = int | Callable[[Phase], int | None] | None


@dataclass(frozen=True)
class PhaseTimeline:
    """The resolved phases of a recipe and the segments they form."""

    phases: tuple[Phase, ...]
    named: bool  # the recipe has [[phase]] tables
    segments: tuple[Segment, ...] = field(init=False)

    def __post_init__(self) -> None:
        groups: list[list[Phase]] = []
        for p in self.phases:
            if groups and not flushes(groups[-1][-1], p):
                groups[-1].append(p)
            else:
                groups.append([p])
        object.__setattr__(
            self, "segments", tuple(Segment(i, tuple(g)) for i, g in enumerate(groups))
        )

    def phase_at(self, step: int) -> Phase:
        """The phase of the trainer's step `step` (counted from 1): the last phase
        that starts before it (the first phase for step 0)."""
        return self.phase_of(max(step - 1, 0))

    def phase_of(self, index: int) -> Phase:
        """The phase of batch `index` (counted from 0)."""
        return self.segment_of(index).phase_of(index)

    def segment_of(self, index: int) -> Segment:
        """The segment of batch `index` (counted from 0)."""
        for seg in reversed(self.segments):
            if seg.start_step <= index:
                return seg
        return self.segments[0]

    def started(self, steps_done: int) -> tuple[Phase, ...]:
        """The phases that produced a batch within the first `steps_done` steps."""
        return tuple(p for p in self.phases if p.start_step < steps_done)

    def unfinished(self, steps_done: int) -> tuple[Phase, ...]:
        """The phases with batches still to come after `steps_done` steps."""
        return tuple(p for p in self.phases if p.end_step is None or p.end_step > steps_done)

    def layout_of(
        self,
        p: Phase,
        dp_size: int,
        micro_batch: MicroBatch = None,
        micro_batch_tokens: int | None = None,
        max_idle_share: float = 1.0,
    ) -> Layout:
        """The layout of phase `p` over `dp_size` ranks, or a LayoutError naming it.

        micro_batch: rows per micro-batch, or a function of the phase giving them
        (None: one micro-batch per step); micro_batch_tokens: tokens per
        micro-batch instead, a multiple of the phase's seq_len; max_idle_share:
        refuse a layout with more padding (docs/design.md §2)."""
        micro = micro_batch(p) if callable(micro_batch) else micro_batch
        try:
            if micro_batch_tokens is not None:
                if micro_batch_tokens % p.seq_len or micro_batch_tokens < p.seq_len:
                    raise LayoutError(
                        f"micro_batch_tokens {micro_batch_tokens} is not a whole number of "
                        f"rows of seq_len {p.seq_len}"
                    )
                micro = micro_batch_tokens // p.seq_len
            return resolve_layout(
                p.lanes, dp_size, p.global_batch_size, micro, max_idle_share, p.lanes_setting
            )
        except LayoutError as exc:
            if p.name is None:
                raise
            raise LayoutError(f"phase '{p.name}' (from step {p.start_step}): {exc}") from None

    def layouts(
        self,
        dp_size: int,
        micro_batch: MicroBatch = None,
        from_step: int = 0,
        micro_batch_tokens: int | None = None,
        max_idle_share: float = 1.0,
    ) -> dict[str | None, Layout]:
        """Every phase not finished after `from_step` steps, checked for `dp_size`
        ranks (`layout_of`): its layout by phase name."""
        return {
            p.name: self.layout_of(p, dp_size, micro_batch, micro_batch_tokens, max_idle_share)
            for p in self.unfinished(from_step)
        }


def flushes(before: Phase, after: Phase) -> bool:
    """Whether every lane cuts at the boundary between two phases: anything but the
    global batch size changed."""
    return (before.lanes, before.seq_len, before.weights) != (
        after.lanes,
        after.seq_len,
        after.weights,
    )


def resolve_phases(
    recipe: Recipe,
    seq_len: int,
    global_batch_size: int,
    explicit: Collection[str] = (),
) -> PhaseTimeline:
    """The recipe's phases with every setting resolved.

    seq_len, global_batch_size: the job's values, the first phase's when the
    recipe does not set them. explicit: which of "seq_len" and
    "global_batch_size" the job set on purpose; one the recipe sets as well,
    to another value, is a RecipeError (one source of truth).
    """
    names = tuple(s.name for s in recipe.sources)
    base = tuple(s.weight for s in recipe.sources)
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if not recipe.phases:
        only = Phase(None, 0, None, global_batch_size, seq_len, recipe.lanes, base, names)
        return PhaseTimeline((only,), named=False)
    first = recipe.phases[0]
    for key, job in (("seq_len", seq_len), ("global_batch_size", global_batch_size)):
        mine = getattr(first, key)
        if key in explicit and mine is not None and mine != job:
            raise RecipeError(
                f"{recipe.path}: phase '{first.name}' sets {key} = {mine} but the job sets "
                f"{key} = {job}; set the first phase's {key} in one place"
            )
    phases: list[Phase] = []
    gbs, seq, lanes, weights = global_batch_size, seq_len, recipe.lanes, base
    lanes_from: str | None = None
    specs = recipe.phases
    for i, spec in enumerate(specs):
        gbs = spec.global_batch_size or gbs
        seq = spec.seq_len or seq
        if spec.lanes:
            lanes, lanes_from = spec.lanes, spec.name
        if spec.weights is not None:
            given = dict(spec.weights)
            weights = tuple(given.get(n, 0.0) for n in names)
        end = specs[i + 1].start_step if i + 1 < len(specs) else None
        phases.append(
            Phase(spec.name, spec.start_step, end, gbs, seq, lanes, weights, names, lanes_from)
        )
    return PhaseTimeline(tuple(phases), named=True)


def images_too_long(recipe: Recipe, timeline: PhaseTimeline) -> list[str]:
    """Each phase whose rows cannot hold the largest image `[image]` allows (its
    placeholder tokens plus start and end; an image is never split across rows),
    naming the phase, its seq_len and the tokens needed. Empty for text recipes."""
    if not any(s.multimodal for s in recipe.sources):
        return []
    image = recipe.image
    placeholders = image.largest_image_tokens
    needed = placeholders + 2
    out = []
    for p in timeline.phases:
        if needed <= p.seq_len + 1:  # a row holds seq_len + 1 tokens
            continue
        where = f"{p.label} (from step {p.start_step})" if p.name is not None else p.label
        fits = max(p.seq_len - 1, 1) * image.window * image.window
        out.append(
            f"{where}: seq_len {p.seq_len} is too short for the largest image [image] "
            f"allows: {placeholders} placeholder tokens (max_pixels {image.max_pixels}, one "
            f"per {image.window} x {image.window} pixels) + start and end = {needed} tokens, "
            f"which need seq_len >= {needed - 1}; raise the seq_len, or lower [image] "
            f"max_pixels to at most {fits}"
        )
    return out
