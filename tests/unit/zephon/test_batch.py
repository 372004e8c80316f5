"""The Batch's room for later features: defaults keep today's batches as they were."""

from __future__ import annotations

import numpy as np
import pytest

from zephon.batch import IGNORE_INDEX, rows_to_batch
from zephon.images.batch import ImageBatch


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


def _images() -> ImageBatch:
    # three images: 4x4 patches in row 0 and row 2, 2x2 in row 3 (merge 2, patch 1)
    grids = np.array([[4, 4], [2, 2], [4, 2]])
    n = grids.prod(axis=1)
    patches = np.concatenate([np.full((k, 3), i, dtype=np.uint8) for i, k in enumerate(n)])
    return ImageBatch.from_numpy(patches, grids, [0, 2, 3], [1, 5, 0], patch_size=1, merge=2)


def test_micro_batches_carry_the_images_of_their_rows():
    b = batch_of(4)
    b.images = _images()
    first, second = b.micro_batches(2)
    assert first.images.num_images == 1 and second.images.num_images == 2
    assert first.images.tokens().tolist() == [4]
    assert second.images.rows.tolist() == [0, 1]  # rows renumbered within the micro-batch
    assert second.images.starts.tolist() == [5, 0]
    # each image keeps exactly its own patches
    assert first.images.patches.unique().tolist() == [0] and len(first.images.patches) == 16
    assert second.images.patches[:4].unique().tolist() == [1]
    assert second.images.patches[4:].unique().tolist() == [2] and len(second.images.patches) == 12
    assert second.images.patch_offsets().tolist() == [0, 4, 12]


def test_rows_without_images_get_an_empty_image_batch():
    b = batch_of(4)
    b.images = _images()
    empty = b.images.select_rows(1, 2)
    assert empty.num_images == 0 and empty.patches.shape == (0, 3)


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


def test_padding_rows_carry_no_images():
    b = batch_of(4)
    b.images = _images()
    b.padded_to, b.pad_id = 8, 7
    micro = b.micro_batches(2)
    assert [m.images.num_images for m in micro] == [1, 2, 0, 0]


def test_images_in_parts_select_and_join_like_one_array():
    """A part per image (what the loader hands over): row selection keeps views of
    exactly the selected images' patches, and joining gives the one-array bytes."""
    whole = _images()
    counts = [16, 4, 8]
    edges = np.cumsum([0, *counts])
    arrays = [whole.patches.numpy()[a:b] for a, b in zip(edges, edges[1:], strict=False)]
    parts = ImageBatch.from_numpy(
        arrays, whole.grids.numpy(), [0, 2, 3], [1, 5, 0], patch_size=1, merge=2
    )
    assert len(parts.parts) == 3 and parts.patches.equal(whole.patches)
    for first, last in ((0, 1), (1, 3), (2, 4), (0, 4), (1, 2)):
        got, want = parts.select_rows(first, last), whole.select_rows(first, last)
        assert got.patches.equal(want.patches) and got.grids.equal(want.grids), (first, last)
        assert all(any(np.shares_memory(p.numpy(), a) for a in arrays) for p in got.parts)
    assert parts.patches_on(None).data_ptr() != parts.parts[0].data_ptr()  # joined: a copy
