"""The need planner: which documents to read and tokenize next, under one budget.

Plain data in (the lanes' feeds and mixer states, the step being produced,
the budget), decisions out (documents to tokenize in one call, blocks to
read); no locks and no threads, so the policy can be read and tested on its
own. What it decides from, and how that changes as work happens, is the
ledger it extends (lookahead.py). The executor (scheduler.py) calls it with
its lock held and does the work it decides.

- Need order, before the first batch. For every lane the planner replays the
  lane's mixer over the documents already tokenized (`LaneDemand.simulate`),
  which gives the exact next document the lane will pick and the token
  offset in the lane's stream where it starts, hence the step that needs it
  (`StepMap.need_step`, which counts the rows the lane's packer holds back:
  best_fit's open bins). Only those exact documents are tokenized (nothing
  speculative), served in the order (step, lane), so start-up and restore
  work is the rows they need, plus the one document per lane that straddles
  the end (and, for best_fit, what its open bins hold).
- Lookahead, after it. Replaying the mixer would cost as much per document as
  the lane's own mixing, so each feed's next document is placed by estimate:
  the lane offset at which the source's share of what the lane has taken
  covers what the source has given plus what it holds queued. Documents are
  planned in that order, at most `horizon` steps past the one being
  produced, while tokenized-but-unconsumed tokens stay within one budget for
  the rank. A lane that waits on a document is served first, and the rows of
  the step being produced (`floor`) are never held back by the budget. A
  source whose share in a lane is 0 is paused there: it is not planned
  unless the lane waits on it.
- Reading runs ahead of tokenizing: a feed reads its next documents (across
  shuffle blocks) when half of what it read is queued.
- Documents of sources with images count their image tokens exactly (known
  from the headers when read) and take a second budget, in bytes
  (images/budget.py); a text-only recipe never uses it.

None of this changes the output: a lane takes each feed's documents in feed
order, and a document's ids do not depend on what else was in its call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from zephon.demand.feeds import Feed, LaneDemand, Slot
from zephon.demand.long_documents import LONG_CHARS, LongDocCache
from zephon.demand.lookahead import DEFAULT_LOOKAHEAD_BYTES, Lookahead
from zephon.demand.stats import SchedulerStats
from zephon.lanes.documents import BlockPart


class StepMap(Protocol):
    """Which step needs a lane's stream at a token offset, and how much one step takes.

    step_of: the step whose rows hold the offset (what the budget never holds
    back); need_step: the step whose production first needs the document there,
    earlier when the lane's packer holds rows back (best_fit's open bins)."""

    def step_of(self, offset: int) -> int: ...

    def need_step(self, offset: int) -> int: ...

    def lane_tokens(self, step: int) -> int: ...


@dataclass(frozen=True)
class UniformSteps:
    """Every step takes the same tokens from every lane: rows per lane x row length."""

    tokens_per_step: int

    def step_of(self, offset: int) -> int:
        return offset // self.tokens_per_step

    def need_step(self, offset: int) -> int:
        return self.step_of(offset)

    def lane_tokens(self, step: int) -> int:
        return self.tokens_per_step


class Plan(NamedTuple):
    """The planner's decision: one tokenizer call, and the reads to do now.

    served_from_cache: some documents became ready without tokenizing (the
    lanes that wait may proceed)."""

    call: list[Slot]
    reads: list[tuple[Feed, list[BlockPart]]]
    served_from_cache: bool


class NeedPlanner(Lookahead):
    """Chooses work for all lanes of one loader, in order of need, under a budget.

    Args (besides Lookahead's: budget_tokens, cache, budget_bytes, decoders):
        steps: maps a lane-stream offset to the step that needs it.
        max_docs: documents per tokenizer call, at most.
    """

    def __init__(
        self,
        budget_tokens: int,
        steps: StepMap,
        max_docs: int = 1024,
        cache: LongDocCache | None = None,
        budget_bytes: int = DEFAULT_LOOKAHEAD_BYTES,
        decoders: int = 1,
    ):
        super().__init__(budget_tokens, cache, budget_bytes, decoders)
        self.steps, self.max_docs = steps, max_docs
        # One call takes at most this many (estimated) tokens: a third of the
        # budget, so that one call in flight, one queued behind it and the ids
        # of the last one still being taken fit in the budget together.
        self.call_tokens = max(1 << 15, self.budget // 3)
        self.horizon = 1
        self._seq = itertools.count()

    # -- deciding ------------------------------------------------------------------

    def plan(self) -> Plan:
        """Choose documents to tokenize and blocks to read, in order of need."""
        # Steps of lookahead past the one being produced: the budget's worth, plus one.
        step_tokens = self.steps.lane_tokens(self.floor)
        self.horizon = self.budget // max(1, step_tokens * len(self.lanes)) + 1
        heap = []
        for ld in self.lanes:
            if len(ld.feeds) < len(ld.weights):
                continue  # still being built
            if not self.warm:
                ld.simulate()
            for k, f in enumerate(ld.feeds):
                entry = self._entry(ld, k, f)
                if entry is not None:
                    heap.append(entry)
        heapq.heapify(heap)
        read_size = docs_per_read(self.warm, self.budget, self.lanes, self.stats)
        call: list[Slot] = []
        reads: list[tuple[Feed, list[BlockPart]]] = []
        est_total, needed, held_back, cached = 0, False, False, False
        self.bytes.call = 0
        while heap and len(call) < self.max_docs and est_total < self.call_tokens:
            step, _, _, _, f = heapq.heappop(heap)
            if f.sched >= len(f.slots):
                f.reading = True
                reads.append((f, f.advance(read_size)))
                continue
            if self.warm and f.can_read() and len(f.slots) - f.sched <= read_size // 2:
                # Read the next documents before these run out, so the feed
                # never waits on its own read.
                f.reading = True
                reads.append((f, f.advance(read_size)))
            slot = f.slots[f.sched]
            if f.images is None and len(slot.text) >= LONG_CHARS and self._serve_cached(f, slot):
                cached = True  # served: the call can no longer be undone slot by slot
                if self.warm:
                    entry = self._entry(f.lane, f.source, f)
                    if entry is not None:
                        heapq.heappush(heap, entry)
                continue
            if f.images is None:
                est, nbytes, peak = max(1, int(len(slot.text) * self.tokens_per_char)) + 1, 0, 0
            else:  # exact image tokens, and the bytes to reserve (images/work.py)
                est, nbytes, peak = slot.text.cost(self.tokens_per_char)
            must = step <= self.floor  # never held back by the budget
            if not must and (
                self.used + est > self.budget or (nbytes and not self.bytes.admits(nbytes, peak))
            ):
                held_back = True
                break  # later entries are later steps: the budget holds them all back
            needed = needed or must
            f.sched += 1
            f.sched_tokens += est
            slot.est = est
            self.used += est
            if nbytes:  # text carries no image bytes
                self.bytes.reserve(slot, nbytes, peak)
            est_total += est
            call.append(slot)
            if self.warm:  # the feed's next document, now further ahead
                entry = self._entry(f.lane, f.source, f)
                if entry is not None:
                    heapq.heappush(heap, entry)
        small = est_total < self.budget // 4 and self.bytes.call < self.bytes.budget // 4
        if call and not needed and held_back and not cached and small:
            # Only a little speculative work, held back by the budget: wait until
            # more of it is free, so that calls stay large.
            for slot in reversed(call):
                self._unqueue(slot)
            call = []
        stats = self.stats
        stats.lookahead_peak_tokens = max(stats.lookahead_peak_tokens, self.used)
        return Plan(call, reads, cached)

    def _entry(self, ld: LaneDemand, k: int, f: Feed) -> tuple | None:
        """Heap entry (step, lane order, offset, seq, feed) for the feed's next work."""
        if f.dead or f.error is not None:
            return None
        if f.sched >= len(f.slots) and not f.can_read():
            return None  # nothing to tokenize and nothing to read now
        if f in self.waiting and f.sched == 0:
            return (-1, ld.order, 0, next(self._seq), f)
        if not ld.shares[k]:
            return None  # paused in this lane: only a lane that waits on it is served
        if self.warm:
            # Lookahead: estimated from the lane's real offset and the tokens this
            # feed already holds, at the source's share. Replaying the mixer here
            # would cost as much per document as the lane's own mixing, and a lane
            # that does need a document first waits on it and is served above.
            est = ld.estimate(k, f, self.stats)
            # Offsets count documents' tokens, steps count rows': a packer's padding
            # puts the lane's real position (its next document) behind the step its
            # offset maps to, more so step after step. The documents after it are
            # needed at least that much later: without this, after enough steps every
            # document maps to a step already produced and the budget holds none back.
            # (One step of slack: the lane may not have taken the documents of the
            # step being produced yet.)
            lag = max(0, self.floor - 1 - self.steps.step_of(ld.offset))
            step = self.steps.need_step(est) + lag
            if step > self.floor + self.horizon:
                # Too far ahead: without this, a feed whose partner is still being
                # read would take the whole budget for steps nobody needs yet.
                return None
            if step <= self.floor < self.steps.step_of(est) + lag:
                # Needed early by the packer (its held rows) but no row of the step
                # being produced: first of the lookahead, which the budget bounds.
                step = self.floor + 1
            return (step, ld.order, est, next(self._seq), f)
        if not (ld.frontier == k and ld.sim_idx[k] == f.sched):
            return None  # before the first batch only the exact next documents
        est = ld.sim_offset
        step = self.steps.need_step(est)
        if step > self.floor:
            return None
        return (step, ld.order, est, next(self._seq), f)

    def _serve_cached(self, f: Feed, slot: Slot) -> bool:
        """Serve a long document from the cache, if it is there."""
        ids = self.cache.get(f.source, slot.doc_id)
        if ids is None:
            return False
        slot.ids, slot.text = ids, None
        f.sched += 1
        f.sched_tokens += len(ids)
        self.used += len(ids)
        self.stats.docs_from_cache += 1
        self.stats.tokens_from_cache += len(ids)
        f.lane.dirty = True
        return True

    def _unqueue(self, slot: Slot) -> None:
        """Give back the last slot queued on its feed (a call undone in reverse order)."""
        slot.feed.sched -= 1
        slot.feed.sched_tokens -= slot.est
        self.used -= slot.est
        self.bytes.release(slot)
        slot.est = 0


def docs_per_read(
    warm: bool, budget: int, lanes: Sequence[LaneDemand], stats: SchedulerStats
) -> int:
    """Documents per read: a few before the first batch; then each feed's share of
    the lookahead budget (32 to 256), so that text read ahead follows the budget too."""
    if not warm:
        return 2
    per_doc = stats.tokens_per_doc()
    feeds = sum(len(ld.feeds) for ld in lanes) or 1
    # At least 32: many lanes would otherwise read a few lines per call.
    return int(min(256, max(32, budget / feeds / max(per_doc, 1.0))))
