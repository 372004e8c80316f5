"""The demand scheduler: the threads, the lock and the calls that do the planner's work.

One `DemandExecutor` per loader reads and tokenizes documents for all lanes
of the rank together. What to do next is the need planner's decision
(planner.py); this module only does it, and hands documents to the lanes.

Documents of all lanes go to the tokenizer together, in large `encode_batch`
calls (small calls leave the tokenizer's thread pool idle). Two threads share
the work so that the tokenizer is never left waiting on Python: one only
calls the tokenizer, call after call (its own thread pool runs with the GIL
released); the other plans the next call, reads, and turns the last call's
encodings into id arrays meanwhile. With two threads that each did all of it,
both were often in Python at once, or both waiting on the budget, and the
tokenizer sat idle between calls (about 15% of the time, timed by hand on the
sample mix; 5% or less with one caller). Local files are read by the planning
thread itself (parsing is CPU work under the GIL, so a thread pool gains
nothing); remote ones by a pool that can wait on the network. With no
workers, everything runs inline, on the thread of the lane that needs a
document. A call with documents of a source with images decodes those where
it tokenizes (images/work.py): workers decode images, lanes never do.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.demand.feeds import Feed, FeedStart, LaneDemand, Slot
from zephon.demand.lookahead import DEFAULT_LOOKAHEAD_BYTES
from zephon.demand.planner import NeedPlanner, StepMap
from zephon.demand.reading import read_slots
from zephon.lanes.documents import BlockPart
from zephon.stage_profile import (
    CONVERT,
    IMAGE,
    NULL_CLOCK,
    OTHER,
    PLAN,
    READ,
    TOKENIZE,
    Clock,
    StageProfile,
    current,
)
from zephon.tokenize.long_pieces import encode_documents, needs_pieces
from zephon.tokenize.tokenizer import TokenizerInfo, encode_raw, frame_ids


@dataclass
class _Call:
    """A tokenizer call: its slots and their texts (taken out of the slots)."""

    slots: list[Slot]
    texts: list[str]


@dataclass
class _Finished:
    """A call the tokenizer thread finished: its encodings (not yet converted to
    ids, when `encodings` is True), its ids, or its error."""

    call: _Call
    out: Any
    encodings: bool


def _take_texts(slots: list[Slot], images: Any = None, cold: bool = False) -> list[str]:
    """The slots' texts, taken out of them (the tokenizer call holds them now);
    with `images`, their decoding starts now (images/work.py `start`; `cold`:
    before the first batch)."""
    texts = [s.text for s in slots]
    for s in slots:
        s.text = None
    if images is not None:
        images.start(texts, cold)
    return texts


def _drop_calls(calls: deque[_Call], images: Any) -> None:
    """Drop the calls planned and not started; the decodes started for them stop
    (the call in flight, if any, keeps its own)."""
    if images is not None:
        for call in calls:
            images.forget(call.texts)
    calls.clear()


class LockedPlanner:
    """The need planner behind the scheduler's lock: every change the loader or a
    lane makes to the plan (lanes, feeds, the step being produced, a segment) is
    made under the lock and wakes whoever may now proceed. The threads that do
    the planned work are DemandExecutor's, below."""

    def __init__(
        self,
        workers: int,
        budget_tokens: int,
        steps: StepMap,
        unit: str,
        max_docs: int,
        budget_bytes: int,
    ):
        self.unit = unit
        self.planner = NeedPlanner(
            budget_tokens, steps, max_docs, budget_bytes=budget_bytes, decoders=max(workers, 1)
        )
        # One lock, three conditions: lanes wait on `cond` for documents, the
        # planning thread on `wake` for something to do, the tokenizer thread on
        # `queued` for a call. Waking only the side that can proceed keeps the
        # threads from trading the GIL for nothing.
        lock = self._lock = threading.Lock()
        self.cond = threading.Condition(lock)
        self.wake = threading.Condition(lock)
        self.queued = threading.Condition(lock)

    def add_lane(
        self, lane: int, mix_counts: Sequence[int], offset: int, weights: Sequence[float]
    ) -> LaneDemand:
        with self.cond:
            return self.planner.add_lane(lane, mix_counts, offset, weights, self.unit)

    def add_feed(self, ld: LaneDemand, source: int, start: FeedStart) -> Feed:
        with self.cond:
            return self.planner.add_feed(ld, source, start)

    def set_floor(self, step: int) -> None:
        """The step being produced: its documents are needed whatever the budget."""
        with self.cond:
            self.planner.floor = step
            self._notify_everyone()

    def set_warm(self) -> dict[str, Any]:
        """The first batch is assembled: allow lookahead; returns the statistics so far."""
        with self.cond:
            self.planner.warm = True
            self._notify_everyone()
            return self._stats()

    def rebase(
        self, ld: LaneDemand, mix_counts: Sequence[int], offset: int, weights: Sequence[float]
    ) -> None:
        """A lane enters a new segment with the same lane count: its feeds, and the
        documents they hold, go on serving it."""
        with self.cond:
            ld.rebase(mix_counts, offset, weights)
            self._notify_everyone()

    def give_back(self, feed: Feed, ids: np.ndarray, doc_id: int) -> None:
        with self.cond:
            self.planner.give_back(feed, ids, doc_id)

    def set_steps(self, steps: StepMap) -> None:
        """The step map of a new segment (every lane of the loader enters it)."""
        with self.cond:
            self.planner.steps = steps
            self._notify_everyone()

    def count_fetched(self, tokens: int, pretokenized: bool) -> None:
        """A lane read and tokenized one document itself (a carried tail): count it."""
        with self.cond:
            self.planner.stats.count_document(tokens, pretokenized)

    def _notify_everyone(self) -> None:
        self.cond.notify_all()
        self.wake.notify_all()
        self.queued.notify_all()

    def stats(self) -> dict[str, Any]:
        with self.cond:
            return self._stats()

    def _stats(self) -> dict[str, Any]:
        return self.planner.stats_dict()


