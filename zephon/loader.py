"""ZephonLoader: one data-parallel rank's view of the global batch stream.

The rank owns lanes [r*L/D, (r+1)*L/D). Each step it takes G/L rows from
every owned lane, in lane order; concatenating all ranks' batches in rank
order gives the same bytes for any D that divides L. A background thread
produces steps ahead of the trainer (prefetch); the checkpoint state counts
only the steps the trainer took.
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
from typing import Any

import numpy as np

from zephon.batch import Batch, rows_to_batch
from zephon.digest import rows_digest
from zephon.errors import LayoutError, StateError
from zephon.lane import LaneStream, PipelineContext, initial_snapshot
from zephon.layout import plan_layout
from zephon.recipe import Recipe, load_recipe
from zephon.shuffle import SourcePlan
from zephon.sources import SourceReader
from zephon.state import STATE_FORMAT, STATE_VERSION, check_fingerprint, check_header
from zephon.tokenize import TokenizerInfo, resolve_tokenizer
from zephon.tolerant import dropped_count, dropped_state, restore_dropped, with_policy
from zephon.workers import DemandScheduler

_END = object()


class ZephonLoader:
    """Deterministic, elastic loader for one data-parallel rank.

    Args:
        recipe: a Recipe or the path of a recipe TOML.
        tokenizer: path of a `tokenizer.json` (or a loaded TokenizerInfo).
        seq_len: tokens per training row (rows hold seq_len + 1 tokens).
        global_batch_size: rows per step over all ranks (a multiple of the lanes).
        micro_batch_size: rows per micro-batch (only validated here).
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
        lanes = self.recipe.lanes
        self.layout = plan_layout(lanes, dp_size, global_batch_size, micro_batch_size)
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.tok = resolve_tokenizer(tokenizer, self.recipe)
        self.seq_len, self.global_batch_size = seq_len, global_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.rows_per_lane = self.layout.rows_per_lane
        self.lane_ids = self.layout.lanes_of(dp_rank)
        self.num_workers = ex.workers if num_workers is None else num_workers
        self.prefetch = ex.prefetch if prefetch is None else prefetch
        cache = cache_dir or ex.cache_dir or None
        readers = [
            with_policy(SourceReader(s, cache), self.recipe.bad_records)
            for s in self.recipe.sources
        ]
        try:
            plans = [
                SourcePlan(
                    s.name,
                    r.num_docs,
                    lanes,
                    self.recipe.shuffle.block_size,
                    self.recipe.seed,
                    self.recipe.shuffle.enabled,
                )
                for s, r in zip(self.recipe.sources, readers, strict=True)
            ]
        except LayoutError as exc:
            raise LayoutError(f"{self.recipe.path}: {exc}") from None
        if block_prefetch is not None:
            warnings.warn(
                "ZephonLoader(block_prefetch=...) is deprecated and ignored: lookahead is one "
                "token budget per rank (lookahead_tokens)",
                DeprecationWarning,
                stacklevel=2,
            )
        # Lookahead: one budget in tokens for the rank; default two steps of its rows.
        rank_step_tokens = len(self.lane_ids) * self.rows_per_lane * (seq_len + 1)
        budget = lookahead_tokens if lookahead_tokens is not None else ex.lookahead_tokens
        self.lookahead_tokens = budget or 2 * rank_step_tokens
        self._work: DemandScheduler | None = DemandScheduler(
            self.tok,
            self.num_workers,
            self.lookahead_tokens,
            self.rows_per_lane * (seq_len + 1),
            [s.weight for s in self.recipe.sources],
            self.recipe.mixture.unit,
        )
        self.source_names = tuple(s.name for s in self.recipe.sources)
        self.ctx = PipelineContext(
            recipe=self.recipe,
            readers=readers,
            plans=plans,
            tok=self.tok,
            row_len=seq_len + 1,
            work=self._work,
        )
        self.fingerprint = {
            "recipe": self.recipe.digest(),
            "sources": {
                s.name: r.num_docs for s, r in zip(self.recipe.sources, readers, strict=True)
            },
            "tokenizer": self.tok.fingerprint,
            # Only when a special token differs from the bare tokenizer.json's (DESIGN §11).
            **({"tokenizer_choices": self.tok.choices} if self.tok.choices else {}),
            "seq_len": seq_len,
            "global_batch_size": global_batch_size,
            "lanes": lanes,
            "seed": self.recipe.seed,
        }
        remote = {u: v for r in readers for u, v in r.remote_versions().items()}
        if remote:  # only for remote sources, so local fingerprints stay as they were
            self.fingerprint["remote"] = remote
        self.traces: dict[int, list[tuple[int, int]]] | None = (
            {lane: [] for lane in self.lane_ids} if trace else None
        )
        self._thread: threading.Thread | None = None
        self.lanes: list[LaneStream] = []
        start = initial_snapshot(self.recipe)
        self._plan_start({lane: (start, 0) for lane in self.lane_ids}, step=0)

    # -- production -------------------------------------------------------

    def _plan_start(self, points: dict[int, tuple[dict[str, Any], int]], step: int) -> None:
        """Set where each lane starts: (flush point, rows to replay after it).

        Nothing runs until the first batch is asked for, so a loader that is
        built and then restored from a checkpoint does no wasted work.
        """
        self._start_points, self.step = points, step
        self._started, self._ended = False, False
        self._flush_log: dict[int, list[dict[str, Any]]] = {
            lane: [flush] for lane, (flush, _) in points.items()
        }
        self.replay = {"rows": 0, "docs_packed": 0, "docs_tokenized": 0, "tokens_tokenized": 0}
        self.first_batch: dict[str, int] | None = None

    def start(self) -> None:
        """Build the lanes, replay to the consumed row and begin prefetching.

        Happens on the first `next_batch`; call it to start work earlier.
        """
        if self._started:
            return
        self._started = True
        assert self._work is not None
        # Replayed rows and the first batch are all "needed" work for the scheduler.
        self._work.set_floor(self.step)
        self.lanes = [
            LaneStream(self.ctx, lane, flush, self.traces[lane] if self.traces else None)
            for lane, (flush, _) in self._start_points.items()
        ]
        consumed = self.step * self.rows_per_lane
        for lane in self.lanes:
            skip = self._start_points[lane.lane][1]
            for _ in range(skip):  # replay: rebuild and drop rows already consumed
                if lane.next_row() is None:
                    raise StateError(
                        f"lane {lane.lane}: data ended while replaying to row {consumed}"
                    )
            self.replay["rows"] += skip
            self.replay["docs_packed"] += lane.docs_packed
            self._flush_log[lane.lane].extend(lane.take_flushes())
            self._prune(lane.lane)
        work = self._work.stats()
        self.replay["docs_tokenized"] = work["docs_tokenized"] + work["docs_pretokenized"]
        self.replay["tokens_tokenized"] = work["tokens_tokenized"] + work["tokens_pretokenized"]
        self._produced_step = self.step
        self._launch()

    def _launch(self) -> None:
        """Start producing ahead of the trainer (prefetch > 0) from the current lanes."""
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(self.prefetch, 1))
        self._stop = threading.Event()
        if self.prefetch > 0:
            self._thread = threading.Thread(target=self._run, name="zephon-prefetch", daemon=True)
            self._thread.start()

    def _produce(self) -> tuple[Batch, dict[int, list[dict[str, Any]]]] | None:
        r, row_len = self.rows_per_lane, self.seq_len + 1
        n = len(self.lanes) * r
        assert self._work is not None
        self._work.set_floor(self._produced_step)
        tokens = np.empty((n, row_len), dtype=np.int32)
        positions = np.empty((n, row_len), dtype=np.int32)
        src_tokens = np.zeros(len(self.source_names), dtype=np.int64)
        src_docs = np.zeros(len(self.source_names), dtype=np.int64)
        digests, flushes = [], {}
        for i, lane in enumerate(self.lanes):
            for k in range(r):
                row = lane.next_row()
                if row is None:
                    return None
                tokens[i * r + k], positions[i * r + k] = row
                assert lane.last_sources is not None
                src_tokens += lane.last_sources[0]
                src_docs += lane.last_sources[1]
            digests.append(rows_digest(tokens[i * r : (i + 1) * r], positions[i * r : (i + 1) * r]))
            flushes[lane.lane] = lane.take_flushes()
        if self.first_batch is None:
            # Work done before the first batch was assembled (replay included).
            counts = self._work.set_warm()
            self.first_batch = {
                "docs_tokenized": counts["docs_tokenized"],
                "tokens_tokenized": counts["tokens_tokenized"],
                "docs_pretokenized": counts["docs_pretokenized"],
                "tokens_pretokenized": counts["tokens_pretokenized"],
                "docs_read": counts["docs_read"],
                "row_tokens": int((positions >= 0).sum()),
            }
        batch = rows_to_batch(self._produced_step, tokens, positions, digests)
        batch.source_tokens, batch.source_docs = src_tokens, src_docs
        batch.source_names = self.source_names
        self._produced_step += 1
        return batch, flushes

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                item = self._produce()
                if not self._put(_END if item is None else item) or item is None:
                    return
        except BaseException as exc:  # handed to the trainer's thread, raised there
            self._put(exc)

    def _stop_thread(self) -> None:
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.05)
                except queue.Empty:
                    pass
            self._thread.join()
            self._thread = None

    # -- the trainer's interface ---------------------------------------------

    def next_batch(self) -> Batch:
        """This rank's rows for the next step; StopIteration once a lane runs dry."""
        if self._ended:
            raise StopIteration
        self.start()
        item = self._queue.get() if self._thread is not None else self._produce()
        if item is _END or item is None:
            self._ended = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        batch, flushes = item
        self.step += 1
        for lane, points in flushes.items():
            self._flush_log[lane].extend(points)
            self._prune(lane)
        return batch

    def _prune(self, lane: int) -> None:
        """Keep the newest flush point the trainer has reached, and later ones."""
        log, consumed = self._flush_log[lane], self.step * self.rows_per_lane
        while len(log) > 1 and log[1]["row"] <= consumed:
            log.pop(0)

    def __iter__(self) -> Any:
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    def state_dict(self) -> dict[str, Any]:
        """This rank's state (its lanes only); merge ranks with merge_rank_states."""
        consumed = self.step * self.rows_per_lane
        lanes = {}
        for lane in self.lane_ids:
            flush = self._flush_log[lane][0] if self._flush_log[lane] else None
            if flush is None or flush["row"] > consumed:
                raise StateError(f"lane {lane}: no flush point at or before row {consumed}")
            lanes[str(lane)] = {"flush": flush, "rows_since_flush": consumed - flush["row"]}
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "step": self.step,
            "rows_per_lane_per_step": self.rows_per_lane,
            "rank": self.dp_rank,
            "lanes": lanes,
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
        missing = [lane for lane in self.lane_ids if str(lane) not in state["lanes"]]
        if missing:
            raise StateError(f"loader state has no entry for lane(s) {missing} of this rank")
        step = int(state["step"])
        points = {}
        for lane in self.lane_ids:
            entry = state["lanes"][str(lane)]
            flush = entry["flush"]
            if flush["row"] + entry["rows_since_flush"] != step * self.rows_per_lane:
                raise StateError(
                    f"lane {lane}: flush row {flush['row']} + {entry['rows_since_flush']} rows "
                    f"does not match step {step} x {self.rows_per_lane} rows"
                )
            points[lane] = (flush, int(entry["rows_since_flush"]))
        restore_dropped(self.ctx.readers, state.get("dropped_records", {}))
        self._discard_lanes()
        if self.traces is not None:
            self.traces = {lane: [] for lane in self.lane_ids}
        self._plan_start(points, step)

    def _discard_lanes(self) -> None:
        """Stop producing and drop queued work of the current lanes."""
        self._stop_thread()
        if self._work is not None:
            self._work.reset()
        self.lanes = []

    def stats(self) -> dict[str, Any]:
        """Counts of the work done since the start or the last restore.

        docs/tokens_tokenized: documents and token ids (EOS included) produced
        by the tokenizer; pretokenized sources are counted apart. first_batch:
        the same counts when the first batch was assembled (replay included),
        with the non-padding tokens of its rows. The prefetch thread may be a
        step or two ahead of the trainer."""
        work = self._work.stats() if self._work is not None else {}
        return {
            "step": self.step,
            "docs_packed": sum(lane.docs_packed for lane in self.lanes),
            "docs_tokenized": work.get("docs_tokenized", 0) + work.get("docs_pretokenized", 0),
            "tokens_tokenized": work.get("tokens_tokenized", 0)
            + work.get("tokens_pretokenized", 0),
            "work": work,
            "first_batch": dict(self.first_batch) if self.first_batch else None,
            "replay": dict(self.replay),
        }

    def close(self) -> None:
        self._discard_lanes()
        if self._work is not None:
            self._work.close()
            self._work = None

    def __enter__(self) -> ZephonLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
