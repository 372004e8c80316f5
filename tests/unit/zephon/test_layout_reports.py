"""The layout in its own words, exactly (zephon/recipe/layout.py).

`describe()` goes to the startup log, the padding note and the alternatives
into warnings and LayoutError messages: each number in them is checked where
it stands, and each refusal names its numbers.
"""

from __future__ import annotations

import pytest

from zephon import LayoutError, resolve_layout
from zephon.recipe.layout import lanes_of_rank


def test_describe_names_every_number_of_the_layout():
    assert resolve_layout(8, 3, 16, 2).describe() == (
        "lanes=8 dp=3 global_batch=16 rows/lane/step=2 rows/rank=6 micro_batch=2 "
        "micro_steps=3 idle=11.1%"
    )
    # The default micro-batch: the largest rank's rows (10 lanes of 1 row), whole.
    assert resolve_layout(64, 7, 64).describe() == (
        "lanes=64 dp=7 global_batch=64 rows/lane/step=1 rows/rank=10 micro_batch=10 "
        "micro_steps=1 idle=8.6%"
    )


def test_the_padding_note_counts_ranks_rows_and_idle_compute():
    assert resolve_layout(8, 3, 16, 2).imbalance() == (
        "padded layout: 8 lanes over 3 data-parallel ranks, rows per rank 4 on 1 rank, "
        "6 on 2 ranks; every rank runs 6 rows (3 micro-batches of 2), so 2 of the 18 rows "
        "run per step are padding: 11.1% of the compute idles"
    )
    assert resolve_layout(8, 2, 16, 3).imbalance() == (
        "padded layout: 8 lanes over 2 data-parallel ranks, rows per rank 8 on 2 ranks; "
        "every rank runs 9 rows (3 micro-batches of 3), so 2 of the 18 rows run per step "
        "are padding: 11.1% of the compute idles"
    )
    assert resolve_layout(8, 2, 16).imbalance() is None


def test_alternatives_list_the_sizes_that_run_without_padding():
    assert resolve_layout(8, 3, 16, 2).even_alternatives() == (
        "data-parallel sizes without padding: 1, 2, 4, 8"
    )
    assert resolve_layout(12, 4, 24, 2).even_alternatives() == (
        "data-parallel sizes without padding: 1, 2, 3, 4, 6, 12; "
        "micro-batch sizes without padding: 1, 2, 3, 6"
    )
    assert resolve_layout(8, 2, 16, 3).even_alternatives() == (
        "data-parallel sizes without padding: none; micro-batch sizes without padding: 1, 2, 4, 8"
    )
    assert resolve_layout(4, 3, 4, 3).even_alternatives() == (
        "data-parallel sizes without padding: none"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            (8, 2, 20, 2),
            "global batch size 20 is not divisible by the lane count 8 (each lane gives G/L "
            "rows per step); use e.g. 16 or 24",
        ),
        (
            (8, 1, 4),
            "global batch size 4 is not divisible by the lane count 8 (each lane gives G/L "
            "rows per step); use e.g. 8 or 16",
        ),
        (
            (8, 3, 16, 2, 0.1),
            "padded layout: 8 lanes over 3 data-parallel ranks, rows per rank 4 on 1 rank, 6 on "
            "2 ranks; every rank runs 6 rows (3 micro-batches of 2), so 2 of the 18 rows run per "
            "step are padding: 11.1% of the compute idles, more than the allowed 10.0%; "
            "data-parallel sizes without padding: 1, 2, 4, 8 (or raise the allowed idle share)",
        ),
        (
            (4, 8, 32),
            "data-parallel size 8 exceeds the lane count 4: every rank needs at least one lane; "
            "raise [recipe] lanes to a multiple of 8",
        ),
        (
            (0, 1, 1),
            "lanes (0), data-parallel size (1) and global batch size (1) must all be >= 1",
        ),
        ((8, 2, 16, -1), "micro-batch size (-1) must be >= 1"),
        ((8, 2, 16, 2, -0.5), "max_idle_share -0.5 is not a share in [0, 1]"),
    ],
)
def test_refusals_name_their_numbers(args, message):
    with pytest.raises(LayoutError) as info:
        resolve_layout(*args)
    assert str(info.value) == message


def test_a_rank_outside_the_group_is_named():
    for rank in (2, -1):
        with pytest.raises(LayoutError) as info:
            lanes_of_rank(8, 2, rank)
        assert str(info.value) == f"data-parallel rank {rank} is outside [0, 2)"
