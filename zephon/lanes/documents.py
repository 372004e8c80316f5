"""Which documents of one source a lane reads, and in what order: an interface.

A lane walks each source epoch by epoch, block by block, each block in its own
visiting order. The scheduler's feeds and the lane's cursors only ever ask
this interface, never the shuffle itself, so that another way of dealing
documents to lanes (e.g. an epoch's remaining documents dealt to a new lane
count) is one more implementation and nothing else. The end-of-epoch rule
(`repeat`: the next epoch starts; `stop`: the lane's walk of the source ends)
is written here, once, for every implementation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np

from zephon.lanes.shuffle import SourceShuffle


class BlockPart(NamedTuple):
    """Documents of one block to read: the block's span [start, end) in the
    source, and offsets into it in visiting order."""

    start: int
    end: int
    order: np.ndarray


class LaneDocs(ABC):
    """One lane's documents of one source.

    Implementations give, per epoch, the lane's blocks in visiting order: how
    many there are, each block's span and visiting order, and where the pos-th
    document of the epoch lies. `repeat` says what happens at an epoch's end.
    """

    repeat: bool

    @abstractmethod
    def epoch_docs(self, epoch: int) -> int:
        """Documents of this lane in `epoch` (a shuffle deals at least one; an
        epoch dealt at a lane-count change may have none, see zephon/state/lane_count_deal.py)."""

    @abstractmethod
    def num_blocks(self, epoch: int) -> int:
        """Blocks of this lane in `epoch`."""

    @abstractmethod
    def block(self, epoch: int, j: int) -> BlockPart:
        """The j-th block of the lane in `epoch`, all its documents in visiting order."""

    @abstractmethod
    def locate(self, epoch: int, pos: int) -> tuple[int, int]:
        """(index of the block, offset in it) of the pos-th document of `epoch`."""

    def block_size(self, epoch: int, j: int) -> int:
        """Documents of the j-th block of the lane in `epoch`."""
        return len(self.block(epoch, j).order)

    # -- the end-of-epoch rule -------------------------------------------------

    def position(self, epoch: int, pos: int) -> tuple[int, int] | None:
        """The cursor (epoch, pos) with an epoch's end rolled over: the next
        epoch's start under `repeat` (past epochs without documents of this
        lane), None (the walk ended) under `stop`."""
        while pos >= self.epoch_docs(epoch):
            if not self.repeat:
                return None
            epoch, pos = epoch + 1, 0
        return epoch, pos

    def next_block(self, epoch: int, j: int) -> tuple[int, int] | None:
        """(epoch, block index) of the block after block j, by the same rule."""
        if j + 1 < self.num_blocks(epoch):
            return epoch, j + 1
        if not self.repeat:
            return None
        epoch += 1
        while not self.num_blocks(epoch):
            epoch += 1
        return epoch, 0


class ShuffledLaneDocs(LaneDocs):
    """A lane's documents as the source's shuffle deals them (shuffle.py)."""

    def __init__(self, order: SourceShuffle, lane: int, repeat: bool):
        self.order, self.lane, self.repeat = order, lane, repeat

    def epoch_docs(self, epoch: int) -> int:
        return self.order.lane_docs(epoch, self.lane)

    def num_blocks(self, epoch: int) -> int:
        return len(self.order.lane_blocks(epoch, self.lane)[0])

    def block(self, epoch: int, j: int) -> BlockPart:
        block = int(self.order.lane_blocks(epoch, self.lane)[0][j])
        start, end = self.order.block_range(block)
        return BlockPart(start, end, self.order.block_order(epoch, block))

    def block_size(self, epoch: int, j: int) -> int:
        start, end = self.order.block_range(int(self.order.lane_blocks(epoch, self.lane)[0][j]))
        return end - start

    def locate(self, epoch: int, pos: int) -> tuple[int, int]:
        return self.order.locate(epoch, self.lane, pos)
