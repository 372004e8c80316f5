"""Checkpoint at step k on D1 ranks, restore on D2 ranks: the continued global
batches equal the uninterrupted run's, for every pair of sizes."""

from __future__ import annotations

import json
import time

import pytest
from helpers.loader import close, make_ranks, save, step_digests

TOTAL = 14
SIZES = (1, 2, 4, 8)


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_resume_at_any_size_continues_every_lane(make_recipe, tokenizer_path, algorithm):
    # flush_interval 8 rows = 4 steps at 2 rows per lane per step, so k = 3 and 5
    # stop inside a flush interval and k = 4 on a flush point.
    recipe = make_recipe(algorithm=algorithm, flush_interval=8)
    ref = make_ranks(recipe, tokenizer_path, 1)
    reference = step_digests(ref, TOTAL)
    close(ref)
    for k in (0, 3, 4, 5):
        for d1 in SIZES:
            before = make_ranks(recipe, tokenizer_path, d1, num_workers=2, prefetch=2)
            assert step_digests(before, k) == reference[:k]
            # JSON round trip: the state is a document, not live objects
            state = json.loads(json.dumps(save(before)))
            close(before)
            for d2 in SIZES:
                after = make_ranks(recipe, tokenizer_path, d2)
                for loader in after:
                    loader.load_state_dict(state)
                got = step_digests(after, TOTAL - k)
                close(after)
                assert got == reference[k:], f"k={k} D1={d1} D2={d2}"


def test_state_counts_consumed_not_prefetched(make_recipe, tokenizer_path):
    recipe = make_recipe()
    ref = step_digests(make_ranks(recipe, tokenizer_path, 1), 10)
    loaders = make_ranks(recipe, tokenizer_path, 2, num_workers=2, prefetch=4)
    step_digests(loaders, 3)
    # Wait until the prefetcher has really produced steps the trainer did not take.
    deadline = time.monotonic() + 30
    while min(ld._produced_step for ld in loaders) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert min(ld._produced_step for ld in loaders) >= 5, "the prefetcher never ran ahead"
    state = save(loaders)
    assert state["step"] == 3
    close(loaders)
    resumed = make_ranks(recipe, tokenizer_path, 4)
    for loader in resumed:
        loader.load_state_dict(state)
    assert step_digests(resumed, 7) == ref[3:]


def test_resume_twice_in_a_row(make_recipe, tokenizer_path):
    """A resumed run's own checkpoint resumes correctly (state after replay)."""
    recipe = make_recipe(algorithm="best_fit", flush_interval=8)
    reference = step_digests(make_ranks(recipe, tokenizer_path, 1), 12)
    first = make_ranks(recipe, tokenizer_path, 4)
    step_digests(first, 3)
    second = make_ranks(recipe, tokenizer_path, 2)
    for loader in second:
        loader.load_state_dict(save(first))
    assert step_digests(second, 2) == reference[3:5]
    third = make_ranks(recipe, tokenizer_path, 8)
    for loader in third:
        loader.load_state_dict(save(second))
    assert step_digests(third, 7) == reference[5:12]


def test_resume_across_epochs_with_repeat(make_recipe, tokenizer_path):
    """Small sources wrap around several times; resume lands mid-epoch."""
    recipe = make_recipe(sources=[("a", 40, 1.0), ("b", 24, 2.0)], flush_interval=4)
    reference = step_digests(make_ranks(recipe, tokenizer_path, 1), 40)
    before = make_ranks(recipe, tokenizer_path, 2)
    step_digests(before, 27)
    state = save(before)
    epochs = {
        v["epoch"] for lane in state["lanes"].values() for v in lane["flush"]["sources"].values()
    }
    assert max(epochs) >= 1  # we really crossed an epoch boundary
    after = make_ranks(recipe, tokenizer_path, 8)
    for loader in after:
        loader.load_state_dict(state)
    assert step_digests(after, 13) == reference[27:]
