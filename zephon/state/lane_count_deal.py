"""A lane-count change: the documents the old lanes had not drawn, dealt to the new lanes.

At a boundary from L to L' lanes, each old lane stands at its own place in
each source: (epoch e_l, documents taken p_l). For a source and each epoch e
from E = min e_l to M = max e_l, the **pool** of e holds every document of e
that its old lane has not drawn: nothing of an epoch the lane finished, its
documents from p_l on in e_l, all of its documents in later epochs. The pool
is kept as pieces of the old lanes' blocks (a block from an offset in its
visiting order, or whole), so reads stay block-local; the pieces of epoch e
follow a keyed permutation of (seed, source, e, "deal", phase name) and piece
i goes to new lane i mod L'. A new lane walks its pieces of E, then of E + 1,
... M, then the plain L'-lane shuffle from M + 1 on. Over every epoch each
document is drawn exactly once across the boundary, and none is lost.

The boundary is recorded as the old lanes' cursors per source (a *record*,
O(L x sources)), from which every rank rebuilds the same lists; several
changes chain, each dealing from the lists the one before made. A record is
dropped once no new lane can reach an epoch it dealt (the next change's E is
past its M).

Exempt: a source whose old plan gives every lane its own walk over all
documents (fewer documents than old lanes) has no pool to deal; each new lane
starts its own walk at the first epoch no old lane had begun (or at the epoch
every old lane stood at the start of). A source no lane has drawn from in its
current epoch (e.g. one first used later) continues on the plain L'-lane plan
from that epoch, with no record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zephon.lanes.documents import BlockPart, LaneDocs, ShuffledLaneDocs
from zephon.lanes.shuffle import SourceShuffle, keyed_permutation

Cursor = tuple[int, int, bool]  # (epoch, documents taken, retired)
Record = dict[str, Any]  # {"phase", "lanes_before", "lanes_after", "cursors": [[e, p, r], ...]}
Piece = tuple[int, int, int]  # (old lane, its block index in the epoch, offset into the block)


class Deal:
    """One source's pools at one lane-count change, dealt to the new lanes."""

    def __init__(
        self,
        old: Sequence[LaneDocs],
        cursors: Sequence[Cursor],
        lanes: int,
        key: tuple[Any, ...],
        shuffle: bool,
        dealt_before: int | None = None,
    ):
        self.old, self.cursors, self.lanes, self.key, self.shuffle = (
            old,
            cursors,
            lanes,
            key,
            shuffle,
        )
        live = [e for e, _, retired in cursors if not retired]
        # An earlier change of the chain dealt up to `dealt_before`: the old lanes'
        # documents of those epochs are dealt pieces, not the plain plan's, so this
        # change deals on to there as well (else what the earlier lanes drew of
        # them would be drawn again from the plain plan).
        self.first = min(live)
        self.last = max(live) if dealt_before is None else max(max(live), dealt_before)
        self._pieces: dict[int, list[list[Piece]]] = {}

    def pieces(self, epoch: int) -> list[list[Piece]]:
        """Per new lane, its pieces of `epoch` (first <= epoch <= last), in walking order."""
        if epoch not in self._pieces:
            pool: list[Piece] = []
            for lane, (docs, (e, p, retired)) in enumerate(
                zip(self.old, self.cursors, strict=True)
            ):
                if retired or epoch < e:
                    continue
                start = p if epoch == e else 0
                if start >= docs.epoch_docs(epoch):
                    continue
                j, off = docs.locate(epoch, start)
                pool += [(lane, b, off if b == j else 0) for b in range(j, docs.num_blocks(epoch))]
            seed, name, phase = self.key
            if self.shuffle:
                order = keyed_permutation(len(pool), seed, name, epoch, "deal", phase).tolist()
            else:
                order = list(range(len(pool)))
            dealt: list[list[Piece]] = [[] for _ in range(self.lanes)]
            for i, k in enumerate(order):
                dealt[i % self.lanes].append(pool[k])
            self._pieces[epoch] = dealt
        return self._pieces[epoch]