class DemandExecutor(LockedPlanner):
    """Reads and tokenizes documents for all lanes of one loader, in order of need.

    Args:
        tok: the tokenizer.
        workers: 0: everything inline, on the thread that needs a document;
            otherwise a tokenizer thread and a planning thread (which reads
            local files itself), and this many threads read remote ones.
        budget_tokens: lookahead budget (tokens tokenized but not yet taken).
        steps: which step needs a lane-stream token offset.
        unit: the recipe's mixture unit ("tokens" or "documents").
        budget_bytes: lookahead budget of image bytes (images/budget.py).
        images: the image work of a recipe with image sources (images/work.py).
        profile: where the threads charge their CPU by stage (None: not profiled).
    """

    def __init__(
        self,
        tok: TokenizerInfo,
        workers: int,
        budget_tokens: int,
        steps: StepMap,
        unit: str,
        max_docs: int = 1024,
        budget_bytes: int = DEFAULT_LOOKAHEAD_BYTES,
        images: Any = None,
        profile: StageProfile | None = None,
    ):
        super().__init__(workers, budget_tokens, steps, unit, max_docs, budget_bytes)
        self.tok, self.images, self.profile = tok, images, profile
        self._decoded_before = 0  # images decoded before the last restore
        # Calls planned and not started, and calls done and not stored: the
        # tokenizer thread only calls the tokenizer, so that the next call starts
        # as soon as one ends; reading, planning and converting ids happen on the
        # planning thread meanwhile.
        self.calls: deque[_Call] = deque()
        self.done: deque[_Finished] = deque()
        self.closed = False
        self.error: BaseException | None = None  # a fault in the scheduler itself
        self.idle = 0
        self._pool = ThreadPoolExecutor(workers, "zephon-worker") if workers > 0 else None
        self._threads: list[threading.Thread] = []
        if workers > 0:
            self._threads = [
                threading.Thread(target=self._plan_loop, name="zephon-plan", daemon=True),
                threading.Thread(target=self._tokenize_loop, name="zephon-tokenize", daemon=True),
            ]
            for t in self._threads:
                t.start()

    def _stats(self) -> dict[str, Any]:
        """The planner's counts, and the images decoded into patches since the start
        or the last restore (`images_framed` counts those of the documents framed:
        with decode processes, a document is framed before its pixels come)."""
        decoded = self.images.decoded - self._decoded_before if self.images is not None else 0
        return {**self.planner.stats_dict(), "images_decoded": decoded}

    def reset(self, steps: StepMap | None = None, keep_stats: bool = False) -> None:
        """Forget every lane (a restore or a phase boundary builds new ones); work in
        flight is dropped. `steps`: the step map of the lanes to come, if it changes;
        keep_stats: go on counting (a boundary), instead of from zero (a restore)."""
        with self.cond:
            self.planner.reset(keep_stats)
            if not keep_stats and self.images is not None:
                self._decoded_before = self.images.decoded
            if steps is not None:
                self.planner.steps = steps
            _drop_calls(self.calls, self.images)  # planned for the old lanes, not started
            self._notify_everyone()

    # -- the lane's side ---------------------------------------------------------

    def take(self, feed: Feed) -> tuple[np.ndarray, int] | None:
        """The feed's next document (ids, index in the source), waiting for it if
        needed; None once the feed has ended."""
        planner = self.planner
        with self._lock:  # the lock itself: Condition.__enter__ is a Python call per document
            while True:
                got = planner.pop_ready(feed)
                if got is not None:
                    if self.idle and planner.worth_planning():
                        self.wake.notify()
                    return got
                if feed.error is not None:
                    raise feed.error
                if self.error is not None:
                    raise self.error
                if not feed.slots and not feed.has_more():
                    planner.waiting.discard(feed)
                    return None
                planner.waiting.add(feed)
                if self._pool is None:
                    self._work_inline()
                else:
                    self.wake.notify()
                    current().wait(self.cond)

    # -- doing the work (lock held, released around reading and tokenizing) ---------

    def _plan(self, clock: Clock) -> tuple[list[Slot], list[tuple[Feed, list[BlockPart]]]]:
        if self.closed:
            return [], []
        left = clock.switch(PLAN)
        plan = self.planner.plan()
        clock.switch(left)
        if plan.served_from_cache and self.planner.waiting:
            self.cond.notify_all()
        return plan.call, plan.reads

    def _ready(self) -> None:
        """Documents arrived: wake the lanes that wait."""
        if self.planner.waiting:
            self.cond.notify_all()

    def _encode(self, slots: list[Slot], clock: Clock) -> None:
        """Tokenize the slots' texts (lock released) and store the ids (lock held)."""
        texts = _take_texts(slots)
        self.cond.release()
        try:
            ids = encode_call(slots, texts, self.tok, self.images, clock)
        finally:
            self.cond.acquire()
        self._store(slots, texts, ids, clock)

    def _store(self, slots: list[Slot], texts: list[str], ids: Any, clock: Clock) -> None:
        left = clock.switch(PLAN)
        self.planner.stored(slots, texts, ids)
        clock.switch(left)
        self._ready()

    def _read(self, f: Feed, parts: list[BlockPart], clock: Clock) -> None:
        """Read documents of a feed (lock released) and add them (lock held)."""
        self.cond.release()
        left = clock.switch(READ)
        try:
            slots, err = read_slots(f, parts, self.tok)
        finally:
            clock.switch(PLAN)
            self.cond.acquire()
        self.planner.read_done(f, slots, err)
        clock.switch(left)
        self._ready()
        self.wake.notify()  # documents to tokenize

    def _read_locked(self, f: Feed, parts: list[BlockPart]) -> None:
        with self.cond:
            self._read(f, parts, NULL_CLOCK)  # a remote read mostly waits on the network

    def _work_inline(self) -> None:
        clock = current()
        call, reads = self._plan(clock)
        for f, parts in reads:
            self._read(f, parts, clock)
        if call:
            self._encode(call, clock)

    def _clock(self, name: str) -> Clock:
        return self.profile.clock(name) if self.profile is not None else NULL_CLOCK

    def _plan_loop(self) -> None:
        """Plans calls and reads; stores what the tokenizer thread finished."""
        clock = self._clock("plan")
        with self.cond:
            try:
                while not self.closed:
                    if self.done:
                        self._finish(self.done.popleft(), clock)
                        continue
                    if len(self.calls) < 2:
                        call, reads = self._plan(clock)
                        for f, parts in reads:
                            if f.remote:  # waiting on the network: let a reader thread wait
                                assert self._pool is not None
                                self._pool.submit(self._read_locked, f, parts)
                            else:  # local reads are CPU work under the GIL: no thread gains
                                self._read(f, parts, clock)
                        if call:
                            self.calls.append(
                                _Call(call, _take_texts(call, self.images, not self.planner.warm))
                            )
                            self.queued.notify()
                        if call or reads:
                            continue
                    self.idle += 1
                    clock.wait(self.wake)
                    self.idle -= 1
            except BaseException as exc:  # a bug here must not leave lanes waiting forever
                self.error = exc
                self._notify_everyone()
                raise

    def _tokenize_loop(self) -> None:
        """Calls the tokenizer on the planned calls, one after the other."""
        clock = self._clock("tokenize")
        with self.cond:
            try:
                while not self.closed:
                    if not self.calls:
                        clock.wait(self.queued)
                        continue
                    call = self.calls.popleft()
                    self.wake.notify()  # room for the next call
                    self.cond.release()
                    clock.switch(TOKENIZE)
                    try:
                        out, encodings = run_call(call.slots, call.texts, self.tok, self.images)
                    except BaseException as exc:  # handed to the lanes that wait on these
                        out, encodings = exc, False
                    finally:
                        clock.switch(OTHER)
                        self.cond.acquire()
                    self.done.append(_Finished(call, out, encodings))
                    self.wake.notify()
            except BaseException as exc:  # a bug here must not leave lanes waiting forever
                self.error = exc
                self._notify_everyone()
                raise

    def _finish(self, finished: _Finished, clock: Clock) -> None:
        """Store a finished call (lock held; released while encodings become ids)."""
        out = finished.out
        if finished.encodings:
            self.cond.release()
            left = clock.switch(CONVERT)
            try:
                out = frame_ids(out, self.tok)
            except BaseException as exc:
                out = exc
            finally:
                clock.switch(left)
                self.cond.acquire()
        self._store(finished.call.slots, finished.call.texts, out, clock)

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
        for owned in (self.images, self.profile):  # the decode pool, the stage clocks
            if owned is not None:
                owned.close()


