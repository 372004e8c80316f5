"""A lane: one deterministic, infinite stream of packed rows.

The lane is the accumulator side of the pipeline: single-threaded, it decides
which source the next document comes from (Mixer), walks each source in its
visiting order (SourceCursor, over the lane's LaneDocs) and packs documents
into rows (packing.py). Documents come from the scheduler (scheduler.py) feed
by feed, each feed in its fixed visiting order, so the worker count,
lookahead and prefetch depth never change the output.

A lane's whole position is a small snapshot: per source (epoch, documents
taken, retired), the mixing counters, and for `concat` the tokens of the
current document already emitted. Flush points record such snapshots with
their row index; a resume restores one and replays to the consumed row.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from zephon.context import PipelineContext
from zephon.feeds import Feed, FeedStart, LaneDemand
from zephon.lane_docs import LaneDocs
from zephon.mixing import Mixer
from zephon.packing import BestFitPacker, ConcatPacker, Piece, RowBuilder
from zephon.recipe import Recipe


class SourceCursor:
    """A lane's position in one source; documents come from the scheduler's feed."""

    def __init__(
        self,
        ctx: PipelineContext,
        demand: LaneDemand,
        source: int,
        docs: LaneDocs,
        epoch: int,
        pos: int,
        retired: bool,
    ):
        self.ctx, self.source, self.docs = ctx, source, docs
        self.epoch, self.pos, self.retired = epoch, pos, retired
        self._epoch_docs = 0  # documents of the lane in self.epoch
        if not retired:
            self._roll()
        start = FeedStart(ctx.readers[source], docs, self.epoch, self.pos, self.retired)
        self.feed: Feed = ctx.scheduler.add_feed(demand, source, start)

    def _roll(self) -> None:
        """Apply the end-of-epoch rule: next epoch (repeat) or retired (stop)."""
        at = self.docs.position(self.epoch, self.pos)
        if at is None:
            self.retired = True
        else:
            self.epoch, self.pos = at
            self._epoch_docs = self.docs.epoch_docs(self.epoch)

    def next_doc(self) -> tuple[np.ndarray, int] | None:
        """(tokens, document index) of the next document, or None once retired."""
        if self.retired:
            return None
        got = self.ctx.scheduler.take(self.feed)
        if got is None:
            self.retired = True
            return None
        self.pos += 1
        if self.pos >= self._epoch_docs:
            self._roll()
        return got


def initial_snapshot(recipe: Recipe) -> dict[str, Any]:
    """The flush point every lane starts from: nothing taken from any source."""
    names = [s.name for s in recipe.sources]
    return {
        "row": 0,
        "mix": [0] * len(names),
        "sources": {n: {"epoch": 0, "pos": 0, "retired": False} for n in names},
        "skip_tokens": 0,
    }


class LaneStream:
    """Rows of one lane, produced on demand; records its flush points."""

    def __init__(
        self,
        ctx: PipelineContext,
        lane: int,
        snapshot: dict[str, Any],
        trace: list[tuple[int, int]] | None = None,
    ):
        self.ctx, self.lane, self.trace = ctx, lane, trace
        recipe = ctx.recipe
        names = [s.name for s in recipe.sources]
        self.rows_emitted = int(snapshot["row"])
        weights = [s.weight for s in recipe.sources]
        self.mixer = Mixer(weights, recipe.mixture.unit, snapshot["mix"])
        packing = recipe.packing
        skip = int(snapshot["skip_tokens"]) if packing.algorithm == "concat" else 0
        # The scheduler follows the lane in its own stream's token offsets.
        offset = self.rows_emitted * ctx.row_len - skip
        demand = ctx.scheduler.add_lane(lane, self.mixer.counts, offset, weights)
        self.cursors = [
            SourceCursor(
                ctx,
                demand,
                i,
                ctx.lane_docs(i, lane),
                int(snapshot["sources"][n]["epoch"]),
                int(snapshot["sources"][n]["pos"]),
                bool(snapshot["sources"][n]["retired"]),
            )
            for i, n in enumerate(names)
        ]
        self.num_sources = len(names)
        self.names = names
        self.row_sources: deque[tuple[list[int], list[int]]] = deque()
        self.last_sources: tuple[list[int], list[int]] | None = None
        if packing.algorithm == "concat":
            self.packer: ConcatPacker | BestFitPacker = ConcatPacker(
                ctx.row_len, packing.flush_interval, int(snapshot["skip_tokens"])
            )
        else:
            self.packer = BestFitPacker(
                ctx.row_len, packing.open_bins, packing.flush_interval, self.rows_emitted
            )
        self.out: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self.flushes: list[dict[str, Any]] = []  # after the starting one, which the loader holds
        self.docs_packed = 0
        self.ended = False
        self._rows = RowBuilder(ctx.row_len, ctx.tok.pad_id, self.num_sources)

    # -- the interface packers use ---------------------------------------

    def snapshot(self) -> tuple:
        return tuple(self.mixer.counts), [(c.epoch, c.pos, c.retired) for c in self.cursors]

    def flush_point(self, snapshot: tuple, skip_tokens: int) -> None:
        mix, positions = snapshot
        names = self.names
        self.flushes.append(
            {
                "row": self.rows_emitted,
                "mix": list(mix),
                "sources": {
                    n: {"epoch": e, "pos": p, "retired": r}
                    for n, (e, p, r) in zip(names, positions, strict=True)
                },
                "skip_tokens": skip_tokens,
            }
        )

    def pick(self) -> tuple[np.ndarray, int] | None:
        """The next document's ids and its source index; None once every source ended."""
        cursors, mixer = self.cursors, self.mixer
        while True:
            active = [not c.retired for c in cursors]
            if not any(active):
                return None
            i = mixer.choose(active)
            got = cursors[i].next_doc()
            if got is None:
                continue  # that source just retired; choose among the rest
            ids, doc_id = got
            mixer.record(i, len(ids))
            self.docs_packed += 1
            if self.trace is not None:
                self.trace.append((i, doc_id))
            return ids, i

    def emit(self, pieces: list[Piece]) -> None:
        tokens, positions, src_tokens, src_docs = self._rows.build(pieces)
        self.out.append((tokens, positions))
        self.row_sources.append((src_tokens, src_docs))
        self.rows_emitted += 1

    # -- the interface the loader uses --------------------------------------

    def next_row(self) -> tuple[np.ndarray, np.ndarray] | None:
        while not self.out and not self.ended:
            if not self.packer.fill(self):
                self.ended = True
        if not self.out:
            return None
        self.last_sources = self.row_sources.popleft()
        return self.out.popleft()

    def take_flushes(self) -> list[dict[str, Any]]:
        out, self.flushes = self.flushes, []
        return out
