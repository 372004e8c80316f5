"""The digests' byte contract: exactly which bytes are hashed, whatever arrays come in.

A batch digest is the proof that two runs trained on the same bytes
(zephon/digest.py), so what it hashes is fixed here byte for byte: the rows as
little-endian int32 tokens then positions; the lane digests chained in order;
an image as its int64 grid then its uint8 patches. Arrays of another integer
type, byte order or layout hash the same.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from zephon.digest import global_batch_digest, rows_digest
from zephon.images.documents import image_digest

TOKENS = np.array([[1, 2, 70000], [5, 0, 3]], dtype=np.int32)
POSITIONS = np.array([[0, 1, 2], [0, -1, -1]], dtype=np.int32)
ROWS = hashlib.sha256(TOKENS.astype("<i4").tobytes() + POSITIONS.astype("<i4").tobytes()).digest()


def test_rows_digest_is_sha256_of_little_endian_int32_tokens_then_positions():
    assert rows_digest(TOKENS, POSITIONS) == ROWS
    assert ROWS.hex() == "c6125187e4550df54a22828467d914a67722552c819f03b991d74ddee6b8b34f"
    assert rows_digest(POSITIONS, TOKENS) != ROWS  # the order is part of it


@pytest.mark.parametrize("dtype", [np.int64, ">i4"])
def test_rows_digest_hashes_int32_whatever_the_input_type(dtype):
    assert rows_digest(TOKENS.astype(dtype), POSITIONS) == ROWS
    assert rows_digest(TOKENS, POSITIONS.astype(dtype)) == ROWS
    assert rows_digest(np.asfortranarray(TOKENS), np.asfortranarray(POSITIONS)) == ROWS


def test_global_digest_chains_the_lane_digests_in_order():
    a, b = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
    assert global_batch_digest([a, b]) == hashlib.sha256(a + b).hexdigest()
    assert global_batch_digest([b, a]) == hashlib.sha256(b + a).hexdigest()
    assert global_batch_digest([]) == hashlib.sha256().hexdigest()


def test_global_digest_refuses_a_digest_of_another_length():
    a = hashlib.sha256(b"a").digest()
    with pytest.raises(ValueError, match=r"^expected 32-byte digests, got 31 bytes$"):
        global_batch_digest([a, a[:31]])
    with pytest.raises(ValueError, match=r"^expected 32-byte digests, got 64 bytes$"):
        global_batch_digest([a + a])


PATCHES = (np.arange(8 * 12, dtype=np.int64) * 37 % 256).astype(np.uint8).reshape(8, 12)


def test_image_digest_is_sha256_of_the_int64_grid_then_the_uint8_patches():
    want = hashlib.sha256(np.array([2, 4], "<i8").tobytes() + PATCHES.tobytes()).digest()
    assert image_digest((2, 4), PATCHES) == want
    assert image_digest((4, 2), PATCHES) != want  # the grid is part of it


def test_image_digest_hashes_int64_and_uint8_whatever_the_input_type():
    want = image_digest((2, 4), PATCHES)
    assert image_digest(np.array([2, 4], dtype=np.int32), PATCHES) == want
    assert image_digest((2, 4), PATCHES.astype(np.int64)) == want
    assert image_digest((2, 4), np.asfortranarray(PATCHES)) == want


def test_a_lane_digest_with_images_chains_the_tag_rows_grids_and_image_digests():
    from zephon.images.assembly import DIGEST_TAG, LaneDigests, lane_digest
    from zephon.images.documents import DocImage

    images = [DocImage(1, 2, (2, 4), PATCHES, "a"), DocImage(9, 2, (4, 2), PATCHES, "b")]
    grids = [np.array(g, dtype="<i8").tobytes() for g in ((2, 4), (4, 2))]
    want = hashlib.sha256(
        DIGEST_TAG + ROWS + grids[0] + image_digest((2, 4), PATCHES)
        + grids[1] + image_digest((4, 2), PATCHES)
    ).digest()  # fmt: skip
    assert lane_digest(ROWS, images) == want
    assert lane_digest(ROWS, []) == ROWS  # a lane without images: its rows' digest
    lazy = LaneDigests([ROWS, ROWS, ROWS], [[], images, []])
    assert lazy.pending() == 1  # hashed only when read
    assert lazy[2] == ROWS and lazy.pending() == 1
    assert lazy[-2] == want and lazy.pending() == 0
    assert lazy == [ROWS, want, ROWS] and lazy[1:] == [want, ROWS] and len(lazy) == 3


def test_lane_digests_pickle_and_gather_as_the_list_of_their_values():
    import pickle

    from zephon.images.assembly import LaneDigests
    from zephon.images.documents import DocImage

    lazy = LaneDigests([ROWS, ROWS], [[DocImage(1, 2, (2, 4), PATCHES, "a")], []])
    copied = pickle.loads(pickle.dumps(lazy))
    assert type(copied) is list and copied == list(lazy) and lazy.pending() == 0
    assert global_batch_digest(lazy) == global_batch_digest(copied)
    with pytest.raises(IndexError):
        lazy[2]
