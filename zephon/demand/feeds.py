"""What the scheduler knows of each lane: its feeds and its mixer's demand.

A `Feed` is one lane's documents from one source, in the lane's visiting
order (from its `LaneDocs`), as the scheduler holds them: read and waiting,
queued for the tokenizer, or tokenized and waiting to be taken. A
`LaneDemand` is one lane's mixer state as the scheduler follows it, and the
replay of that mixer over the documents already tokenized, which tells which
document the lane will need next and where in its stream (the simulation);
after the first batch a cheaper estimate from the lane's shares takes its place.

These are plain objects: the planner (planner.py) changes them and the
executor (scheduler.py) guards them with its lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.demand.stats import SchedulerStats
from zephon.lanes.documents import BlockPart, LaneDocs
from zephon.lanes.mixing import Mixer
from zephon.sources.storage import is_remote


class Slot:
    """One document of a feed: text read (ids None), queued (both None) or tokenized.
    nbytes: image bytes it holds in the lookahead (its patches, reserved while
    queued); peak: its decode peak while queued (images/budget.py)."""

    __slots__ = ("text", "ids", "doc_id", "est", "feed", "nbytes", "peak")

    def __init__(self, text: Any, ids: np.ndarray | None, doc_id: int, feed: Feed):
        self.text, self.ids, self.doc_id, self.est, self.feed = text, ids, doc_id, 0, feed
        self.nbytes = self.peak = 0


@dataclass(frozen=True)
class FeedStart:
    """Where a lane's feed of one source starts.

    reader: the source's reader (any object with `spec` and `read_range`).
    docs: the lane's documents of the source.
    epoch, pos, retired: the lane's cursor in the source.
    images: the image work (images/work.py) of a source with images, else None.
    """

    reader: Any
    docs: LaneDocs
    epoch: int
    pos: int
    retired: bool
    images: Any = None


class Feed:
    """One lane's documents from one source, in the lane's visiting order.

    slots[:sched] are queued for the tokenizer or tokenized; slots[sched:] are
    read and waiting. `next_block` is the next block to read (epoch, index in
    the lane's block list, documents to skip), None at the end of a `stop` source.
    """

    def __init__(self, lane: LaneDemand, source: int, start: FeedStart):
        self.lane, self.source = lane, source
        self.reader, self.docs = start.reader, start.docs
        self.slots: deque[Slot] = deque()
        self.sched = 0
        self.reading = False
        self.dead = False
        self.error: BaseException | None = None
        self.taken = 0
        self.sched_tokens = 0  # tokens of slots[:sched] (estimated while queued)
        self.next_block: tuple[int, int, int] | None = None
        # The block being read: its span and the visiting order left to read.
        self.block_start = self.block_end = 0
        self.block_left: np.ndarray = np.zeros(0, dtype=np.int64)
        spec = self.reader.spec
        # JSONL is read by document (an offset read each), so a lane holds the text of
        # the documents it is about to need, not of a whole block; other formats
        # (row groups, Arrow slices) are read a block at a time.
        self.by_document = spec.format == "jsonl"
        self.remote = any(is_remote(p) for p in spec.paths)
        self.pretokenized = bool(spec.pretokenized)
        self.images = start.images  # documents with images: planned when read (reading.py)
        if not start.retired:
            at = self.docs.position(start.epoch, start.pos)
            if at is not None:
                j, skip = self.docs.locate(*at)
                self.next_block = (at[0], j, skip)

    def has_more(self) -> bool:
        """Whether documents beyond the slots already read will come."""
        return self.next_block is not None or self.reading or len(self.block_left) > 0

    def can_read(self) -> bool:
        return not self.reading and (self.next_block is not None or len(self.block_left) > 0)

    def advance(self, docs: int) -> list[BlockPart]:
        """The documents to read now, block by block: up to `docs` of them when
        reading by document (across blocks: a block may hold fewer than a lane
        needs per step), else the rest of one block."""
        parts = []
        while docs > 0 and (len(self.block_left) or self.next_block is not None):
            if not len(self.block_left):
                assert self.next_block is not None
                epoch, j, skip = self.next_block
                following = self.docs.next_block(epoch, j)
                self.next_block = None if following is None else (*following, 0)
                block = self.docs.block(epoch, j)
                self.block_start, self.block_end = block.start, block.end
                self.block_left = block.order[skip:]
            take = docs if self.by_document else len(self.block_left)
            chunk, self.block_left = self.block_left[:take], self.block_left[take:]
            parts.append(BlockPart(self.block_start, self.block_end, chunk))
            docs = docs - len(chunk) if self.by_document else 0
        return parts


class LaneDemand:
    """The scheduler's view of one lane: its mixer state and where it stands.

    mix_counts, taken and offset follow the lane's real picks (the planner
    updates them when the lane takes a document). `shares` are the lane's
    source weights normalised; a source with share 0 is paused. The
    simulation runs ahead of the real picks over tokenized documents; since
    documents only ever become tokenized (never the reverse) it is resumed,
    not redone: a real pick is the simulation's first step, so it only shifts
    sim_idx.
    """

    def __init__(
        self,
        lane: int,
        order: int,
        mix_counts: Sequence[int],
        offset: int,
        weights: Sequence[float],
        unit: str,
    ):
        self.lane, self.order, self.unit = lane, order, unit
        self.feeds: list[Feed] = []
        self.rebase(mix_counts, offset, weights)

    def rebase(self, mix_counts: Sequence[int], offset: int, weights: Sequence[float]) -> None:
        """Follow the lane from this mixer state and offset (a new lane, or one that
        entered a new segment keeping its feeds)."""
        self.mix_counts = list(mix_counts)
        self.taken = sum(self.mix_counts)  # sum(mix_counts), kept up to date on each take
        self.offset = offset  # lane-stream token offset where its next document starts
        self.weights = list(weights)
        total = sum(self.weights)
        # A paused source (weight 0) gets share 0 and is never divided by.
        self.shares = [w / total if w else 0.0 for w in self.weights]
        self.restart()

    def restart(self) -> None:
        """Start the simulation again from the lane's real state."""
        self.sim_mix = Mixer(self.weights, self.unit, self.mix_counts)
        self.sim_idx = [0] * len(self.feeds)
        self.sim_tokens = [0] * len(self.feeds)  # tokens of each feed's simulated slots
        self.sim_offset = self.offset
        self.frontier = -1
        self.dirty = True

    def simulate(self) -> None:
        """Replay the lane's mixer over its tokenized documents: where it will stand
        when it first needs a document that is not tokenized yet (`frontier`, the
        feed, and `sim_offset`, where that document starts)."""
        if not self.dirty:
            return
        feeds, mix, idx = self.feeds, self.sim_mix, self.sim_idx
        offset, frontier = self.sim_offset, -1
        while True:
            active = [idx[k] < len(f.slots) or f.has_more() for k, f in enumerate(feeds)]
            if not any(active):
                break
            k = mix.choose(active)
            if k < 0:  # every source left is paused in this phase
                break
            f = feeds[k]
            ids = f.slots[idx[k]].ids if idx[k] < len(f.slots) else None
            if ids is None:
                frontier = k
                break
            n = len(ids)
            mix.record(k, n)
            offset += n
            idx[k] += 1
            self.sim_tokens[k] += n
        self.sim_offset, self.frontier, self.dirty = offset, frontier, False

    def estimate(self, k: int, f: Feed, stats: SchedulerStats) -> int:
        """Lane-stream offset where feed k's next unqueued document is likely needed.

        Largest-deficit mixing picks source k's next document once k's share of
        everything the lane has taken reaches what k has given plus what it holds
        queued; the offset is the lane's position then (documents are counted at
        the average document length when the mixture is by documents). Never
        asked for a paused source (share 0)."""
        share = self.shares[k]
        if self.unit == "tokens":
            return self.offset + int((self.mix_counts[k] + f.sched_tokens) / share) - self.taken
        # stats.tokens_per_doc() written out: this runs per document.
        per_doc = stats.tokens_tokenized / stats.docs_tokenized if stats.docs_tokenized else 256
        docs_ahead = (self.mix_counts[k] + f.sched) / share - self.taken
        return self.offset + int(docs_ahead * per_doc)