class DealtLaneDocs(LaneDocs):
    """A new lane's documents of one source after a lane-count change: its pieces of
    the dealt epochs, then `after` (the plain plan for the new lane count)."""

    def __init__(self, deal: Deal, lane: int, after: LaneDocs):
        self.deal, self.lane, self.after = deal, lane, after
        self.repeat = after.repeat
        self._cum: dict[int, np.ndarray] = {}

    def _dealt(self, epoch: int) -> bool:
        return self.deal.first <= epoch <= self.deal.last

    def _mine(self, epoch: int) -> list[Piece]:
        return self.deal.pieces(epoch)[self.lane]

    def _cumulative(self, epoch: int) -> np.ndarray:
        if epoch not in self._cum:
            old = self.deal.old
            sizes = [old[lane].block_size(epoch, b) - off for lane, b, off in self._mine(epoch)]
            self._cum[epoch] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return self._cum[epoch]

    def epoch_docs(self, epoch: int) -> int:
        if not self._dealt(epoch):
            return self.after.epoch_docs(epoch)
        return int(self._cumulative(epoch)[-1])

    def num_blocks(self, epoch: int) -> int:
        if not self._dealt(epoch):
            return self.after.num_blocks(epoch)
        return len(self._mine(epoch))

    def block(self, epoch: int, j: int) -> BlockPart:
        if not self._dealt(epoch):
            return self.after.block(epoch, j)
        lane, b, off = self._mine(epoch)[j]
        part = self.deal.old[lane].block(epoch, b)
        return BlockPart(part.start, part.end, part.order[off:])

    def block_size(self, epoch: int, j: int) -> int:
        if not self._dealt(epoch):
            return self.after.block_size(epoch, j)
        lane, b, off = self._mine(epoch)[j]
        return self.deal.old[lane].block_size(epoch, b) - off

    def locate(self, epoch: int, pos: int) -> tuple[int, int]:
        if not self._dealt(epoch):
            return self.after.locate(epoch, pos)
        cum = self._cumulative(epoch)
        j = int(np.searchsorted(cum, pos, side="right")) - 1
        return j, pos - int(cum[j])


def build_lane_docs(
    chain: Sequence[Record],
    plan_for: Callable[[int], SourceShuffle],
    repeat: bool,
    seed: int,
    name: str,
    shuffle: bool,
) -> list[LaneDocs]:
    """Every lane's documents of one source after the changes of `chain`, in order
    (the lanes of its last record)."""
    lanes = int(chain[0]["lanes_before"])
    docs: list[LaneDocs] = [
        ShuffledLaneDocs(plan_for(lanes), lane, repeat) for lane in range(lanes)
    ]
    dealt_before: int | None = None
    for rec in chain:
        cursors = [(int(e), int(p), bool(r)) for e, p, r in rec["cursors"]]
        new = int(rec["lanes_after"])
        deal = Deal(docs, cursors, new, (seed, name, rec["phase"]), shuffle, dealt_before)
        dealt_before = deal.last
        after = plan_for(new)
        docs = [
            DealtLaneDocs(deal, lane, ShuffledLaneDocs(after, lane, repeat)) for lane in range(new)
        ]
    return docs


def dealt_until(chain: Sequence[Record]) -> int:
    """The last epoch the chain's final change dealt: each change deals on to the
    epochs the changes before it dealt (Deal's `dealt_before`)."""
    return max(e for rec in chain for e, _, retired in rec["cursors"] if not retired)


def deal_source(
    chain: Sequence[Record],
    cursors: Sequence[Cursor],
    per_lane_walk: bool,
    lanes_after: int,
    phase: str | None,
) -> tuple[list[Record], list[Cursor]]:
    """The record chain after a lane-count change, and every new lane's starting
    cursor, for one source whose old lanes stand at `cursors` (rules above)."""
    live = [(e, p) for e, p, retired in cursors if not retired]
    if not live:  # every old lane's walk of a `stop` source ended
        return [], [(0, 0, True)] * lanes_after
    epochs = {e for e, _ in live}
    first = min(epochs)
    if chain and first > dealt_until(chain):  # no lane reaches an epoch the chain dealt
        chain = []
    # Exempt, unless every old lane still stands in epochs the chain dealt: their
    # documents there are dealt pieces, not their own walks. (Lanes on both sides
    # of the chain's last epoch are still treated as exempt: a known limit, design §12.)
    if per_lane_walk and not (chain and max(epochs) <= dealt_until(chain)):
        begun = [e + 1 if (p or retired) else e for e, p, retired in cursors]
        return [], [(max(begun), 0, False)] * lanes_after
    if not chain and len(live) == len(cursors) and len(epochs) == 1 and not any(p for _, p in live):
        return [], [(first, 0, False)] * lanes_after  # untouched: the plain plan
    record: Record = {
        "phase": phase,
        "lanes_before": len(cursors),
        "lanes_after": lanes_after,
        "cursors": [[e, p, retired] for e, p, retired in cursors],
    }
    return [*chain, record], [(first, 0, False)] * lanes_after
