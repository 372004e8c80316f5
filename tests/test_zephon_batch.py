"""The Batch's room for later features: defaults keep today's batches as they were."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.batch import IGNORE_INDEX, rows_to_batch


def batch_of(rows: int, padded: int = 0):
    tokens = np.arange(rows * 5, dtype=np.int32).reshape(rows, 5)
    positions = np.tile(np.arange(5, dtype=np.int32), (rows, 1))
    positions[rows - padded :] = -1  # padded rows: every label ignored
    return rows_to_batch(3, tokens, positions, [b"\0" * 32])


def test_defaults_are_todays_batch():
    b = batch_of(4)
    assert (b.phase, b.num_padded_rows, b.images) == (None, 0, None)
    assert [m.num_padded_rows for m in b.micro_batches(2)] == [0, 0]


def test_padded_rows_fall_in_the_last_micro_batches():
    b = batch_of(6, padded=3)
    b.num_padded_rows, b.phase = 3, "anneal"
    micro = b.micro_batches(2)
    assert [m.num_padded_rows for m in micro] == [0, 1, 2]
    assert [m.phase for m in micro] == ["anneal"] * 3
    for m in micro:  # the count says which rows have every label ignored
        ignored = (m.labels == IGNORE_INDEX).all(dim=1).tolist()
        assert (
            sum(ignored) == m.num_padded_rows
            and ignored[m.num_rows - m.num_padded_rows :] == [True] * m.num_padded_rows
        )


def test_image_data_is_not_cut_silently():
    b = batch_of(4)
    b.images = object()
    with pytest.raises(NotImplementedError, match="image"):
        b.micro_batches(2)


def test_cut_pads_to_the_rows_every_rank_runs():
    """A rank with fewer rows (uneven lanes) gets fully ignored rows where it is cut:
    inputs pad_id, labels ignored, positions 0; its own counts stay those of its rows."""
    b = batch_of(4)
    b.padded_to, b.pad_id = 8, 7
    valid, digests = b.num_valid_tokens(), list(b.digests)
    micro = b.micro_batches(2)
    assert [m.num_rows for m in micro] == [2, 2, 2, 2]
    assert [m.num_padded_rows for m in micro] == [0, 0, 2, 2]
    for m in micro[:2]:
        assert (m.labels != IGNORE_INDEX).any()
    for m in micro[2:]:
        assert (m.input_ids == 7).all() and (m.positions == 0).all()
        assert (m.labels == IGNORE_INDEX).all() and m.num_valid_tokens() == 0
    assert sum(m.num_valid_tokens() for m in micro) == valid == b.num_valid_tokens()
    assert b.num_rows == 4 and b.digests == digests  # the batch itself is unchanged
    with pytest.raises(ValueError, match="cannot cut 8 rows into micro-batches of 3"):
        b.micro_batches(3)
    b.padded_to = 3
    with pytest.raises(ValueError, match="cannot pad a batch of 4 rows to 3"):
        b.micro_batches(1)
