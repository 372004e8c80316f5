"""A lane: one deterministic, infinite stream of packed rows.

The lane is the accumulator side of the pipeline: single-threaded, it decides
which source the next document comes from (Mixer), walks each source in its
shuffled order (SourceCursor) and packs documents into rows (packing.py).
Documents come from the scheduler (workers.py) feed by feed, each feed in its
fixed visiting order, so the worker count, lookahead and prefetch depth never
change the output.

A lane's whole position is a small snapshot: per source (epoch, documents
taken, retired), the mixing counters, and for `concat` the tokens of the
current document already emitted. Flush points record such snapshots with
their row index; a resume restores one and replays to the consumed row.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.mixing import Mixer
from zephon.packing import BestFitPacker, ConcatPacker
from zephon.recipe import Recipe
from zephon.shuffle import SourcePlan
from zephon.sources import SourceReader
from zephon.tokenize import TokenizerInfo
from zephon.workers import DemandScheduler, Feed


@dataclass
class PipelineContext:
    """What every lane of a loader shares: readers, plans, tokenizer, settings."""

    recipe: Recipe
    readers: list[SourceReader]
    plans: list[SourcePlan]
    tok: TokenizerInfo
    row_len: int
    work: DemandScheduler


class SourceIds(np.ndarray):
    """A document's token ids, tagged with its source; slices keep the tag.

    `meta` is [source, first token emitted]: shared by every slice of the
    document, so a row can count the documents that start in it."""

    meta: list

    def __array_finalize__(self, obj: Any) -> None:
        self.meta = getattr(obj, "meta", None)  # type: ignore[assignment]


class SourceCursor:
    """A lane's position in one source; documents come from the scheduler's feed."""

    def __init__(
        self,
        ctx: PipelineContext,
        demand: Any,
        source: int,
        lane: int,
        epoch: int,
        pos: int,
        retired: bool,
    ):
        self.ctx, self.source, self.lane = ctx, source, lane
        self.plan = ctx.plans[source]
        self.repeat = ctx.recipe.sources[source].on_exhausted == "repeat"
        self.epoch, self.pos, self.retired = epoch, pos, retired
        if not retired:
            self._normalise()
        self.feed: Feed = ctx.work.add_feed(
            demand,
            source,
            (ctx.readers[source], self.plan, self.epoch, self.pos, self.retired, self.repeat),
        )

    def _normalise(self) -> None:
        """At the end of an epoch, move to the next one (repeat) or retire (stop)."""
        if self.pos >= self.plan.lane_docs(self.epoch, self.lane):
            if self.repeat:
                self.epoch, self.pos = self.epoch + 1, 0
            else:
                self.retired = True

    def next_doc(self) -> tuple[np.ndarray, int] | None:
        """(tokens, document index) of the next document, or None once retired."""
        if self.retired:
            return None
        got = self.ctx.work.take(self.feed)
        if got is None:
            self.retired = True
            return None
        self.pos += 1
        self._normalise()
        return got

    def position(self) -> tuple[int, int, bool]:
        return self.epoch, self.pos, self.retired


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
        self.mixer = Mixer([s.weight for s in recipe.sources], recipe.mixture.unit, snapshot["mix"])
        packing = recipe.packing
        skip = int(snapshot["skip_tokens"]) if packing.algorithm == "concat" else 0
        # The scheduler follows the lane in its own stream's token offsets.
        demand = ctx.work.add_lane(lane, self.mixer.counts, self.rows_emitted * ctx.row_len - skip)
        self.cursors = [
            SourceCursor(
                ctx,
                demand,
                i,
                lane,
                int(snapshot["sources"][n]["epoch"]),
                int(snapshot["sources"][n]["pos"]),
                bool(snapshot["sources"][n]["retired"]),
            )
            for i, n in enumerate(names)
        ]
        # A concat lane resumed mid-document: that document started before the flush row.
        self._resumed_mid_doc = skip > 0
        self.num_sources = len(names)
        self.row_sources: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self.last_sources: tuple[np.ndarray, np.ndarray] | None = None
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
        self._arange = np.arange(ctx.row_len, dtype=np.int32)

    # -- the interface packers use ---------------------------------------

    def snapshot(self) -> tuple:
        return tuple(self.mixer.counts), tuple(c.position() for c in self.cursors)

    def flush_point(self, snapshot: tuple, skip_tokens: int) -> None:
        mix, positions = snapshot
        names = [s.name for s in self.ctx.recipe.sources]
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

    def pick(self) -> np.ndarray | None:
        while True:
            active = [not c.retired for c in self.cursors]
            if not any(active):
                return None
            i = self.mixer.choose(active)
            got = self.cursors[i].next_doc()
            if got is None:
                continue  # that source just retired; choose among the rest
            ids, doc_id = got
            doc = ids.view(SourceIds)
            doc.meta = [i, self._resumed_mid_doc]
            self._resumed_mid_doc = False
            self.mixer.record(i, len(doc))
            self.docs_packed += 1
            if self.trace is not None:
                self.trace.append((i, doc_id))
            return doc

    def emit(self, pieces: list[np.ndarray]) -> None:
        row_len = self.ctx.row_len
        tokens = np.full(row_len, self.ctx.tok.pad_id, dtype=np.int32)
        positions = np.full(row_len, -1, dtype=np.int32)
        src_tokens = np.zeros(self.num_sources, dtype=np.int64)
        src_docs = np.zeros(self.num_sources, dtype=np.int64)
        at = 0
        for p in pieces:
            n = len(p)
            tokens[at : at + n] = p
            positions[at : at + n] = self._arange[:n]
            at += n
            meta = p.meta  # type: ignore[attr-defined]
            src_tokens[meta[0]] += n
            if not meta[1]:  # the first piece of a document holds its first token
                meta[1] = True
                src_docs[meta[0]] += 1
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
