"""A lane: one deterministic, infinite stream of packed rows.

The lane is the accumulator side of the pipeline: single-threaded, it decides
which source the next document comes from (Mixer), walks each source in its
visiting order (SourceCursor, over the lane's LaneDocs) and packs documents
into rows (packing.py). Documents come from the scheduler (scheduler.py) feed
by feed, each feed in its fixed visiting order, so the worker count,
lookahead and prefetch depth never change the output.

A lane's whole position is a small snapshot: per source (epoch, documents
taken, retired), the mixing counters by source name, and for `concat` the
tokens of the current document already emitted, or the documents it carries
(a phase boundary cut them; packing.py). Flush points record such snapshots
with their row index, counted from the start of the lane's segment (the
phases one lane stream spans, phases.py); a resume restores one and replays
to the consumed row.

Documents with images (images/documents.py) are fitted to the lane's rows
when picked or carried in (an image block longer than a row is an error
naming the record, or left out under `bad_records = "drop"`), and each row
records the images it holds, for the batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.demand.feeds import Feed, FeedStart, LaneDemand
from zephon.errors import StateError
from zephon.images.documents import (
    DocImage,
    ImageDocIds,
    fit_row,
    original_of,
    original_offset,
    row_images,
)
from zephon.lanes.documents import LaneDocs
from zephon.lanes.mixing import Mixer
from zephon.lanes.packing import BestFitPacker, Carry, ConcatPacker, Piece, RowBuilder
from zephon.recipe.phases import Segment
from zephon.schema.recipe import Recipe
from zephon.sources.bad_records import DroppingReader
from zephon.streams.context import PipelineContext


class SourceCursor:
    """A lane's position in one source; documents come from the scheduler's feed
    (`feed`: one that already follows this position, kept across a boundary)."""

    def __init__(
        self,
        ctx: PipelineContext,
        demand: LaneDemand,
        source: int,
        docs: LaneDocs,
        epoch: int,
        pos: int,
        retired: bool,
        feed: Feed | None = None,
    ):
        self.ctx, self.source, self.docs = ctx, source, docs
        self.epoch, self.pos, self.retired = epoch, pos, retired
        self._epoch_docs = 0  # documents of the lane in self.epoch
        if not retired:
            self._roll()
        if feed is None:
            reader, images = ctx.readers[source], ctx.images_of(source)
            start = FeedStart(reader, docs, self.epoch, self.pos, self.retired, images)
            feed = ctx.scheduler.add_feed(demand, source, start)
        self.feed: Feed = feed

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
        "mix": {n: 0 for n in names},
        "sources": {n: {"epoch": 0, "pos": 0, "retired": False} for n in names},
        "skip_tokens": 0,
    }


UNTOUCHED = {"epoch": 0, "pos": 0, "retired": False}  # a source added after the snapshot


def mix_counts(mix: Any, names: Sequence[str]) -> list[int]:
    """Mixer counts in recipe source order, from a snapshot's (by name; a source
    the snapshot does not know has taken nothing)."""
    if isinstance(mix, list):
        return [int(c) for c in mix]
    return [int(mix.get(n, 0)) for n in names]


class LaneStream:
    """Rows of one lane of a segment, produced on demand; records its flush points."""

    def __init__(
        self,
        ctx: PipelineContext,
        segment: Segment,
        lane: int,
        snapshot: dict[str, Any],
        trace: list[tuple[int, int]] | None = None,
        before: LaneStream | None = None,
        known: dict[tuple[int, int], np.ndarray] | None = None,
    ):
        """`before`: the same lane in the segment that just ended, with the same lane
        count: its feeds (and the documents they hold) go on serving this one.
        `known`: ids of carried documents already in memory, by (source, index)."""
        self.ctx, self.lane, self.trace = ctx, lane, trace
        recipe = ctx.recipe
        names = [s.name for s in recipe.sources]
        self.row_len, self.end_row = segment.row_len, segment.end_row
        self.rows_emitted = int(snapshot["row"])
        weights = list(segment.weights)
        self.mixer = Mixer(weights, recipe.mixture.unit, mix_counts(snapshot["mix"], names))
        packing = recipe.packing
        concat = packing.algorithm == "concat"
        skip = int(snapshot["skip_tokens"]) if concat else 0
        # Documents a boundary cut: their rests come first (read and tokenized here).
        known = known or {}
        carried = []
        for n, d, off in snapshot.get("carry", []):
            i = names.index(n)
            ids = known[(i, d)] if (i, d) in known else ctx.fetch(i, int(d))
            if type(ids) is ImageDocIds:  # fitted to this segment's rows from its offset on
                ids = self._fit(ids, i, int(d), int(off))
            carried.append((ids, i, int(d), int(off)))
        tails = sum(len(ids) - off for ids, _, _, off in carried)
        # The scheduler follows the lane in its own stream's token offsets.
        offset = self.rows_emitted * self.row_len - skip + tails
        feeds: list[Feed | None] = [None] * len(names)
        if before is not None:
            demand = before.demand
            ctx.scheduler.rebase(demand, self.mixer.counts, offset, weights)
            feeds = [c.feed for c in before.cursors]
            if before.unpicked is not None:  # best_fit gave it back: first in its feed again
                ids, i, d = before.unpicked
                ctx.scheduler.give_back(feeds[i], ids, d)  # type: ignore[arg-type]
        else:
            demand = ctx.scheduler.add_lane(lane, self.mixer.counts, offset, weights)
        self.demand = demand
        sources = snapshot["sources"]
        self.cursors = [
            SourceCursor(
                ctx,
                demand,
                i,
                ctx.lane_docs(i, lane, segment.lanes),
                int(sources.get(n, UNTOUCHED)["epoch"]),
                int(sources.get(n, UNTOUCHED)["pos"]),
                bool(sources.get(n, UNTOUCHED)["retired"]),
                feeds[i],
            )
            for i, n in enumerate(names)
        ]
        self.num_sources = len(names)
        self.names = names
        self.row_sources: deque[tuple[list[int], list[int]]] = deque()
        self.last_sources: tuple[list[int], list[int]] | None = None
        if concat:
            self.packer: ConcatPacker | BestFitPacker = ConcatPacker(
                self.row_len, packing.flush_interval, skip, carried, self.end_row
            )
        else:
            self.packer = BestFitPacker(
                self.row_len,
                packing.open_bins,
                packing.flush_interval,
                self.rows_emitted,
                self.end_row,
            )
        self.out: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self.flushes: list[dict[str, Any]] = []  # after the starting one, which the loader holds
        self.last_flush = snapshot
        self.last_pick: tuple[np.ndarray, int, int] | None = None
        self.unpicked: tuple[np.ndarray, int, int] | None = None
        self.docs_packed = 0
        self.ended = False
        self._rows = RowBuilder(self.row_len, ctx.tok.pad_id, self.num_sources)
        # Rows' images (position of the first placeholder, image): recipes with images only.
        self.images = ctx.images is not None
        self.row_images: deque[list[tuple[int, DocImage]]] = deque()
        self.last_images: list[tuple[int, DocImage]] = []

    def _fit(self, ids: ImageDocIds, source: int, doc: int, after: int = 0) -> ImageDocIds:
        reader = self.ctx.readers[source]
        drop = reader if isinstance(reader, DroppingReader) else None
        return fit_row(ids, self.row_len, drop, doc, after)

    # -- the interface packers use ---------------------------------------

    def snapshot(self) -> tuple:
        return tuple(self.mixer.counts), [(c.epoch, c.pos, c.retired) for c in self.cursors]

    def flush_point(self, snapshot: tuple, skip_tokens: int, carry: Sequence[Carry] = ()) -> None:
        mix, positions = snapshot
        names = self.names
        point: dict[str, Any] = {
            "row": self.rows_emitted,
            "mix": dict(zip(names, mix, strict=True)),
            "sources": {
                n: {"epoch": e, "pos": p, "retired": r}
                for n, (e, p, r) in zip(names, positions, strict=True)
            },
            "skip_tokens": skip_tokens,
        }
        if carry:  # only where a boundary cut documents: other points stay as they were
            point["carry"] = [[names[s], d, off] for s, d, off in carry]
        self.flushes.append(point)
        self.last_flush = point

    def pick(self) -> tuple[np.ndarray, int, int] | None:
        """The next document's ids, its source index and its index in the source;
        None once every source of the phase ended."""
        cursors, mixer = self.cursors, self.mixer
        while True:
            active = [not c.retired for c in cursors]
            i = mixer.choose(active) if any(active) else -1
            if i < 0:
                return None
            got = cursors[i].next_doc()
            if got is None:
                continue  # that source just retired; choose among the rest
            ids, doc_id = got
            picked = ids
            if type(ids) is ImageDocIds:
                ids = self._fit(ids, i, doc_id)
            mixer.record(i, len(ids))
            self.docs_packed += 1
            if self.trace is not None:
                self.trace.append((i, doc_id))
            self.last_pick = (picked, i, doc_id)
            return ids, i, doc_id

    def unpick(self) -> None:
        """The last pick was given back (best_fit at a boundary): it is not packed here.
        The lane stops at its boundary; the flush point there is from before the pick."""
        self.docs_packed -= 1
        self.unpicked = self.last_pick
        if self.trace is not None:
            self.trace.pop()

    def emit(self, pieces: list[Piece]) -> None:
        tokens, positions, src_tokens, src_docs = self._rows.build(pieces)
        self.out.append((tokens, positions))
        self.row_sources.append((src_tokens, src_docs))
        if self.images:
            self.row_images.append(row_images(pieces))
        self.rows_emitted += 1

    # -- the interface the loader uses --------------------------------------

    def next_row(self) -> tuple[np.ndarray, np.ndarray] | None:
        while not self.out and not self.ended:
            if not self.packer.fill(self):
                self.ended = True
        if not self.out:
            return None
        self.last_sources = self.row_sources.popleft()
        if self.images:
            self.last_images = self.row_images.popleft()
        return self.out.popleft()

    def take_flushes(self) -> list[dict[str, Any]]:
        out, self.flushes = self.flushes, []
        return out

    def held_docs(self) -> dict[tuple[int, int], np.ndarray]:
        """Ids of the documents the lane's flush points carry, by (source, index)."""
        if not isinstance(self.packer, ConcatPacker):
            return {}
        return {k: original_of(ids) for k, ids in self.packer.held().items()}

    def boundary_point(self) -> dict[str, Any]:
        """The lane's flush point at its boundary row, where it stands now. A point
        that names the document cut there by re-picking it (the skip form: a state
        written before the boundary was in the recipe) is turned into a carry."""
        point = self.last_flush
        if self.rows_emitted != self.end_row or point["row"] != self.end_row or self.out:
            raise StateError(
                f"lane {self.lane}: not at its boundary row {self.end_row} "
                f"(at row {self.rows_emitted}, flush point at row {point['row']})"
            )
        skip = int(point.get("skip_tokens", 0))
        if skip and isinstance(self.packer, ConcatPacker):
            got = self.pick()  # the document the run had cut here: the same pick
            if got is None:
                raise StateError(f"lane {self.lane}: data ended at its boundary row")
            ids, source, doc = got
            self.flush_point(self.snapshot(), 0, [(source, doc, original_offset(ids, skip))])
            point = self.take_flushes()[-1]
        return point
