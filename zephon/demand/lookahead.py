"""What one loader holds ahead of its lanes, and how that changes as work happens.

The need planner (planner.py) decides what to read and tokenize next; this is
the ledger it decides from: the lanes and their feeds, the tokens tokenized or
queued and not yet taken (against the token budget), the image bytes held
(images/budget.py), the long documents' cache and the counts of work. Every
event updates it here, under the scheduler's lock (scheduler.py): a lane takes
a document (`pop_ready`), a read or a tokenizer call finishes (`read_done`,
`stored`), best_fit gives a document back at a boundary (`give_back`), a
restore or a boundary forgets every lane (`reset`). Plain data, no threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from zephon.demand.feeds import Feed, FeedStart, LaneDemand, Slot
from zephon.demand.long_documents import LONG_CHARS, LongDocCache
from zephon.demand.stats import SchedulerStats
from zephon.images.budget import ImageBytes, held_bytes

# The image byte budget per rank when none is set (images/budget.py).
DEFAULT_LOOKAHEAD_BYTES = 512 << 20


class Lookahead:
    """The lanes of one loader and what is held ahead of them, against the budgets.

    Args:
        budget_tokens: lookahead budget (tokens tokenized or queued, not yet taken).
        cache: ids of long documents, served instead of tokenizing them again.
        budget_bytes: lookahead budget of image bytes (images/budget.py).
        decoders: documents of sources with images decoded at once.
    """

    def __init__(
        self,
        budget_tokens: int,
        cache: LongDocCache | None = None,
        budget_bytes: int = DEFAULT_LOOKAHEAD_BYTES,
        decoders: int = 1,
    ):
        self.budget = max(budget_tokens, 1)
        self.bytes = ImageBytes(budget_bytes, decoders)
        self.cache = cache if cache is not None else LongDocCache()
        self.lanes: list[LaneDemand] = []
        self.waiting: set[Feed] = set()
        self.floor = 0  # the step being produced: its documents ignore the budget
        self.warm = False  # first batch assembled: speculative lookahead allowed
        self.used = 0  # tokens tokenized or queued (estimated) and not yet taken
        self.tokens_per_char = 0.25  # running estimate, for queued documents
        self.stats = SchedulerStats()

    # -- lanes and feeds ------------------------------------------------------

    def add_lane(
        self, lane: int, mix_counts: Sequence[int], offset: int, weights: Sequence[float], unit: str
    ) -> LaneDemand:
        ld = LaneDemand(lane, len(self.lanes), mix_counts, offset, weights, unit)
        self.lanes.append(ld)
        return ld

    def add_feed(self, ld: LaneDemand, source: int, start: FeedStart) -> Feed:
        feed = Feed(ld, source, start)
        ld.feeds.append(feed)
        ld.restart()
        return feed

    def give_back(self, feed: Feed, ids: np.ndarray, doc_id: int) -> None:
        """A document its lane took is the feed's next again (best_fit gave it back
        at a phase boundary): first in the feed, tokenized."""
        slot = Slot(None, ids, doc_id, feed)
        feed.slots.appendleft(slot)
        feed.sched += 1
        feed.taken -= 1
        feed.sched_tokens += len(ids)
        self.used += len(ids)
        self.bytes.reserve(slot, held_bytes(ids))
        feed.lane.dirty = True

    def reset(self, keep_stats: bool = False) -> None:
        """Forget every lane (a restore or a phase boundary builds new ones); their
        feeds are marked dead."""
        for ld in self.lanes:
            for f in ld.feeds:
                f.dead = True
        self.lanes, self.waiting = [], set()
        self.used, self.warm, self.floor = 0, False, 0
        self.bytes.reset()
        if not keep_stats:
            self.stats = SchedulerStats()

    def stats_dict(self) -> dict[str, Any]:
        return {
            **asdict(self.stats),
            "lookahead_tokens": self.used,
            "lookahead_budget": self.budget,
            **self.bytes.stats(),
        }

    # -- what happened --------------------------------------------------------------

    def pop_ready(self, feed: Feed) -> tuple[np.ndarray, int] | None:
        """The feed's next document (ids, index in the source) if it is tokenized,
        taken by its lane; None if it is not ready."""
        slots = feed.slots
        if not slots or slots[0].ids is None:
            return None
        slot = slots.popleft()
        ids = slot.ids
        feed.sched -= 1
        feed.taken += 1
        ld, k, n = feed.lane, feed.source, len(ids)
        unit = n if ld.unit == "tokens" else 1
        ld.mix_counts[k] += unit
        ld.taken += unit
        ld.offset += n
        feed.sched_tokens -= n
        if self.warm:
            pass  # no simulation once warm (see planner.py `_entry`)
        elif ld.sim_idx[k] > 0:  # the simulation had already made this pick
            ld.sim_idx[k] -= 1
            ld.sim_tokens[k] -= n
        else:
            ld.restart()
        self.used -= n
        if slot.nbytes:
            self.bytes.release(slot)
        self.waiting.discard(feed)
        return ids, slot.doc_id

    def worth_planning(self) -> bool:
        """Whether an idle planner should plan again after a take: before the first
        batch every pick is new work; after it, once a quarter of the budget is
        free (see planner.py `plan`: small speculative calls are not made)."""
        return not self.warm or self.used <= self.budget - self.budget // 4

    def stored(self, call: list[Slot], texts: list[str], ids: Any) -> None:
        """A tokenizer call's ids (a list, one per slot) or its error arrived."""
        if all(s.feed.dead for s in call):
            return  # every lane it was for was dropped by a restore
        stats = self.stats
        stats.encode_calls += 1
        failed = isinstance(ids, BaseException)
        for k, s in enumerate(call):
            f = s.feed
            if f.dead:  # its lane was dropped by a restore
                continue
            if failed:
                f.error = ids
                continue
            s.ids = ids[k]
            n = len(s.ids)
            self.used += n - s.est
            f.sched_tokens += n - s.est
            f.lane.dirty = True
            if f.images is not None:  # its reserved decode peak is free again
                self.bytes.stored(s, stats)
                continue
            stats.docs_tokenized += 1
            stats.tokens_tokenized += n
            stats.chars_tokenized += len(texts[k])
            if len(texts[k]) >= LONG_CHARS:
                self.cache.remember(f.source, s.doc_id, s.ids)
        if stats.chars_tokenized:
            self.tokens_per_char = stats.tokens_tokenized / stats.chars_tokenized

    def read_done(self, f: Feed, slots: list[Slot], error: BaseException | None) -> None:
        """A read of the feed's documents finished (slots read before any error)."""
        f.reading = False
        if f.dead:
            return
        f.error = f.error or error
        f.slots.extend(slots)
        stats = self.stats
        stats.read_calls += 1
        stats.docs_read += len(slots)
        if f.pretokenized:
            n = sum(len(s.ids) for s in slots)  # type: ignore[arg-type]
            f.sched = len(f.slots)  # nothing to tokenize
            self.used += n
            f.sched_tokens += n
            stats.docs_pretokenized += len(slots)
            stats.tokens_pretokenized += n
        f.lane.dirty = True
