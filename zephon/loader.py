"""ZephonLoader: one data-parallel rank's view of the global batch stream.

The rank owns lanes [floor(r*L/D), floor((r+1)*L/D)) (zephon/recipe/layout.py).
Each step it takes G/L rows from every owned lane, in lane order;
concatenating all ranks' batches in rank order gives the same bytes for any
D <= L. A rank with fewer lanes hands over its real rows only, and its batch
says how many rows every rank runs (`Batch.padded_to`), so the cut into
micro-batches pads it to the same micro-steps. The recipe may change G,
seq_len, the mixture and L at phase boundaries (phases.py); the loader
follows that schedule, and every batch says its phase. This class is the
trainer's interface and ties the parts together: the sources and scheduler
(context.py), producing batches (production.py), the flush points a
checkpoint records (flush_log.py) and where a restore starts (resume.py).
The checkpoint state counts only the steps the trainer took.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection, Iterator
from typing import Any

from zephon.batch import Batch
from zephon.batch_production import BOUNDARY, END, BatchProducer
from zephon.demand.executor import DemandExecutor
from zephon.demand.lookahead import DEFAULT_LOOKAHEAD_BYTES
from zephon.demand.stats import DOC_COUNTS, TOKEN_COUNTS
from zephon.errors import StateError
from zephon.recipe.layout import Layout
from zephon.recipe.load import load_recipe
from zephon.recipe.phases import MicroBatch, Phase, Segment, resolve_phases
from zephon.recipe.rank_timeline import RankTimeline
from zephon.schema.recipe import Recipe
from zephon.sources.bad_records import dropped_count, dropped_state, restore_dropped
from zephon.stage_profile import StageProfile
from zephon.state.checkpoint_state import (
    check_header,
    check_state_data,
    make_fingerprint,
    rank_state,
    upgrade,
)
from zephon.state.flush_log import FlushLog, FlushPoint
from zephon.state.lane_count_deal import Record
from zephon.streams.context import build_context, open_sources
from zephon.streams.lane import LaneStream, initial_snapshot
from zephon.streams.restore import resume_starts
from zephon.tokenize.tokenizer import TokenizerInfo, resolve_tokenizer

BLOCK_PREFETCH = (
    "ZephonLoader(block_prefetch=...) is deprecated and ignored: lookahead is one token "
    "budget per rank (lookahead_tokens)"
)


class ZephonLoader:
    """Deterministic, elastic loader for one data-parallel rank.

    Args:
        recipe: a Recipe or the path of a recipe TOML.
        tokenizer: path of a `tokenizer.json` (or a loaded TokenizerInfo).
        seq_len, global_batch_size: tokens per training row (rows hold seq_len + 1)
            and rows per step over all ranks; the first phase's unless the recipe sets them.
        micro_batch_size: rows per micro-batch, or a function of the Phase giving
            them; sets the rows every rank runs per step (`Batch.padded_to`) when
            ranks own different numbers of lanes.
        dp_rank, dp_size: this rank and the data-parallel degree.
        num_workers, prefetch, lookahead_tokens, lookahead_bytes, cache_dir: execution
            settings; None takes the recipe's. They never change a byte of output.
        block_prefetch: deprecated and ignored (lookahead is one token budget).
        trace: record (source, document index) of every packed document per lane
            id in `self.traces` (tests, debugging; lane j's after a lane-count change
            follow old lane j's).
        explicit: which of "seq_len" and "global_batch_size" the job set on
            purpose: one the recipe's first phase sets to another value is an error.
        micro_batch_tokens: tokens per micro-batch instead of micro_batch_size
            (a multiple of every phase's seq_len).
        profile: CPU by stage in `stats()["profile"]` (stage_profile.py); free when off.

    The layout of the last phase is checked here; the start (or a restore)
    checks every phase not finished by then, so an error comes before any batch.
    """

    def __init__(
        self,
        recipe: Recipe | str | os.PathLike[str],
        tokenizer: str | os.PathLike[str] | TokenizerInfo,
        seq_len: int,
        global_batch_size: int,
        micro_batch_size: MicroBatch = None,
        dp_rank: int = 0,
        dp_size: int = 1,
        num_workers: int | None = None,
        prefetch: int | None = None,
        block_prefetch: int | None = None,
        cache_dir: str | None = None,
        trace: bool = False,
        lookahead_tokens: int | None = None,
        explicit: Collection[str] = (),
        micro_batch_tokens: int | None = None,
        lookahead_bytes: int | None = None,
        profile: bool = False,
    ):
        self.recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
        ex = self.recipe.execution
        self.timeline = resolve_phases(self.recipe, seq_len, global_batch_size, explicit)
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.rank = RankTimeline(
            self.timeline, dp_rank, dp_size, micro_batch_size, micro_batch_tokens
        )
        self.rank.check(self.timeline.phases[-1].start_step)
        self.tok = resolve_tokenizer(tokenizer, self.recipe)
        self.num_workers = ex.workers if num_workers is None else num_workers
        self.prefetch = ex.prefetch if prefetch is None else prefetch
        readers, shuffles = open_sources(self.recipe, cache_dir or ex.cache_dir or None)
        if block_prefetch is not None:
            warnings.warn(BLOCK_PREFETCH, DeprecationWarning, stacklevel=2)
        # Lookahead in tokens per rank: two steps of the largest phase's rows, four
        # with images (decode processes idled at two). Bytes: planner.py.
        budget = lookahead_tokens if lookahead_tokens is not None else ex.lookahead_tokens
        steps_ahead = 4 if any(s.multimodal for s in self.recipe.sources) else 2
        self.lookahead_tokens = budget or steps_ahead * self.rank.step_tokens()
        budget = lookahead_bytes if lookahead_bytes is not None else ex.lookahead_bytes
        self.lookahead_bytes = budget or DEFAULT_LOOKAHEAD_BYTES
        first = self.timeline.segments[0]
        self.profile = StageProfile() if profile else None  # kept after close, for a last look
        self.ctx = build_context(
            self.recipe, readers, shuffles, self.tok, self.num_workers,
            (self.lookahead_tokens, self.lookahead_bytes), first, self.profile,
        )  # fmt: skip
        self._scheduler: DemandExecutor | None = self.ctx.scheduler
        self.source_names = tuple(s.name for s in self.recipe.sources)
        self.fingerprint = make_fingerprint(self.recipe, readers, self.tok, self.timeline)
        self.traces: dict[int, list[tuple[int, int]]] | None = {} if trace else None
        self._producer: BatchProducer | None = None
        self._deals: dict[str, list[Record]] = {}
        # A fresh start is planned when first needed: a loader built to be restored
        # at a later phase may not fit the first phase's layout.
        self.step, self._segment, self.lane_ids = 0, first, []
        self._ended = False

    def _plan_fresh(self) -> None:
        """Plan a start from step 0, unless a start (fresh or restored) is planned."""
        if self._producer is None:
            self.rank.check(0)
            first = self.timeline.segments[0]
            start = initial_snapshot(self.recipe)
            self._plan_start({lane: (start, 0) for lane in self.rank.lanes_of(first)}, 0, first)

    # -- the schedule -----------------------------------------------------

    def layout_at(self, step: int) -> Layout:
        """The layout the trainer runs at its step `step` (counted from 1)."""
        return self.rank.layout_at(step)

    def phase_at(self, step: int) -> Phase:
        """The phase of the trainer's step `step` (counted from 1)."""
        return self.timeline.phase_at(step)

    @property
    def layout(self) -> Layout:
        """The layout of the next step."""
        return self.layout_at(self.step + 1)

    @property
    def phase(self) -> Phase:
        """The phase of the next step: its seq_len, global batch size, rows per lane."""
        return self.timeline.phase_at(self.step + 1)

    @property
    def needs_boundary_state(self) -> bool:
        """Whether the next step starts a phase with another lane count that this
        rank cannot enter alone: give every rank the merged state of all ranks
        written now (`load_state_dict(merge_rank_states(...))`) first. A loader
        with every lane (dp_size 1) crosses by itself."""
        return self.rank.needs_merged_state(self._segment, self.step)

    # -- production -------------------------------------------------------

    def _plan_start(
        self, points: dict[int, tuple[FlushPoint, int]], step: int, segment: Segment
    ) -> None:
        """Set where each lane starts: (flush point, rows to replay after it).

        Nothing runs until the first batch is asked for, so a loader that is
        built and then restored from a checkpoint does no wasted work.
        """
        self.step = step
        self._ended = False
        self._segment = segment
        self.lane_ids = sorted(points)
        self._flushes = FlushLog({lane: flush for lane, (flush, _) in points.items()})
        assert self._scheduler is not None
        self._scheduler.reset(self.ctx.step_map(segment))
        self._producer = BatchProducer(
            self.ctx,
            self.timeline,
            segment,
            points,
            step,
            self.prefetch,
            self.traces,
            whole=self.rank.whole,
        )

    def start(self) -> None:
        """Build the lanes, replay to the consumed row and begin prefetching.

        Happens on the first `next_batch`; call it to start work earlier.
        """
        self._plan_fresh()
        assert self._producer is not None and self._scheduler is not None
        if self._producer.started:
            return
        passed = self._producer.start()
        consumed = self._segment.rows_before(self.step)
        for lane, points in passed.items():
            self._flushes.add(lane, points, consumed)

    @property
    def lanes(self) -> list[LaneStream]:
        """This rank's lanes, in lane order (empty before `start`)."""
        return self._producer.lanes if self._producer is not None else []

    @property
    def replay(self) -> dict[str, int]:
        """Work of the last start's replay: rows, documents packed and tokenized, tokens."""
        return self._producer.replay if self._producer is not None else {}

    @property
    def first_batch(self) -> dict[str, int] | None:
        """Work done when the first batch after the last start was assembled."""
        return self._producer.first_batch if self._producer is not None else None

    @property
    def _produced_step(self) -> int:
        assert self._producer is not None
        return self._producer.produced_step

    # -- the trainer's interface ---------------------------------------------

    def next_batch(self) -> Batch:
        """This rank's rows for the next step; StopIteration once a lane runs dry."""
        if self._ended:
            raise StopIteration
        if self.needs_boundary_state:
            raise StateError(self.rank.boundary_message(self._segment, self.step))
        self.start()
        assert self._producer is not None
        item = self._producer.next()
        if item is END:
            self._ended = True
            raise StopIteration
        if item is BOUNDARY:
            raise StateError(self.rank.boundary_message(self._segment, self.step))
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        batch, flushes, entered = item  # type: ignore[misc]
        if entered is not None:  # the first batch of a new segment: its lanes from now on
            starts, self._deals = entered
            self._segment = self.timeline.segment_of(self.step)
            self.lane_ids = sorted(starts)
            self._flushes = FlushLog(starts)
        self.step += 1
        batch.padded_to, batch.pad_id = self.layout_at(self.step).rows_per_rank, self.tok.pad_id
        consumed = self._segment.rows_before(self.step)
        for lane, points in flushes.items():
            self._flushes.add(lane, points, consumed)
        return batch

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.next_batch, None)  # ends at the StopIteration next_batch raises

    def state_dict(self) -> dict[str, Any]:
        """This rank's state (its lanes only); merge ranks with merge_rank_states."""
        self._plan_fresh()
        seg = self._segment
        lanes = self._flushes.state_lanes(self.lane_ids, seg.rows_before(self.step))
        state = rank_state(self.fingerprint, self.timeline, self.step, self.dp_rank, seg, lanes)
        if self._deals:  # absent until the lane count changed
            state["deals"] = self._deals
        if self.recipe.bad_records == "drop":  # absent otherwise: older states stay as they were
            state["dropped_records"] = dropped_state(self.ctx.readers)
        return state

    def dropped_records(self) -> int:
        """Bad records this rank's readers replaced by empty documents so far."""
        return dropped_count(self.ctx.readers)

    def check_resumable(self, state: dict[str, Any]) -> dict[str, Any]:
        """Refuse a state this run cannot continue (header, fingerprint of the phases
        started by its step); returns it as the current state version."""
        check_header(state)
        first = self.timeline.phases[0]
        state = upgrade(state, list(first.weights_by_name))
        check_state_data(
            state, self.fingerprint, self.recipe, self.ctx.readers, self.tok, self.timeline
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a (merged or single-rank) state written at any data-parallel
        size; at a lane-count change, the merged state of every rank."""
        state = self.check_resumable(state)
        step = int(state["step"])
        self.rank.check(step)
        self._discard_lanes()
        seg, points, deals = resume_starts(self.ctx, self.timeline, state, self.rank.lanes_of)
        restore_dropped(self.ctx.readers, state.get("dropped_records", {}))
        if self.traces is not None:
            self.traces = {}
        self._plan_start(points, step, seg)
        self._deals = deals

    def _discard_lanes(self) -> None:
        """Stop producing and drop queued work of the current lanes."""
        if self._producer is not None:
            self._producer.stop()
        if self._scheduler is not None:
            self._scheduler.reset()

    def stats(self) -> dict[str, Any]:
        """Counts of the work done since the start or the last restore.

        docs/tokens_tokenized: documents and token ids (EOS included) produced
        by the tokenizer, or by the image workers (`work` counts pretokenized
        sources and documents with images apart). first_batch:
        the same counts when the first batch was assembled (replay included),
        with the non-padding tokens of its rows. The prefetch thread may be a
        step or two ahead of the trainer. profile (if asked for): CPU by stage."""
        work = self._scheduler.stats() if self._scheduler is not None else {}
        first = self.first_batch
        return {
            "step": self.step,
            "docs_packed": sum(lane.docs_packed for lane in self.lanes),
            "docs_tokenized": sum(work.get(k, 0) for k in DOC_COUNTS),
            "tokens_tokenized": sum(work.get(k, 0) for k in TOKEN_COUNTS),
            "work": work,
            "first_batch": dict(first) if first else None,
            "replay": dict(self.replay),
            **({"profile": self.profile.snapshot()} if self.profile is not None else {}),
        }

    def close(self) -> None:
        self._discard_lanes()
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None

    def __enter__(self) -> ZephonLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
