"""Exactly-once consumption, realised mixture, bounded state and bounded replay."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from helpers.loader import GLOBAL_BATCH, close, make_ranks, save, step_digests

from zephon import ZephonLoader, load_recipe
from zephon.sources import SourceReader


def _drain_lanes(loader: ZephonLoader) -> list[tuple[np.ndarray, np.ndarray]]:
    rows = []
    loader.start()
    for lane in loader.lanes:
        while (row := lane.next_row()) is not None:
            rows.append(row)
    return rows


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_one_epoch_with_stop_consumes_every_document_exactly_once(
    make_recipe, tokenizer_path, algorithm
):
    path = make_recipe(
        sources=[("prose", 300, 0.7), ("code", 200, 0.3)],
        on_exhausted="stop",
        algorithm=algorithm,
        block_size=7,  # blocks do not divide the sources evenly
    )
    loader = ZephonLoader(path, tokenizer_path, 32, GLOBAL_BATCH, trace=True, prefetch=0)
    rows = _drain_lanes(loader)
    seen = Counter(doc for lane in loader.traces.values() for doc in lane)
    assert set(seen) == {(0, i) for i in range(300)} | {(1, i) for i in range(200)}
    assert set(seen.values()) == {1}
    # every token of every document (plus its EOS) is in exactly one row
    recipe = load_recipe(path)
    tok = loader.tok.tokenizer
    expected = 0
    for spec in recipe.sources:
        texts = SourceReader(spec, recipe.execution.cache_dir).read_range(
            0, 300 if spec.name == "prose" else 200
        )
        expected += sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))
    real = sum(int((pos >= 0).sum()) for _, pos in rows)
    assert real == expected
    if algorithm == "concat":
        # concat pads only the last row of each lane
        padded = [int((pos < 0).sum()) > 0 for _, pos in rows]
        assert sum(padded) <= len(loader.lanes)
    loader.close()


@pytest.mark.parametrize("unit", ["documents", "tokens"])
def test_realised_mixture_matches_weights(make_recipe, tokenizer_path, unit):
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    path = make_recipe(sources=[(n, 120, w) for n, w in weights.items()], unit=unit, lanes=8)
    loader = ZephonLoader(path, tokenizer_path, 32, GLOBAL_BATCH, trace=True, prefetch=0)
    while sum(len(t) for t in loader.traces.values()) < 10_000:
        loader.next_batch()
    total = np.zeros(3)
    for lane in loader.lanes:
        counts = np.array(lane.mixer.counts, dtype=float)
        share = counts / counts.sum()
        # largest-deficit keeps each lane within one document (or its tokens) of the target
        assert np.abs(share - list(weights.values())).max() < 0.01, (lane.lane, share)
        total += counts
    share = total / total.sum()
    assert np.abs(share - list(weights.values())).max() < 0.01
    if unit == "documents":
        docs = Counter(src for lane in loader.traces.values() for src, _ in lane)
        n = sum(docs.values())
        for i, w in enumerate(weights.values()):
            # the bound for documents: off by at most one document per lane
            assert abs(docs[i] - w * n) <= len(loader.lanes) + 1
    loader.close()


def _state_at(recipe, tok, step):
    loaders = make_ranks(recipe, tok, 2)
    step_digests(loaders, step)
    state = save(loaders)
    close(loaders)
    return state


def test_state_size_does_not_grow_and_replay_is_bounded(make_recipe, tokenizer_path):
    flush = 8
    recipe = make_recipe(flush_interval=flush, algorithm="concat")
    sizes = {}
    replay = {}
    for step in (10, 1000):
        state = _state_at(recipe, tokenizer_path, step)
        sizes[step] = len(json.dumps(state))
        resumed = make_ranks(recipe, tokenizer_path, 4, num_workers=0, prefetch=0)
        for loader in resumed:
            loader.load_state_dict(state)
            loader.next_batch()  # replay happens on the way to the first batch
        replay[step] = {
            k: sum(loader.stats()["replay"][k] for loader in resumed)
            for k in ("rows", "docs_packed", "docs_tokenized")
        }
        close(resumed)
    lanes = 8
    # O(lanes x sources): only the digits of a few counters grow
    assert sizes[1000] - sizes[10] <= 16 * lanes, sizes
    rows_per_lane_step = GLOBAL_BATCH // lanes
    for step in (10, 1000):
        # at most one flush interval (plus the step in flight) of rows per lane
        assert replay[step]["rows"] <= lanes * (flush + rows_per_lane_step)
        # a document has at least ~3 tokens here, so a window of rows holds a bounded number
        bound = lanes * ((flush + rows_per_lane_step) * 33 // 3 + 1)
        assert replay[step]["docs_packed"] <= bound
        # tokenized documents: the packed ones plus at most one block per source being read
        assert replay[step]["docs_tokenized"] <= replay[step]["docs_packed"] + lanes * 2 * 16


def test_checkpoint_on_a_flush_boundary_replays_nothing(make_recipe, tokenizer_path):
    # 8-row flush interval at 2 rows per lane per step: step 4 ends on a flush point.
    recipe = make_recipe(flush_interval=8, algorithm="concat")
    reference = step_digests(make_ranks(recipe, tokenizer_path, 1), 6)
    loaders = make_ranks(recipe, tokenizer_path, 2, num_workers=2, prefetch=2)
    step_digests(loaders, 4)
    state = save(loaders)
    close(loaders)
    assert {lane["rows_since_flush"] for lane in state["lanes"].values()} == {0}
    resumed = make_ranks(recipe, tokenizer_path, 4)
    for loader in resumed:
        loader.load_state_dict(state)
    assert step_digests(resumed, 2) == reference[4:]
    assert sum(loader.stats()["replay"]["rows"] for loader in resumed) == 0
