"""One data-parallel rank's view of the data schedule.

The schedule (phases.py) is the same for every rank; what differs is the
layout each phase gives this rank (its lanes and rows, checked for its
micro-batches), and whether it holds every lane, so that it can cross a
lane-count change on its own. The loader asks here, so that the layout
questions stay `resolve_layout`'s answers, phase by phase.
"""

from __future__ import annotations

import math

from zephon.recipe.layout import Layout
from zephon.recipe.phases import MicroBatch, PhaseTimeline, Segment


class RankTimeline:
    """The layouts of rank `dp_rank` of `dp_size`, phase by phase."""

    def __init__(
        self,
        timeline: PhaseTimeline,
        dp_rank: int,
        dp_size: int,
        micro_batch: MicroBatch = None,
        micro_batch_tokens: int | None = None,
    ):
        self.timeline, self.dp_rank, self.dp_size = timeline, dp_rank, dp_size
        self.micro, self.micro_tokens = micro_batch, micro_batch_tokens
        self._layouts: dict[str | None, Layout] = {}

    def check(self, from_step: int) -> None:
        """Every phase not finished after `from_step` steps fits this rank (a
        LayoutError naming the phase otherwise)."""
        layouts = self.timeline.layouts(self.dp_size, self.micro, from_step, self.micro_tokens)
        self._layouts.update(layouts)

    def layout_at(self, step: int) -> Layout:
        """The layout of the trainer's step `step` (counted from 1)."""
        p = self.timeline.phase_at(step)
        if p.name not in self._layouts:
            layout = self.timeline.layout_of(p, self.dp_size, self.micro, self.micro_tokens)
            self._layouts[p.name] = layout
        return self._layouts[p.name]

    def lanes_of(self, segment: Segment) -> range:
        """This rank's lanes in a segment."""
        return self.layout_at(segment.start_step + 1).lanes_of(self.dp_rank)

    def step_tokens(self) -> int:
        """Tokens of this rank's rows in the phase with the most per step."""
        return max(
            math.ceil(p.lanes / self.dp_size) * p.rows_per_lane * (p.seq_len + 1)
            for p in self.timeline.phases
        )

    @property
    def whole(self) -> bool:
        """The rank holds every lane: it crosses lane-count changes on its own."""
        return self.dp_size == 1

    def needs_merged_state(self, segment: Segment, steps_done: int) -> bool:
        """Whether the next step starts a segment with another lane count that this
        rank cannot enter without every rank's lanes."""
        if self.whole or segment.end_step is None or steps_done != segment.end_step:
            return False
        return self.timeline.segment_of(steps_done).lanes != segment.lanes

    def boundary_message(self, segment: Segment, steps_done: int) -> str:
        p = self.timeline.phase_at(steps_done + 1)
        return (
            f"step {steps_done + 1} starts {p.label} with {p.lanes} lanes (from "
            f"{segment.lanes}): every rank needs the merged loader state of step "
            f"{steps_done} first (load_state_dict(merge_rank_states(all ranks' state_dict())))"
        )
