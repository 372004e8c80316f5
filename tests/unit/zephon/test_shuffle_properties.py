"""Properties of the keyed shuffle and the source plan (docs/design.md §4, zephon/lanes/shuffle.py).

The expected orders come from the rule written out again here in plain Python
integers (SHA-256 of the key, splitmix64 of index ^ key, indices sorted by hash):
the order is a function of (n, key) alone, the same on every machine and numpy
release, and a change to it (which would change every batch) fails here.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from hypothesis import assume, given
from hypothesis import strategies as st

from zephon.lanes.shuffle import SourceShuffle, keyed_permutation

MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_permutation(n: int, *key: object) -> list[int]:
    """range(n) sorted by the keyed hash of each index (ties by index)."""
    k = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little")
    return sorted(range(n), key=lambda i: (_splitmix64(i ^ k), i))


# Key parts as the loader passes them: seed, source name, epoch, a tag, a block or lane.
seeds = st.integers(0, 2**32)
names = st.text("abcdefgh_-0123456789", min_size=1, max_size=8)
epochs = st.integers(0, 50)
keys = st.tuples(seeds, names, epochs, st.sampled_from(["block", "lane", "blocks", "deal"]))


@given(st.integers(0, 3000), keys, st.integers(0, 10**6))
def test_keyed_permutation_is_the_hash_order_of_n_and_the_key(n, key, block):
    got = keyed_permutation(n, *key, block)
    assert got.tolist() == reference_permutation(n, *key, block)
    assert sorted(got.tolist()) == list(range(n))  # a bijection of range(n)


@given(st.integers(20, 400), keys, keys, st.integers(0, 1000), st.integers(0, 1000))
def test_different_keys_give_different_permutations(n, key_a, key_b, block_a, block_b):
    """Any change of seed, source, epoch, tag or block reorders (two orders of 20 or
    more items agree by chance with probability below 1/20!)."""
    a, b = (*key_a, block_a), (*key_b, block_b)
    assume(a != b)
    assert keyed_permutation(n, *a).tolist() != keyed_permutation(n, *b).tolist()


@st.composite
def plan_args(draw: st.DrawFn) -> dict:
    """SourceShuffle's arguments: a few to a few hundred documents over up to 12 lanes."""
    return {
        "name": draw(names),
        "num_docs": draw(st.integers(1, 12) | st.integers(1, 300)),  # often under the lanes
        "lanes": draw(st.integers(1, 12)),
        "block_size": draw(st.integers(1, 40)),
        "seed": draw(seeds),
        "shuffle": draw(st.booleans()),
    }


def expected_lanes(args: dict, epoch: int) -> list[list[int]]:
    """Each lane's documents of `epoch` in visiting order, by the rule: blocks of
    min(block_size, N // L) contiguous documents (so every lane owns one); block j
    of the epoch's keyed block order belongs to lane j mod L; each block visited in
    its own keyed order. Fewer documents than lanes: each lane its own walk over all."""
    n, lanes, seed, name = args["num_docs"], args["lanes"], args["seed"], args["name"]

    def perm(size: int, *key: object) -> list[int]:
        if not args["shuffle"]:
            return list(range(size))
        return reference_permutation(size, seed, name, epoch, *key)

    if n < lanes:
        return [perm(n, "lane", lane) for lane in range(lanes)]
    size = min(args["block_size"], n // lanes)
    blocks = [(a, min(a + size, n)) for a in range(0, n, size)]
    out: list[list[int]] = [[] for _ in range(lanes)]
    for j, b in enumerate(perm(len(blocks), "blocks")):
        a, end = blocks[b]
        out[j % lanes] += [a + o for o in perm(end - a, "block", b)]
    return out


def plan_lane(plan: SourceShuffle, epoch: int, lane: int) -> list[int]:
    """A lane's documents of `epoch` as the plan gives them, block by block."""
    docs: list[int] = []
    for b in plan.lane_blocks(epoch, lane)[0].tolist():
        start, _ = plan.block_range(b)
        docs += [start + o for o in plan.block_order(epoch, b).tolist()]
    return docs


@given(plan_args(), epochs)
def test_each_lanes_documents_follow_the_keyed_block_deal(args, epoch):
    plan = SourceShuffle(**args)
    want = expected_lanes(args, epoch)
    got = [plan_lane(plan, epoch, lane) for lane in range(args["lanes"])]
    assert got == want
    assert [plan.lane_docs(epoch, lane) for lane in range(args["lanes"])] == [*map(len, want)]


@given(plan_args(), epochs)
def test_an_epoch_visits_every_document_once_across_lanes(args, epoch):
    """Every lane has documents; over one epoch the lanes together read each
    document exactly once (a source with fewer documents than lanes: each lane reads
    each document once)."""
    plan = SourceShuffle(**args)
    n, lanes = args["num_docs"], args["lanes"]
    got = [plan_lane(plan, epoch, lane) for lane in range(lanes)]
    assert all(got)
    if n < lanes:
        assert all(sorted(docs) == list(range(n)) for docs in got)
    else:
        seen = Counter(d for docs in got for d in docs)
        assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}


@given(plan_args(), epochs, st.data())
def test_locate_finds_the_pos_th_document_of_a_lane(args, epoch, data):
    plan = SourceShuffle(**args)
    lane = data.draw(st.integers(0, args["lanes"] - 1))
    docs = expected_lanes(args, epoch)[lane]
    pos = data.draw(st.integers(0, len(docs) - 1))
    j, off = plan.locate(epoch, lane, pos)
    block = int(plan.lane_blocks(epoch, lane)[0][j])
    assert plan.block_range(block)[0] + int(plan.block_order(epoch, block)[off]) == docs[pos]
