"""The shuffle's exact orders and the lanes' blocks (zephon/lanes/shuffle.py).

The hash is splitmix64 (checked against the reference generator's first
output), keyed by SHA-256 of the key's repr; the orders below were written
once by this code and must never change: they decide every batch.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from zephon.errors import LayoutError
from zephon.lanes.shuffle import SourceShuffle, _key, _splitmix64, keyed_permutation


def test_splitmix64_is_the_reference_generator():
    # splitmix64 seeded with 0 first yields 0xE220A8397B1DCDAF (Vigna's reference code).
    out = _splitmix64(np.arange(3, dtype=np.uint64)).tolist()
    assert out[0] == 0xE220A8397B1DCDAF
    assert out == [16294208416658607535, 10451216379200822465, 10905525725756348110]


def test_the_key_is_the_first_8_bytes_of_sha256_of_its_repr_little_endian():
    digest = hashlib.sha256(repr((1234, "prose", 0)).encode()).digest()
    assert _key(1234, "prose", 0) == np.uint64(int.from_bytes(digest[:8], "little"))
    assert int(_key(1234, "prose")) == 16926116612159081362


def test_keyed_permutations_are_fixed_by_n_and_the_key():
    assert keyed_permutation(10, 1234, "prose", 0, "blocks").tolist() == [
        7, 6, 8, 0, 5, 4, 3, 9, 2, 1,
    ]  # fmt: skip
    assert keyed_permutation(10, 1234, "prose", 1, "blocks").tolist() == [
        6, 4, 5, 7, 0, 8, 9, 2, 1, 3,
    ]  # fmt: skip
    perm = keyed_permutation(1000, 5, "x")
    assert perm.dtype == np.int64 and sorted(perm.tolist()) == list(range(1000))
    assert keyed_permutation(0, 5, "x").tolist() == []


def test_blocks_are_dealt_to_lanes_in_the_epochs_block_order():
    plan = SourceShuffle("prose", 23, 3, 4, 7, True)
    assert (plan.per_lane_walk, plan.block_size, plan.num_blocks) == (False, 4, 6)
    assert [plan.block_range(b) for b in range(6)] == [
        (0, 4), (4, 8), (8, 12), (12, 16), (16, 20), (20, 23),
    ]  # fmt: skip
    got = [(blocks.tolist(), cum.tolist()) for blocks, cum in
           (plan.lane_blocks(0, lane) for lane in range(3))]  # fmt: skip
    # The order of epoch 0 is keyed_permutation(6, 7, "prose", 0, "blocks"); block 5
    # is the short last one (3 documents).
    order = keyed_permutation(6, 7, "prose", 0, "blocks").tolist()
    assert (
        [b for b, _ in got] == [order[0::3], order[1::3], order[2::3]] == [[2, 0], [5, 3], [1, 4]]
    )
    assert [c for _, c in got] == [[0, 4, 8], [0, 3, 7], [0, 4, 8]]
    assert [plan.lane_docs(0, lane) for lane in range(3)] == [8, 7, 8]
    assert (
        plan.lane_blocks(0, 1)[0].dtype == np.int64 and plan.lane_blocks(0, 1)[1].dtype == np.int64
    )
    assert (
        plan.lane_blocks(1, 0)[0].tolist()
        == keyed_permutation(6, 7, "prose", 1, "blocks")[0::3].tolist()
    )


def test_a_position_is_a_block_of_the_lane_and_an_offset_in_it():
    plan = SourceShuffle("prose", 23, 3, 4, 7, True)
    assert [plan.locate(0, 1, pos) for pos in (0, 2, 3, 6)] == [(0, 0), (0, 2), (1, 0), (1, 3)]


def test_inside_a_block_documents_follow_their_own_keyed_order():
    plan = SourceShuffle("prose", 23, 3, 4, 7, True)
    assert plan.block_order(0, 5).tolist() == [0, 2, 1]
    assert (
        plan.block_order(0, 5).tolist() == keyed_permutation(3, 7, "prose", 0, "block", 5).tolist()
    )
    assert plan.block_order(1, 5).tolist() == [2, 0, 1]
    assert plan.block_order(0, 1).tolist() == [1, 2, 0, 3]


def test_without_shuffle_blocks_and_documents_keep_their_order():
    plan = SourceShuffle("prose", 23, 3, 4, 7, False)
    assert [plan.lane_blocks(0, lane)[0].tolist() for lane in range(3)] == [[0, 3], [1, 4], [2, 5]]
    assert plan.block_order(0, 5).tolist() == [0, 1, 2]
    assert plan.block_order(0, 2).dtype == np.int64
    assert SourceShuffle("tiny", 3, 5, 4, 7, False).block_order(0, 1).tolist() == [0, 1, 2]


def test_blocks_shrink_so_every_lane_owns_one():
    plan = SourceShuffle("few", 10, 4, 64, 7, True)
    assert (plan.block_size, plan.num_blocks) == (2, 5)
    one = SourceShuffle("one", 1, 1, 64, 7, True)
    assert (one.per_lane_walk, one.block_size, one.num_blocks) == (False, 1, 1)
    assert one.lane_blocks(3, 0)[1].tolist() == [0, 1]


def test_a_small_source_gives_each_lane_its_own_walk_of_every_document():
    plan = SourceShuffle("tiny", 3, 5, 4, 7, True)
    assert (plan.per_lane_walk, plan.block_size, plan.num_blocks) == (True, 3, 5)
    assert [plan.lane_blocks(0, lane)[0].tolist() for lane in range(5)] == [[0], [1], [2], [3], [4]]
    assert plan.lane_blocks(2, 2)[1].tolist() == [0, 3] and plan.block_range(4) == (0, 3)
    assert [plan.block_order(0, lane).tolist() for lane in range(5)] == [
        [1, 0, 2], [1, 2, 0], [0, 2, 1], [2, 1, 0], [1, 2, 0],
    ]  # fmt: skip
    assert plan.block_order(0, 3).tolist() == keyed_permutation(3, 7, "tiny", 0, "lane", 3).tolist()
    # As many documents as lanes: each lane its own block of one.
    even = SourceShuffle("even", 5, 5, 4, 7, True)
    assert (even.per_lane_walk, even.block_size, even.num_blocks) == (False, 1, 5)


def test_a_source_without_documents_is_refused():
    with pytest.raises(LayoutError) as info:
        SourceShuffle("empty", 0, 2, 4, 7, True)
    assert str(info.value) == "source 'empty' has no documents"
