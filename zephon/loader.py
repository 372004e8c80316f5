"""ZephonLoader: one data-parallel rank's view of the global batch stream.

The rank owns lanes [floor(r*L/D), floor((r+1)*L/D)) (zephon/layout.py).
Each step it takes G/L rows from every owned lane, in lane order;
concatenating all ranks' batches in rank order gives the same bytes for any
D <= L. A rank with fewer lanes hands over its real rows only, and its batch
says how many rows every rank runs (`Batch.padded_to`), so the cut into
micro-batches pads it to the same micro-steps. This class is the
trainer's interface and ties the parts together: the sources and scheduler
(context.py), producing batches (production.py) and the flush points a
checkpoint records (flush_log.py). The checkpoint state counts only the
steps the trainer took.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from zephon.batch import Batch
from zephon.context import PipelineContext, open_sources
from zephon.flush_log import FlushLog, FlushPoint, restore_points
from zephon.lane import LaneStream, initial_snapshot
from zephon.layout import plan_layout
from zephon.planner import UniformSteps
from zephon.production import END, BatchProducer
from zephon.recipe import Recipe, load_recipe
from zephon.scheduler import DemandScheduler
from zephon.state import (
    STATE_FORMAT,
    STATE_VERSION,
    check_fingerprint,
    check_header,
    make_fingerprint,
)
from zephon.tokenize import TokenizerInfo, resolve_tokenizer
from zephon.tolerant import dropped_count, dropped_state, restore_dropped


class ZephonLoader:
    """Deterministic, elastic loader for one data-parallel rank.

    Args:
        recipe: a Recipe or the path of a recipe TOML.
        tokenizer: path of a `tokenizer.json` (or a loaded TokenizerInfo).
        seq_len: tokens per training row (rows hold seq_len + 1 tokens).
        global_batch_size: rows per step over all ranks (a multiple of the lanes).
        micro_batch_size: rows per micro-batch (sets the rows every rank runs per
            step, `Batch.padded_to`, when ranks own different numbers of lanes).
        dp_rank, dp_size: this rank and the data-parallel degree.
        num_workers, prefetch, lookahead_tokens, cache_dir: execution settings;
            None takes the recipe's. They never change a byte of output.
        block_prefetch: deprecated and ignored (lookahead is one token budget).
        trace: record (source, document index) of every packed document per
            lane in `self.traces` (for accounting tests and debugging).
    """

    def __init__(
        self,
        recipe: Recipe | str | os.PathLike[str],
        tokenizer: str | os.PathLike[str] | TokenizerInfo,
        seq_len: int,
        global_batch_size: int,
        micro_batch_size: int | None = None,
        dp_rank: int = 0,
        dp_size: int = 1,
        num_workers: int | None = None,
        prefetch: int | None = None,
        block_prefetch: int | None = None,
        cache_dir: str | None = None,
        trace: bool = False,
        lookahead_tokens: int | None = None,
    ):
        self.recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
        ex = self.recipe.execution
        self.layout = plan_layout(self.recipe.lanes, dp_size, global_batch_size, micro_batch_size)
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.tok = resolve_tokenizer(tokenizer, self.recipe)
        self.seq_len, self.global_batch_size = seq_len, global_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.rows_per_lane = self.layout.rows_per_lane
        self.lane_ids = self.layout.lanes_of(dp_rank)
        self.num_workers = ex.workers if num_workers is None else num_workers
        self.prefetch = ex.prefetch if prefetch is None else prefetch
        readers, plans = open_sources(self.recipe, cache_dir or ex.cache_dir or None)
        if block_prefetch is not None:
            warnings.warn(
                "ZephonLoader(block_prefetch=...) is deprecated and ignored: lookahead is one "
                "token budget per rank (lookahead_tokens)",
                DeprecationWarning,
                stacklevel=2,
            )
        # Lookahead: one budget in tokens for the rank; default two steps of its rows.
        row_len = seq_len + 1
        rank_step_tokens = len(self.lane_ids) * self.rows_per_lane * row_len
        budget = lookahead_tokens if lookahead_tokens is not None else ex.lookahead_tokens
        self.lookahead_tokens = budget or 2 * rank_step_tokens
        self._scheduler: DemandScheduler | None = DemandScheduler(
            self.tok,
            self.num_workers,
            self.lookahead_tokens,
            UniformSteps(self.rows_per_lane * row_len),
            self.recipe.mixture.unit,
        )
        self.source_names = tuple(s.name for s in self.recipe.sources)
        self.ctx = PipelineContext(self.recipe, readers, plans, self.tok, row_len, self._scheduler)
        self.fingerprint = make_fingerprint(
            self.recipe, readers, self.tok, seq_len, global_batch_size
        )
        self.traces: dict[int, list[tuple[int, int]]] | None = (
            {lane: [] for lane in self.lane_ids} if trace else None
        )
        self._producer: BatchProducer | None = None
        start = initial_snapshot(self.recipe)
        self._plan_start({lane: (start, 0) for lane in self.lane_ids}, step=0)

    # -- production -------------------------------------------------------

    def _plan_start(self, points: dict[int, tuple[FlushPoint, int]], step: int) -> None:
        """Set where each lane starts: (flush point, rows to replay after it).

        Nothing runs until the first batch is asked for, so a loader that is
        built and then restored from a checkpoint does no wasted work.
        """
        self.step = step
        self._ended = False
        self._flushes = FlushLog({lane: flush for lane, (flush, _) in points.items()})
        self._producer = BatchProducer(
            self.ctx, points, step, self.rows_per_lane, self.prefetch, self.traces
        )

    def start(self) -> None:
        """Build the lanes, replay to the consumed row and begin prefetching.

        Happens on the first `next_batch`; call it to start work earlier.
        """
        assert self._producer is not None and self._scheduler is not None
        if self._producer.started:
            return
        passed = self._producer.start()
        for lane, points in passed.items():
            self._flushes.add(lane, points, self.step * self.rows_per_lane)

    @property
    def lanes(self) -> list[LaneStream]:
        """This rank's lanes, in lane order (empty before `start`)."""
        return self._producer.lanes if self._producer is not None else []

    @property
    def replay(self) -> dict[str, int]:
        """Work of the last start's replay: rows, documents packed and tokenized, tokens."""
        assert self._producer is not None
        return self._producer.replay

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
        self.start()
        assert self._producer is not None
        item = self._producer.next()
        if item is END:
            self._ended = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        batch, flushes = item  # type: ignore[misc]
        batch.padded_to, batch.pad_id = self.layout.rows_per_rank, self.tok.pad_id
        self.step += 1
        for lane, points in flushes.items():
            self._flushes.add(lane, points, self.step * self.rows_per_lane)
        return batch

    def __iter__(self) -> Any:
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    def state_dict(self) -> dict[str, Any]:
        """This rank's state (its lanes only); merge ranks with merge_rank_states."""
        consumed = self.step * self.rows_per_lane
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "step": self.step,
            "rows_per_lane_per_step": self.rows_per_lane,
            "rank": self.dp_rank,
            "lanes": self._flushes.state_lanes(self.lane_ids, consumed),
        }
        if self.recipe.bad_records == "drop":  # absent otherwise: older states stay as they were
            state["dropped_records"] = dropped_state(self.ctx.readers)
        return state

    def dropped_records(self) -> int:
        """Bad records this rank's readers replaced by empty documents so far."""
        return dropped_count(self.ctx.readers)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a (merged or single-rank) state written at any data-parallel size."""
        check_header(state)
        check_fingerprint(state["fingerprint"], self.fingerprint)
        points = restore_points(state, self.lane_ids, self.rows_per_lane)
        restore_dropped(self.ctx.readers, state.get("dropped_records", {}))
        self._discard_lanes()
        if self.traces is not None:
            self.traces = {lane: [] for lane in self.lane_ids}
        self._plan_start(points, int(state["step"]))

    def _discard_lanes(self) -> None:
        """Stop producing and drop queued work of the current lanes."""
        if self._producer is not None:
            self._producer.stop()
        if self._scheduler is not None:
            self._scheduler.reset()

    def stats(self) -> dict[str, Any]:
        """Counts of the work done since the start or the last restore.

        docs/tokens_tokenized: documents and token ids (EOS included) produced
        by the tokenizer; pretokenized sources are counted apart. first_batch:
        the same counts when the first batch was assembled (replay included),
        with the non-padding tokens of its rows. The prefetch thread may be a
        step or two ahead of the trainer."""
        work = self._scheduler.stats() if self._scheduler is not None else {}
        first = self.first_batch
        return {
            "step": self.step,
            "docs_packed": sum(lane.docs_packed for lane in self.lanes),
            "docs_tokenized": work.get("docs_tokenized", 0) + work.get("docs_pretokenized", 0),
            "tokens_tokenized": work.get("tokens_tokenized", 0)
            + work.get("tokens_pretokenized", 0),
            "work": work,
            "first_batch": dict(first) if first else None,
            "replay": dict(self.replay),
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
