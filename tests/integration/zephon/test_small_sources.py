"""Sources with fewer documents than lanes: each lane walks its own keyed
permutation of all N documents per epoch, the source's weight is honoured in
every lane, and the batches are the same at every data-parallel size and
across a resume. (Sources with at least as many documents as lanes keep
their bytes: tests/unit/zephon/test_digests_golden.py.)"""

from __future__ import annotations

import json
from collections import Counter

from helpers.corpus import synthetic_docs
from helpers.loader import close, make_ranks, save, step_digests

from zephon import ZephonLoader
from zephon.lanes.shuffle import SourceShuffle
from zephon.tokenize.tokenizer import encode_texts, load_tokenizer


def test_plan_gives_every_lane_its_own_walk_of_all_documents() -> None:
    plan = SourceShuffle("tiny", 12, 24, block_size=128, seed=7, shuffle=True)
    orders = set()
    for epoch in (0, 1):
        for lane in range(24):
            blocks, cum = plan.lane_blocks(epoch, lane)
            assert list(cum) == [0, 12] and plan.lane_docs(epoch, lane) == 12
            start, end = plan.block_range(int(blocks[0]))
            order = tuple(start + plan.block_order(epoch, int(blocks[0])))
            assert sorted(order) == list(range(12))
            orders.add(order)
    assert len(orders) > 40  # lanes and epochs walk in different orders
    # Sources with at least one document per lane keep their block layout.
    assert not SourceShuffle("even", 24, 24, 128, 7, True).per_lane_walk
    unshuffled = SourceShuffle("tiny", 12, 24, 128, 7, False)
    assert list(unshuffled.block_order(3, 5)) == list(range(12))


def test_small_source_alone_and_in_a_mixture_with_24_lanes(make_recipe, tokenizer_path) -> None:
    recipe = make_recipe(sources=[("tiny", 12, 1.0), ("big", 300, 1.0)], lanes=24, unit="documents")
    shape = {"global_batch_size": 48, "seq_len": 128}
    ranks = make_ranks(recipe, tokenizer_path, 1, trace=True, **shape)
    reference = step_digests(ranks, 8)
    traces = ranks[0].traces
    for lane in (0, 5, 23):
        docs = Counter(src for src, _ in traces[lane])
        assert abs(docs[0] - docs[1]) <= 1  # weights 1:1 by documents, in every lane
        tiny = [doc for src, doc in traces[lane] if src == 0]
        assert len(tiny) > 12 and sorted(tiny[:12]) == list(
            range(12)
        )  # one epoch: all 12, each once
    firsts = {tuple(doc for src, doc in traces[lane] if src == 0)[:12] for lane in range(24)}
    assert len(firsts) > 20
    close(ranks)
    for dp in (2, 4):
        ranks = make_ranks(recipe, tokenizer_path, dp, **shape)
        assert step_digests(ranks, 8) == reference
        close(ranks)
    # resume at step 3 on another data-parallel size
    ranks = make_ranks(recipe, tokenizer_path, 3, **shape)
    step_digests(ranks, 3)
    state = json.loads(json.dumps(save(ranks)))
    close(ranks)
    resumed = make_ranks(recipe, tokenizer_path, 8, **shape)
    for loader in resumed:
        loader.load_state_dict(state)
    assert step_digests(resumed, 5) == reference[3:]
    close(resumed)


def test_twelve_documents_in_a_1024_lane_recipe_do_only_the_work_needed(
    make_recipe, tokenizer_path
) -> None:
    """1024 lanes walking 12 documents: the first batch costs what it holds
    (its rows, plus at most one straddling document per lane), counted in
    tokens tokenized, not timed."""
    recipe = make_recipe(sources=[("tiny", 12, 1.0)], lanes=1024, block_size=64)
    tok = load_tokenizer(tokenizer_path)
    longest = max(len(ids) for ids in encode_texts(synthetic_docs(12, seed=100), tok))
    loader = ZephonLoader(recipe, tokenizer_path, seq_len=16, global_batch_size=1024, trace=True)
    first = step_digests([loader], 1)
    stats = loader.stats()  # the recipe's prefetch 0: nothing produced past step 1
    first += step_digests([loader], 1)
    # every lane starts its own walk: all 12 documents come first in some lanes
    assert {loader.traces[lane][0][1] for lane in range(1024)} == set(range(12))
    work = stats["first_batch"]
    assert work["row_tokens"] == 1024 * 17
    # Exactly the documents the lanes packed were tokenized (nothing speculative
    # before the first batch), and they hold the rows plus at most one document
    # per lane.
    assert work["docs_tokenized"] == stats["docs_packed"], stats
    assert work["tokens_tokenized"] <= work["row_tokens"] + 1024 * longest, work
    loader.close()
    two = make_ranks(recipe, tokenizer_path, 2, seq_len=16, global_batch_size=1024)
    assert step_digests(two, 2) == first
    close(two)


def test_weight_is_honoured_with_1024_lanes(make_recipe, tokenizer_path) -> None:
    recipe = make_recipe(
        sources=[("tiny", 12, 1.0), ("big", 2048, 3.0)],
        lanes=1024,
        block_size=64,
        unit="documents",
    )
    loader = ZephonLoader(recipe, tokenizer_path, seq_len=128, global_batch_size=1024, trace=True)
    step_digests([loader], 2)
    for lane, trace in loader.traces.items():
        tiny = sum(src == 0 for src, _ in trace)
        assert abs(tiny - len(trace) / 4) <= 1, (lane, trace)  # within one document
    assert sum(len(t) for t in loader.traces.values()) > 4 * 1024
    loader.close()
