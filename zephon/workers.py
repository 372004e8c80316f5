"""The worker side: documents read and tokenized in order of need, under one budget.

Each lane reads each of its sources through a `Feed`: that source's documents
in the lane's visiting order. Reading is by block (the unit of the shuffle);
tokenization is per document. One `DemandScheduler` per loader decides, for
all lanes of the rank together, which documents to tokenize next:

- Need order, before the first batch. For every lane the scheduler replays
  the lane's mixer over the documents already tokenized (a copy of the same
  largest-deficit rule), which gives the exact next document the lane will
  pick and the token offset in the lane's stream where it starts, hence the
  step that needs it. Only those exact documents are tokenized (nothing
  speculative), served in the order (step, lane), so start-up and restore
  work is the rows they need, plus the one document per lane that straddles
  the end.
- Lookahead, after it. Replaying the mixer would cost as much per document as
  the lane's own mixing, so each feed's next document is placed by estimate:
  the lane offset at which the source's share of what the lane has taken
  covers what the source has given plus what it holds queued. Documents are
  tokenized in that order, at most `horizon` steps past the one being
  produced, while tokenized-but-unconsumed tokens stay within one budget for
  the rank (`lookahead_tokens`). A lane that waits on a document is served
  first, and the step being produced is never held back by the budget.
- Reading runs ahead of tokenizing: a feed reads its next documents (across
  shuffle blocks) when half of what it read is queued. Local files are read
  by the planner thread itself (parsing is CPU work under the GIL, so a
  thread pool gains nothing); remote ones by a pool that can wait on the
  network.

Documents of all lanes go to the tokenizer together, in large `encode_batch`
calls (small calls leave the tokenizer's thread pool idle). Two threads share
the work so that the tokenizer is never left waiting on Python: one only
calls the tokenizer, call after call (its own thread pool runs with the GIL
released); the other plans the next call, reads, and turns the last call's
encodings into id arrays meanwhile. With two threads that each did all of it,
both were often in Python at once, or both waiting on the budget, and the
tokenizer sat idle between calls (about 15% of the time, timed by hand on the
sample mix; 5% or less with one caller).

None of this changes the output: a lane takes each feed's documents in feed
order, and a document's ids do not depend on what else was in its call.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from zephon.mixing import Mixer
from zephon.pieces import encode_documents, needs_pieces
from zephon.shuffle import SourcePlan
from zephon.sources import SourceReader
from zephon.sources.storage import is_remote
from zephon.tokenize import RawBlock, TokenizerInfo, check_token_ids, encode_raw, frame_ids

# Documents at least this long keep their ids in a small cache: a lane that
# draws one again (another epoch, another lane) does not tokenize it again.
LONG_CHARS = 1 << 16
LONG_CACHE_BYTES = 64 << 20


class _Slot:
    """One document of a feed: text read (ids None), queued (both None) or tokenized."""

    __slots__ = ("text", "ids", "doc_id", "est", "feed")

    def __init__(self, text: Any, ids: np.ndarray | None, doc_id: int, feed: Feed):
        self.text, self.ids, self.doc_id, self.est, self.feed = text, ids, doc_id, 0, feed


class Feed:
    """One lane's documents from one source, in the lane's visiting order.

    slots[:sched] are queued for the tokenizer or tokenized; slots[sched:] are
    read and waiting. `next_block` is the next block to read (epoch, index in
    the lane's block list, documents to skip), None at the end of a `stop` source.
    """

    def __init__(
        self,
        lane: LaneDemand,
        source: int,
        reader: SourceReader,
        plan: SourcePlan,
        epoch: int,
        pos: int,
        retired: bool,
        repeat: bool,
    ):
        self.lane, self.source, self.reader, self.plan = lane, source, reader, plan
        self.repeat = repeat
        self.slots: deque[_Slot] = deque()
        self.sched = 0
        self.reading = False
        self.dead = False
        self.error: BaseException | None = None
        self.taken = 0
        self.sched_tokens = 0  # tokens of slots[:sched] (estimated while queued)
        self.next_block: tuple[int, int, int] | None = None
        # The block being read: its first document and the visiting order left to read.
        self.block_start = self.block_end = 0
        self.block_left: np.ndarray = np.zeros(0, dtype=np.int64)
        # JSONL is read by document (an offset read each), so a lane holds the text of
        # the documents it is about to need, not of a whole block; other formats
        # (row groups, Arrow slices) are read a block at a time.
        self.by_document = reader.spec.format == "jsonl"
        self.remote = any(is_remote(p) for p in reader.spec.paths)
        if not retired:
            if pos >= plan.lane_docs(epoch, lane.lane):
                if not repeat:
                    return
                epoch, pos = epoch + 1, 0
            j, off = plan.locate(epoch, lane.lane, pos)
            self.next_block = (epoch, j, off)

    def has_more(self) -> bool:
        """Whether documents beyond the slots already read will come."""
        return self.next_block is not None or self.reading or len(self.block_left) > 0

    def can_read(self) -> bool:
        return not self.reading and (self.next_block is not None or len(self.block_left) > 0)

    def advance(self, docs: int) -> list[tuple[int, int, np.ndarray]]:
        """The documents to read now, as (block start, block end, offsets in visiting
        order) per block: up to `docs` of them when reading by document (across
        blocks: a block may hold fewer than a lane needs per step), else the rest
        of one block."""
        parts = []
        while docs > 0 and (len(self.block_left) or self.next_block is not None):
            if not len(self.block_left):
                assert self.next_block is not None
                epoch, j, skip = self.next_block
                blocks, _ = self.plan.lane_blocks(epoch, self.lane.lane)
                if j + 1 < len(blocks):
                    self.next_block = (epoch, j + 1, 0)
                else:
                    self.next_block = (epoch + 1, 0, 0) if self.repeat else None
                block = int(blocks[j])
                self.block_start, self.block_end = self.plan.block_range(block)
                self.block_left = self.plan.block_order(epoch, block)[skip:]
            take = docs if self.by_document else len(self.block_left)
            chunk, self.block_left = self.block_left[:take], self.block_left[take:]
            parts.append((self.block_start, self.block_end, chunk))
            docs = docs - len(chunk) if self.by_document else 0
        return parts


class LaneDemand:
    """The scheduler's view of one lane: its mixer state and where it stands.

    counts and offset follow the lane's real picks (updated in `take`). The
    simulation runs ahead of them over tokenized documents; since documents
    only ever become tokenized (never the reverse) it is resumed, not redone:
    a real pick is the simulation's first step, so it only shifts sim_idx."""

    def __init__(
        self, lane: int, order: int, counts: Sequence[int], offset: int, weights: list, unit: str
    ):
        self.lane, self.order = lane, order
        self.feeds: list[Feed] = []
        self.counts = list(counts)
        self.taken = sum(self.counts)  # sum(counts), kept up to date by take()
        self.offset = offset  # lane-stream token offset where its next document starts
        self.weights, self.unit = weights, unit
        self.restart()

    def restart(self) -> None:
        """Start the simulation again from the lane's real state."""
        self.sim_mix = Mixer(self.weights, self.unit, self.counts)
        self.sim_idx = [0] * len(self.feeds)
        self.sim_tokens = [0] * len(self.feeds)  # tokens of each feed's simulated slots
        self.sim_offset = self.offset
        self.frontier = -1
        self.dirty = True


class DemandScheduler:
    """Reads and tokenizes documents for all lanes of one loader, in order of need.

    Args:
        tok: the tokenizer.
        workers: 0: everything inline, on the thread that needs a document;
            otherwise a tokenizer thread and a planner thread (which reads
            local files itself), and this many threads read remote ones.
        budget_tokens: lookahead budget (tokens tokenized but not yet taken).
        step_tokens: tokens one lane contributes to one step (rows x row length).
        weights, unit: the recipe's mixture (the simulation's mixer).
    """

    def __init__(
        self,
        tok: TokenizerInfo,
        workers: int,
        budget_tokens: int,
        step_tokens: int,
        weights: Sequence[float],
        unit: str,
        max_docs: int = 1024,
    ):
        self.tok, self.budget, self.step_tokens = tok, max(budget_tokens, 1), step_tokens
        self.weights, self.unit = list(weights), unit
        total = sum(self.weights)
        self.shares = [w / total for w in self.weights]
        self.max_docs = max_docs
        # One call takes at most this many (estimated) tokens: a third of the
        # budget, so that one call in flight, one queued behind it and the ids
        # of the last one still being taken fit in the budget together.
        self.call_tokens = max(1 << 15, self.budget // 3)
        # One lock, three conditions: lanes wait on `cond` for documents, the
        # planner on `wake` for something to do, the tokenizer thread on
        # `queued` for a call. Waking only the side that can proceed keeps the
        # threads from trading the GIL for nothing.
        lock = threading.Lock()
        self.cond = threading.Condition(lock)
        self.wake = threading.Condition(lock)
        self.queued = threading.Condition(lock)
        # Calls planned and not started, and calls done and not stored: the
        # tokenizer thread only calls the tokenizer, so that the next call starts
        # as soon as one ends; reading, planning and converting ids happen on the
        # planner thread meanwhile.
        self.calls: deque[tuple[list[_Slot], list[str]]] = deque()
        self.done: deque[tuple[list[_Slot], list[str], Any, bool]] = deque()
        self.lanes: list[LaneDemand] = []
        self.waiting: set[Feed] = set()
        self.floor = 0  # the step being produced: its documents ignore the budget
        self.warm = False  # first batch assembled: speculative lookahead allowed
        self.used = 0  # tokens tokenized or queued (estimated) and not yet taken
        self.tokens_per_char = 0.25  # running estimate, for queued documents
        self._seq = itertools.count()
        self.closed = False
        self.error: BaseException | None = None  # a fault in the scheduler itself
        self.idle = 0
        self.horizon = 1
        self._reset_counts()
        # ids of long documents by (source, document): a pure function of the data.
        self._long: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._long_bytes = 0
        self._pool = ThreadPoolExecutor(workers, "zephon-worker") if workers > 0 else None
        self._threads: list[threading.Thread] = []
        if workers > 0:
            self._threads = [
                threading.Thread(target=self._planner, name="zephon-plan", daemon=True),
                threading.Thread(target=self._tokenizer, name="zephon-tokenize", daemon=True),
            ]
            for t in self._threads:
                t.start()

    def _reset_counts(self) -> None:
        self.counts = {
            "docs_tokenized": 0,
            "tokens_tokenized": 0,
            "chars_tokenized": 0,
            "docs_pretokenized": 0,
            "tokens_pretokenized": 0,
            "read_calls": 0,
            "docs_read": 0,
            "encode_calls": 0,
            "docs_from_cache": 0,
            "tokens_from_cache": 0,
            "lookahead_peak_tokens": 0,
        }

    # -- building and resetting ----------------------------------------------

    def add_lane(self, lane: int, counts: Sequence[int], offset: int) -> LaneDemand:
        with self.cond:
            ld = LaneDemand(lane, len(self.lanes), counts, offset, self.weights, self.unit)
            self.lanes.append(ld)
            return ld

    def add_feed(self, ld: LaneDemand, source: int, feed_args: tuple) -> Feed:
        with self.cond:
            feed = Feed(ld, source, *feed_args)
            ld.feeds.append(feed)
            ld.restart()
            return feed

    def reset(self) -> None:
        """Forget every lane (a restore builds new ones); work in flight is dropped."""
        with self.cond:
            for ld in self.lanes:
                for f in ld.feeds:
                    f.dead = True
            self.lanes, self.waiting = [], set()
            self.calls.clear()  # planned for the old lanes and not started
            self.used, self.warm, self.floor = 0, False, 0
            self._reset_counts()
            self._notify_everyone()

    def set_floor(self, step: int) -> None:
        with self.cond:
            self.floor = step
            self._notify_everyone()

    def set_warm(self) -> dict[str, int]:
        """The first batch is assembled: allow lookahead; returns the counts so far."""
        with self.cond:
            self.warm = True
            self._notify_everyone()
            return dict(self.counts)

    def _notify_everyone(self) -> None:
        self.cond.notify_all()
        self.wake.notify_all()
        self.queued.notify_all()

    def stats(self) -> dict[str, Any]:
        with self.cond:
            return {**self.counts, "lookahead_tokens": self.used, "lookahead_budget": self.budget}

    # -- the lane's side ---------------------------------------------------------

    def take(self, feed: Feed) -> tuple[np.ndarray, int] | None:
        """The feed's next document (ids, index in the source), waiting for it if
        needed; None once the feed has ended."""
        with self.cond:
            while True:
                if feed.slots and feed.slots[0].ids is not None:
                    slot = feed.slots.popleft()
                    feed.sched -= 1
                    feed.taken += 1
                    ids = slot.ids
                    assert ids is not None
                    ld, k, n = feed.lane, feed.source, len(ids)
                    unit = n if self.unit == "tokens" else 1
                    ld.counts[k] += unit
                    ld.taken += unit
                    ld.offset += n
                    feed.sched_tokens -= n
                    if self.warm:
                        pass  # no simulation once warm (see _entry)
                    elif ld.sim_idx[k] > 0:  # the simulation had already made this pick
                        ld.sim_idx[k] -= 1
                        ld.sim_tokens[k] -= n
                    else:
                        ld.restart()
                    self.used -= n
                    self.waiting.discard(feed)
                    # The idle planner waits for a quarter of the budget to be free
                    # (see _plan); before the first batch every pick is new work.
                    if self.idle and (not self.warm or self.used <= self.budget - self.budget // 4):
                        self.wake.notify()
                    return ids, slot.doc_id
                if feed.error is not None:
                    raise feed.error
                if self.error is not None:
                    raise self.error
                if not feed.slots and not feed.has_more():
                    self.waiting.discard(feed)
                    return None
                self.waiting.add(feed)
                if self._pool is None:
                    self._work_inline()
                else:
                    self.wake.notify()
                    self.cond.wait()

    # -- planning (called with the lock held) --------------------------------------

    def _simulate(self, ld: LaneDemand) -> None:
        """Replay the lane's mixer over its tokenized documents: where it will stand
        when it first needs a document that is not tokenized yet."""
        if not ld.dirty:
            return
        feeds, mix, idx = ld.feeds, ld.sim_mix, ld.sim_idx
        offset, frontier = ld.sim_offset, -1
        while True:
            active = [idx[k] < len(f.slots) or f.has_more() for k, f in enumerate(feeds)]
            if not any(active):
                break
            k = mix.choose(active)
            f = feeds[k]
            ids = f.slots[idx[k]].ids if idx[k] < len(f.slots) else None
            if ids is None:
                frontier = k
                break
            n = len(ids)
            mix.record(k, n)
            offset += n
            idx[k] += 1
            ld.sim_tokens[k] += n
        ld.sim_offset, ld.frontier, ld.dirty = offset, frontier, False

    def _entry(self, ld: LaneDemand, k: int, f: Feed) -> tuple | None:
        """Heap entry (step, lane order, offset, seq, feed) for the feed's next work."""
        if f.dead or f.error is not None:
            return None
        if f.sched >= len(f.slots) and not f.can_read():
            return None  # nothing to tokenize and nothing to read now
        if f in self.waiting and f.sched == 0:
            return (-1, ld.order, 0, next(self._seq), f)
        if self.warm:
            # Lookahead: estimated from the lane's real offset and the tokens this
            # feed already holds, at the source's share. Replaying the mixer here
            # would cost as much per document as the lane's own mixing, and a lane
            # that does need a document first waits on it and is served above.
            est = self._estimate(ld, k, f)
            step = est // self.step_tokens
            if step > self.floor + self.horizon:
                # Too far ahead: without this, a feed whose partner is still being
                # read would take the whole budget for steps nobody needs yet.
                return None
            return (step, ld.order, est, next(self._seq), f)
        if not (ld.frontier == k and ld.sim_idx[k] == f.sched):
            return None  # before the first batch only the exact next documents
        est = ld.sim_offset
        step = est // self.step_tokens
        if step > self.floor:
            return None
        return (step, ld.order, est, next(self._seq), f)

    def _estimate(self, ld: LaneDemand, k: int, f: Feed) -> int:
        """Lane-stream offset where the feed's next unqueued document is likely needed.

        Largest-deficit mixing picks source k's next document once k's share of
        everything the lane has taken reaches what k has given plus what it holds
        queued; the offset is the lane's position then (documents are counted at
        the average document length when the mixture is by documents)."""
        share = self.shares[k]
        if self.unit == "tokens":
            return ld.offset + int((ld.counts[k] + f.sched_tokens) / share) - ld.taken
        c = self.counts
        per_doc = c["tokens_tokenized"] / c["docs_tokenized"] if c["docs_tokenized"] else 256
        docs_ahead = (ld.counts[k] + f.sched) / share - ld.taken
        return ld.offset + int(docs_ahead * per_doc)

    def _plan(self) -> tuple[list[_Slot], list[tuple[Feed, list[tuple[int, int, np.ndarray]]]]]:
        """Choose documents to tokenize and blocks to read, in order of need."""
        if self.closed:
            return [], []
        # Steps of lookahead past the one being produced: the budget's worth, plus one.
        self.horizon = self.budget // max(1, self.step_tokens * len(self.lanes)) + 1
        heap = []
        for ld in self.lanes:
            if len(ld.feeds) < len(self.weights):
                continue  # still being built
            if not self.warm:
                self._simulate(ld)
            for k, f in enumerate(ld.feeds):
                entry = self._entry(ld, k, f)
                if entry is not None:
                    heap.append(entry)
        heapq.heapify(heap)
        read_size = self._read_docs()
        batch: list[_Slot] = []
        reads: list[tuple[Feed, list[tuple[int, int, np.ndarray]]]] = []
        est_total, needed, held_back, cached = 0, False, False, False
        while heap and len(batch) < self.max_docs and est_total < self.call_tokens:
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
            if len(slot.text) >= LONG_CHARS and self._cached(f, slot):
                cached = True  # served: the batch can no longer be undone slot by slot
                if self.warm:
                    entry = self._entry(f.lane, f.source, f)
                    if entry is not None:
                        heapq.heappush(heap, entry)
                continue
            est = max(1, int(len(slot.text) * self.tokens_per_char)) + 1
            must = step <= self.floor
            if not must and self.used + est > self.budget:
                held_back = True
                break  # later entries are later steps: the budget holds them all back
            needed = needed or must
            f.sched += 1
            f.sched_tokens += est
            slot.est = est
            self.used += est
            est_total += est
            batch.append(slot)
            if self.warm:  # the feed's next document, now further ahead
                entry = self._entry(f.lane, f.source, f)
                if entry is not None:
                    heapq.heappush(heap, entry)
        if batch and not needed and held_back and not cached and est_total < self.budget // 4:
            # Only a little speculative work, held back by the budget: wait until
            # more of it is free, so that calls stay large.
            for slot in reversed(batch):
                self._unqueue(slot)
            batch = []
        self.counts["lookahead_peak_tokens"] = max(self.counts["lookahead_peak_tokens"], self.used)
        return batch, reads

    def _read_docs(self) -> int:
        """Documents per read: a few before the first batch; then each feed's share
        of the lookahead budget (32 to 256), so that text read ahead follows the
        budget too."""
        if not self.warm:
            return 2
        c = self.counts
        per_doc = c["tokens_tokenized"] / c["docs_tokenized"] if c["docs_tokenized"] else 256
        feeds = sum(len(ld.feeds) for ld in self.lanes) or 1
        # At least 32: many lanes would otherwise read a few lines per call.
        return int(min(256, max(32, self.budget / feeds / max(per_doc, 1.0))))

    def _cached(self, f: Feed, slot: _Slot) -> bool:
        """Serve a long document from the cache, if it is there."""
        ids = self._long.get((f.source, slot.doc_id))
        if ids is None:
            return False
        self._long.move_to_end((f.source, slot.doc_id))
        slot.ids, slot.text = ids, None
        f.sched += 1
        f.sched_tokens += len(ids)
        self.used += len(ids)
        self.counts["docs_from_cache"] += 1
        self.counts["tokens_from_cache"] += len(ids)
        f.lane.dirty = True
        if self.waiting:
            self.cond.notify_all()
        return True

    def _remember(self, source: int, doc_id: int, ids: np.ndarray) -> None:
        if ids.nbytes > LONG_CACHE_BYTES // 2:
            return
        if ids.base is not None:  # a view of a whole call's ids: keep only its own
            ids = ids.copy()
        self._long[(source, doc_id)] = ids
        self._long_bytes += ids.nbytes
        while self._long_bytes > LONG_CACHE_BYTES:
            _, old = self._long.popitem(last=False)
            self._long_bytes -= old.nbytes

    def _unqueue(self, slot: _Slot) -> None:
        """Give back the last slot queued on its feed (batch undone in reverse order)."""
        slot.feed.sched -= 1
        slot.feed.sched_tokens -= slot.est
        self.used -= slot.est
        slot.est = 0

    # -- doing the work ---------------------------------------------------------------

    @staticmethod
    def _texts(batch: list[_Slot]) -> list[str]:
        texts = [s.text for s in batch]
        for s in batch:
            s.text = None
        return texts

    def _encode(self, batch: list[_Slot]) -> None:
        """Tokenize the batch's texts (lock released) and store the ids (lock held)."""
        texts = self._texts(batch)
        self.cond.release()
        try:
            ids: list[np.ndarray] | BaseException = encode_documents(texts, self.tok)
        except BaseException as exc:  # handed to the lanes that wait on these documents
            ids = exc
        finally:
            self.cond.acquire()
        self._store(batch, texts, ids)

    def _store(self, batch: list[_Slot], texts: list[str], ids: Any) -> None:
        """Put a call's ids (or its error) into the batch's slots (lock held)."""
        if all(s.feed.dead for s in batch):
            return  # every lane it was for was dropped by a restore
        self.counts["encode_calls"] += 1
        for k, s in enumerate(batch):
            f = s.feed
            if f.dead:  # its lane was dropped by a restore
                continue
            if isinstance(ids, BaseException):
                f.error = ids
                continue
            s.ids = ids[k]
            n = len(s.ids)
            self.used += n - s.est
            f.sched_tokens += n - s.est
            self.counts["docs_tokenized"] += 1
            self.counts["tokens_tokenized"] += n
            self.counts["chars_tokenized"] += len(texts[k])
            if len(texts[k]) >= LONG_CHARS:
                self._remember(f.source, s.doc_id, s.ids)
            f.lane.dirty = True
        c = self.counts
        if c["chars_tokenized"]:
            self.tokens_per_char = c["tokens_tokenized"] / c["chars_tokenized"]
        if self.waiting:
            self.cond.notify_all()

    def _read(self, f: Feed, parts: list[tuple[int, int, np.ndarray]]) -> None:
        """Read documents of a feed (lock released) and add them (lock held)."""
        self.cond.release()
        slots: list[_Slot] = []
        err: BaseException | None = None
        try:
            for start, end, order in parts:  # a bad part keeps the documents before it
                raw = _read_docs(f.reader, start, order, f.by_document, (start, end))
                if f.reader.spec.pretokenized:
                    done = check_token_ids(raw, f.reader, self.tok)
                    slots += [
                        _Slot(None, ids, int(d), f)
                        for ids, d in zip(done.docs, done.doc_ids.tolist(), strict=True)
                    ]
                else:
                    slots += [
                        _Slot(v, None, d, f)
                        for v, d in zip(raw.values, raw.doc_ids.tolist(), strict=True)
                    ]
        except BaseException as exc:
            err = exc
        finally:
            self.cond.acquire()
        f.reading = False
        if not f.dead:
            f.error = f.error or err
            f.slots.extend(slots)
            self.counts["read_calls"] += 1
            self.counts["docs_read"] += len(slots)
            if f.reader.spec.pretokenized:
                n = sum(len(s.ids) for s in slots)  # type: ignore[arg-type]
                f.sched = len(f.slots)  # nothing to tokenize
                self.used += n
                f.sched_tokens += n
                self.counts["docs_pretokenized"] += len(slots)
                self.counts["tokens_pretokenized"] += n
            f.lane.dirty = True
        if self.waiting:
            self.cond.notify_all()
        self.wake.notify()  # documents to tokenize

    def _work_inline(self) -> None:
        batch, reads = self._plan()
        for f, block in reads:
            self._read(f, block)
        if batch:
            self._encode(batch)

    def _planner(self) -> None:
        """Plans calls and reads; stores what the tokenizer thread finished."""
        with self.cond:
            try:
                while not self.closed:
                    if self.done:
                        self._finish(*self.done.popleft())
                        continue
                    if len(self.calls) < 2:
                        batch, reads = self._plan()
                        for f, block in reads:
                            if f.remote:  # waiting on the network: let a reader thread wait
                                assert self._pool is not None
                                self._pool.submit(self._read_locked, f, block)
                            else:  # local reads are CPU work under the GIL: no thread gains
                                self._read(f, block)
                        if batch:
                            self.calls.append((batch, self._texts(batch)))
                            self.queued.notify()
                        if batch or reads:
                            continue
                    self.idle += 1
                    self.wake.wait()
                    self.idle -= 1
            except BaseException as exc:  # a bug here must not leave lanes waiting forever
                self.error = exc
                self._notify_everyone()
                raise

    def _tokenizer(self) -> None:
        """Calls the tokenizer on the planned calls, one after the other."""
        with self.cond:
            try:
                while not self.closed:
                    if not self.calls:
                        self.queued.wait()
                        continue
                    batch, texts = self.calls.popleft()
                    self.wake.notify()  # room for the next call
                    self.cond.release()
                    try:
                        # Long texts are cut and joined by encode_documents, ids and
                        # all; otherwise only the tokenizer runs here, the planner
                        # converts.
                        whole = not needs_pieces(texts, self.tok)
                        out: Any = (
                            encode_raw(texts, self.tok)
                            if whole
                            else encode_documents(texts, self.tok)
                        )
                    except BaseException as exc:  # handed to the lanes that wait on these
                        out, whole = exc, False
                    finally:
                        self.cond.acquire()
                    self.done.append((batch, texts, out, whole))
                    self.wake.notify()
            except BaseException as exc:  # a bug here must not leave lanes waiting forever
                self.error = exc
                self._notify_everyone()
                raise

    def _finish(self, batch: list[_Slot], texts: list[str], out: Any, raw: bool) -> None:
        """Store a finished call (lock held; released while its ids are converted)."""
        if raw:
            self.cond.release()
            try:
                out = frame_ids(out, self.tok)
            except BaseException as exc:
                out = exc
            finally:
                self.cond.acquire()
        self._store(batch, texts, out)

    def _read_locked(self, f: Feed, block: list[tuple[int, int, np.ndarray]]) -> None:
        with self.cond:
            self._read(f, block)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self._notify_everyone()
        for t in self._threads:
            t.join()
        self._threads = []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _read_docs(
    reader: SourceReader, start: int, order: np.ndarray, by_document: bool, span: tuple[int, int]
) -> RawBlock:
    """Documents start + order (offsets in a block, in visiting order), read one
    by one or as the span they cover."""
    if not len(order):
        return RawBlock([], start + order)
    if by_document:
        try:
            docs = (start + order).tolist()
            if isinstance(reader, SourceReader):  # not a wrapper: bad_records keeps its own reads
                values = reader.read_docs(docs)
            else:
                values = [reader.read_range(i, i + 1)[0] for i in docs]
        except Exception:
            # Report the block's first bad record in file order, as a block read does
            # (the same error whatever the lookahead or worker count).
            reader.read_range(*span)
            raise
    else:
        lo, hi = int(order.min()), int(order.max()) + 1
        raw = reader.read_range(start + lo, start + hi)
        values = [raw[i - lo] for i in order.tolist()]
    return RawBlock(values, start + order)
