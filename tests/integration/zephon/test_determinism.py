"""The global batch is a function of the recipe and the step only: not of the
data-parallel size, worker count, prefetch depth or micro-batch size."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.loader import close, make_ranks, step_digests

from zephon import ZephonLoader

STEPS = 12


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_same_digests_for_every_dp_workers_and_prefetch(make_recipe, tokenizer_path, algorithm):
    recipe = make_recipe(algorithm=algorithm)
    ref_loaders = make_ranks(recipe, tokenizer_path, 1, num_workers=0, prefetch=0)
    reference = step_digests(ref_loaders, STEPS)
    close(ref_loaders)
    assert len(set(reference)) == STEPS  # steps really differ from one another
    for dp in (1, 2, 4, 8):
        # lookahead_tokens: tiny (a document at a time), a few rows, and the default
        for workers, prefetch, lookahead in ((1, 1, 1), (4, 3, 100), (4, 0, None), (0, 1, 7)):
            loaders = make_ranks(
                recipe,
                tokenizer_path,
                dp,
                num_workers=workers,
                prefetch=prefetch,
                lookahead_tokens=lookahead,
            )
            assert step_digests(loaders, STEPS) == reference, (dp, workers, prefetch, lookahead)
            close(loaders)


def test_rank_batches_concatenate_to_the_canonical_global_batch(make_recipe, tokenizer_path):
    recipe = make_recipe()
    whole = make_ranks(recipe, tokenizer_path, 1)[0]
    split = make_ranks(recipe, tokenizer_path, 4, micro_batch_size=2)
    for _ in range(5):
        full = whole.next_batch()
        parts = [ld.next_batch() for ld in split]
        for name in ("input_ids", "labels", "positions"):
            joined = np.concatenate([getattr(p, name).numpy() for p in parts])
            assert np.array_equal(getattr(full, name).numpy(), joined)
        # micro-batches are a plain cut of the local batch, in order
        micro = parts[1].micro_batches(2)
        assert len(micro) == 2
        assert np.array_equal(
            np.concatenate([m.input_ids.numpy() for m in micro]), parts[1].input_ids.numpy()
        )


def test_lane_stream_depends_only_on_its_lane(make_recipe, tokenizer_path):
    """Lane 5's rows are the same whichever rank owns it."""
    recipe = make_recipe()
    a = ZephonLoader(recipe, tokenizer_path, 32, 16, dp_rank=2, dp_size=4)  # lanes 4, 5
    b = ZephonLoader(recipe, tokenizer_path, 32, 16, dp_rank=5, dp_size=8)  # lane 5
    for _ in range(4):
        assert a.next_batch().digests[1] == b.next_batch().digests[0]


def test_seed_changes_the_data(make_recipe, tokenizer_path):
    one = step_digests(make_ranks(make_recipe(seed=1), tokenizer_path, 1), 3)
    two = step_digests(make_ranks(make_recipe(seed=2), tokenizer_path, 1), 3)
    assert one != two