def encode_call(
    slots: list[Slot], texts: list[Any], tok: TokenizerInfo, images: Any, clock: Clock
) -> list[np.ndarray] | BaseException:
    """The ids of one call's documents, or the error the lanes waiting on them get;
    the tokenizer's time is charged to `tokenize`, the ids' conversion to `convert`."""
    left = clock.switch(TOKENIZE)
    try:
        out, encodings = run_call(slots, texts, tok, images)
        if encodings:  # encode_documents without its cuts, its two stages apart
            clock.switch(CONVERT)
        return frame_ids(out, tok) if encodings else out
    except BaseException as exc:  # handed to the lanes that wait on these documents
        return exc
    finally:
        clock.switch(left)


def run_call(
    slots: list[Slot], texts: list[Any], tok: TokenizerInfo, images: Any
) -> tuple[Any, bool]:
    """(output, whether it is encodings to turn into ids) of one call. Long texts
    are cut and joined by encode_documents, ids and all; documents with images
    are decoded and framed by the image work; otherwise only the tokenizer runs
    here, and the planning thread converts."""
    if images is not None and any(s.feed.images is not None for s in slots):
        clock = current()
        left = clock.switch(IMAGE)  # decoding and patches (the native pool stays tokenize's)
        try:
            return images.encode(texts, [(s.feed.reader, s.doc_id) for s in slots]), False
        finally:
            clock.switch(left)
    if needs_pieces(texts, tok):
        return encode_documents(texts, tok), False
    return encode_raw(texts, tok), True
