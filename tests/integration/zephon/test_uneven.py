"""Any data-parallel size up to the lane count: 64 lanes on D ranks that do not
divide them give the same global batches, byte for byte, as every other D; the
smaller ranks pad only where micro-batches are cut; a checkpoint saved at one
uneven size resumes at another."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.loader import close, make_ranks, save, step_digests

from zephon import IGNORE_INDEX, resolve_layout

LANES, G, MICRO, STEPS = 64, 64, 4, 8
SIZES = (1, 5, 6, 7, 12, 48, 56, 64)


@pytest.fixture
def recipe64(make_recipe):
    # Enough blocks of 4 documents for every one of the 64 lanes; a flush point
    # every 4 rows = 4 steps at one row per lane per step.
    return make_recipe(
        sources=[("prose", 600, 0.7), ("code", 400, 0.3)],
        lanes=LANES,
        block_size=4,
        flush_interval=4,
    )


def ranks(recipe, tok, dp, **kw):
    return make_ranks(recipe, tok, dp, global_batch_size=G, micro_batch_size=MICRO, **kw)


def test_every_size_up_to_the_lanes_gives_the_same_bytes(recipe64, tokenizer_path):
    whole = ranks(recipe64, tokenizer_path, 1)
    reference = [whole[0].next_batch() for _ in range(3)]
    close(whole)
    ref_digests = None
    for dp in SIZES:
        loaders = ranks(recipe64, tokenizer_path, dp)
        layout = resolve_layout(LANES, dp, G, MICRO)
        for step, full in enumerate(reference):
            parts = [ld.next_batch() for ld in loaders]
            # Each rank hands over its real rows only, and says how many every rank runs.
            assert [p.num_rows for p in parts] == [layout.rows_of(r) for r in range(dp)]
            assert {p.padded_to for p in parts} == {layout.rows_per_rank}
            for name in ("input_ids", "labels", "positions"):
                joined = np.concatenate([getattr(p, name).numpy() for p in parts])
                assert np.array_equal(joined, getattr(full, name).numpy()), (dp, step, name)
            assert [d for p in parts for d in p.digests] == full.digests
            assert sum(p.source_tokens for p in parts).tolist() == full.source_tokens.tolist()
            assert sum(p.num_valid_tokens() for p in parts) == full.num_valid_tokens()
        digests = step_digests(loaders, STEPS - 3)
        close(loaders)
        ref_digests = ref_digests or digests
        assert digests == ref_digests, dp


@pytest.mark.parametrize("dp", [5, 7, 56])
def test_smaller_ranks_pad_to_the_same_micro_steps(recipe64, tokenizer_path, dp):
    layout = resolve_layout(LANES, dp, G, MICRO)
    assert layout.total_padded_rows > 0
    loaders = ranks(recipe64, tokenizer_path, dp)
    for rank, loader in enumerate(loaders):
        batch = loader.next_batch()
        micro = batch.micro_batches(MICRO)
        assert len(micro) == layout.micro_steps
        assert sum(m.num_padded_rows for m in micro) == layout.padded_rows(rank)
        # Padding adds no valid token and no row to the rank's digests.
        assert sum(int((m.labels != IGNORE_INDEX).sum()) for m in micro) == (
            batch.num_valid_tokens()
        )
        padded = np.concatenate([m.labels.numpy() for m in micro])[batch.num_rows :]
        assert padded.shape[0] == layout.padded_rows(rank) and (padded == IGNORE_INDEX).all()
        assert len(batch.digests) == len(layout.lanes_of(rank))
    close(loaders)


def test_resume_between_uneven_sizes(recipe64, tokenizer_path):
    total = 12
    ref = ranks(recipe64, tokenizer_path, 1)
    reference = step_digests(ref, total)
    close(ref)
    # k = 3 stops inside a flush interval, k = 8 on a flush point.
    for k, d1, d2 in ((3, 5, 7), (3, 7, 5), (8, 12, 56), (8, 56, 6), (3, 6, 1), (8, 1, 7)):
        before = ranks(recipe64, tokenizer_path, d1, num_workers=2, prefetch=2)
        assert step_digests(before, k) == reference[:k]
        state = json.loads(json.dumps(save(before)))
        close(before)
        assert state["dp_size"] == d1 and len(state["lanes"]) == LANES
        after = ranks(recipe64, tokenizer_path, d2)
        for loader in after:
            loader.load_state_dict(state)
        got = step_digests(after, total - k)
        close(after)
        assert got == reference[k:], f"k={k} D1={d1} D2={d2}"
