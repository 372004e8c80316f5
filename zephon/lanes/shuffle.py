"""Seeded shuffling and the assignment of documents to lanes.

Each source is cut into contiguous blocks of documents. In every epoch the
block order is a keyed permutation of (seed, source, epoch), and block j of
that order belongs to lane j % L. Inside a block, documents are visited in a
keyed permutation of (seed, source, epoch, block). Nothing here depends on
history, so a lane's position in a source is just (epoch, documents taken):
a cursor, never a buffer. Over one epoch every document lands in exactly one
lane exactly once.

A small source (fewer documents than lanes) cannot give every lane its own
documents. There each lane walks all N documents every epoch, in its own
keyed permutation of (seed, source, epoch, lane): the source keeps its weight
in every lane, and every lane sees every document once per epoch. This is
expressed with the same block interface: block b of a small source is lane
b's walk, covering the whole source, and lane b owns only that block.

Permutations come from sorting a 64-bit keyed hash (splitmix64) of the
indices, written out here so the order never changes with a numpy release.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from zephon.errors import LayoutError

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _key(*parts: object) -> np.uint64:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def keyed_permutation(n: int, *key: object) -> np.ndarray:
    """A permutation of range(n) that depends only on n and the key."""
    with np.errstate(over="ignore"):
        h = _splitmix64(np.arange(n, dtype=np.uint64) ^ _key(*key))
    return np.argsort(h, kind="stable").astype(np.int64)


class SourceShuffle:
    """Which documents of one source each lane reads, epoch by epoch."""

    def __init__(
        self, name: str, num_docs: int, lanes: int, block_size: int, seed: int, shuffle: bool
    ):
        if num_docs < 1:
            raise LayoutError(f"source '{name}' has no documents")
        self.name, self.num_docs, self.lanes = name, num_docs, lanes
        self.seed, self.shuffle = seed, shuffle
        # A small source: one walk over all documents per lane (see the module notes).
        self.per_lane_walk = num_docs < lanes
        if self.per_lane_walk:
            self.block_size, self.num_blocks = num_docs, lanes
        else:
            # Blocks shrink for sources with few documents per lane so every lane owns one.
            self.block_size = min(block_size, num_docs // lanes)
            self.num_blocks = -(-num_docs // self.block_size)
        self._lane_blocks = lru_cache(maxsize=256)(self._compute_lane_blocks)
        # One epoch's block order serves every lane (a lane-count change reads them all).
        self._epoch_order = lru_cache(maxsize=4)(self._compute_epoch_order)

    def block_range(self, block: int) -> tuple[int, int]:
        if self.per_lane_walk:
            return 0, self.num_docs
        start = block * self.block_size
        return start, min(start + self.block_size, self.num_docs)

    def block_order(self, epoch: int, block: int) -> np.ndarray:
        """Visiting order of the block's documents, as offsets into the block."""
        a, b = self.block_range(block)
        if not self.shuffle:
            return np.arange(b - a, dtype=np.int64)
        if self.per_lane_walk:  # block == lane: that lane's own permutation
            return keyed_permutation(b - a, self.seed, self.name, epoch, "lane", block)
        return keyed_permutation(b - a, self.seed, self.name, epoch, "block", block)

    def _compute_lane_blocks(self, epoch: int, lane: int) -> tuple[np.ndarray, np.ndarray]:
        if self.per_lane_walk:
            return np.array([lane], dtype=np.int64), np.array([0, self.num_docs], dtype=np.int64)
        blocks = self._epoch_order(epoch)[lane :: self.lanes]
        last = self.num_docs - (self.num_blocks - 1) * self.block_size
        sizes = np.where(blocks == self.num_blocks - 1, last, self.block_size)
        return blocks, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def _compute_epoch_order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            return keyed_permutation(self.num_blocks, self.seed, self.name, epoch, "blocks")
        return np.arange(self.num_blocks, dtype=np.int64)

    def lane_blocks(self, epoch: int, lane: int) -> tuple[np.ndarray, np.ndarray]:
        """(block ids in visiting order, cumulative document counts) of a lane."""
        return self._lane_blocks(epoch, lane)

    def lane_docs(self, epoch: int, lane: int) -> int:
        return int(self.lane_blocks(epoch, lane)[1][-1])

    def locate(self, epoch: int, lane: int, pos: int) -> tuple[int, int]:
        """(index into the lane's block list, offset in that block) of the pos-th document."""
        _, cum = self.lane_blocks(epoch, lane)
        j = int(np.searchsorted(cum, pos, side="right")) - 1
        return j, pos - int(cum[j])
