"""A lane: one deterministic, infinite stream of packed rows.

The lane is the accumulator side of the pipeline: single-threaded, it decides
which source the next document comes from (Mixer), walks each source in its
shuffled order (SourceCursor) and packs documents into rows (packing.py).
Tokenized blocks come from workers through futures consumed in submission
order, so the worker count and prefetch depth never change the output.

A lane's whole position is a small snapshot: per source (epoch, documents
taken, retired), the mixing counters, and for `concat` the tokens of the
current document already emitted. Flush points record such snapshots with
their row index; a resume restores one and replays to the consumed row.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.mixing import Mixer
from zephon.packing import BestFitPacker, ConcatPacker
from zephon.recipe import Recipe
from zephon.shuffle import SourcePlan
from zephon.sources import SourceReader
from zephon.tokenize import TokenizedBlock, TokenizerInfo

# submit(reader, plan, epoch, block, skip) -> handle with .result() and .cancel()
Submit = Callable[[SourceReader, SourcePlan, int, int, int], Any]


@dataclass
class PipelineContext:
    """What every lane of a loader shares: readers, plans, tokenizer, settings."""

    recipe: Recipe
    readers: list[SourceReader]
    plans: list[SourcePlan]
    tok: TokenizerInfo
    row_len: int
    submit: Submit
    block_prefetch: int


class SourceCursor:
    """A lane's position in one source, with tokenized blocks prefetched ahead."""

    def __init__(
        self, ctx: PipelineContext, source: int, lane: int, epoch: int, pos: int, retired: bool
    ):
        self.ctx, self.source, self.lane = ctx, source, lane
        self.plan, self.reader = ctx.plans[source], ctx.readers[source]
        self.repeat = ctx.recipe.sources[source].on_exhausted == "repeat"
        self.epoch, self.pos, self.retired = epoch, pos, retired
        self.tokenized = 0  # documents tokenized for this lane (replay accounting)
        self.block: TokenizedBlock | None = None
        self.k = 0
        # Blocks queued in visiting order: (epoch, index in lane's block list, skip, future).
        self.queue: deque[tuple[int, int, int, Any]] = deque()
        self._next: tuple[int, int, int] | None = None
        if not retired:
            self._normalise()
            if not self.retired:
                j, off = self.plan.locate(self.epoch, lane, self.pos)
                self._next = (self.epoch, j, off)
                # One block now; deeper lookahead once this lane starts reading, so
                # every lane's first block is queued before anyone's second.
                self._schedule(depth=1)

    def _normalise(self) -> None:
        """At the end of an epoch, move to the next one (repeat) or retire (stop)."""
        if self.pos >= self.plan.lane_docs(self.epoch, self.lane):
            if self.repeat:
                self.epoch, self.pos = self.epoch + 1, 0
            else:
                self.retired = True

    def _schedule(self, depth: int | None = None) -> None:
        depth = depth or self.ctx.block_prefetch
        while self._next is not None and len(self.queue) < depth:
            epoch, j, skip = self._next
            blocks, _ = self.plan.lane_blocks(epoch, self.lane)
            fut = self.ctx.submit(self.reader, self.plan, epoch, int(blocks[j]), skip)
            self.queue.append((epoch, j, skip, fut))
            if j + 1 < len(blocks):
                self._next = (epoch, j + 1, 0)
            else:
                self._next = (epoch + 1, 0, 0) if self.repeat else None

    def next_doc(self) -> tuple[np.ndarray, int] | None:
        """(tokens, document index) of the next document, or None once retired."""
        if self.retired:
            return None
        while self.block is None or self.k == len(self.block.docs):
            if not self.queue:
                self.retired = True
                return None
            _, _, _, fut = self.queue.popleft()
            self.block, self.k = fut.result(), 0
            self.tokenized += len(self.block.docs)
            self._schedule()
        doc, doc_id = self.block.docs[self.k], int(self.block.doc_ids[self.k])
        self.k += 1
        self.pos += 1
        self._normalise()
        return doc, doc_id

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
        self.cursors = [
            SourceCursor(
                ctx,
                i,
                lane,
                int(snapshot["sources"][n]["epoch"]),
                int(snapshot["sources"][n]["pos"]),
                bool(snapshot["sources"][n]["retired"]),
            )
            for i, n in enumerate(names)
        ]
        packing = recipe.packing
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
            doc, doc_id = got
            self.mixer.record(i, len(doc))
            self.docs_packed += 1
            if self.trace is not None:
                self.trace.append((i, doc_id))
            return doc

    def emit(self, pieces: list[np.ndarray]) -> None:
        row_len = self.ctx.row_len
        tokens = np.full(row_len, self.ctx.tok.pad_id, dtype=np.int32)
        positions = np.full(row_len, -1, dtype=np.int32)
        at = 0
        for p in pieces:
            n = len(p)
            tokens[at : at + n] = p
            positions[at : at + n] = self._arange[:n]
            at += n
        self.out.append((tokens, positions))
        self.rows_emitted += 1

    # -- the interface the loader uses --------------------------------------

    def next_row(self) -> tuple[np.ndarray, np.ndarray] | None:
        while not self.out and not self.ended:
            if not self.packer.fill(self):
                self.ended = True
        return self.out.popleft() if self.out else None

    def cancel(self) -> None:
        """Drop blocks still queued for workers (the lane is being replaced)."""
        for cursor in self.cursors:
            for *_, fut in cursor.queue:
                fut.cancel()
            cursor.queue.clear()

    def take_flushes(self) -> list[dict[str, Any]]:
        out, self.flushes = self.flushes, []
        return out

    @property
    def docs_tokenized(self) -> int:
        return sum(c.tokenized for c in self.cursors)
