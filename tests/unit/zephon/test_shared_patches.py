"""The patch arena: slots of shared memory that decode processes fill and batches hand
to the model (zephon/images/shared_patches.py). Policies only: no process here."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from zephon.images import shared_patches
from zephon.images.shared_patches import ALIGN, SHM_DIR, PatchArena


def _file(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def test_slots_never_overlap_and_a_dead_view_frees_its_slot_for_the_next_take():
    arena = PatchArena(segment_bytes=4096)
    try:
        a, b, c = (arena.take(1000) for _ in range(3))
        assert len({a.segment, b.segment, c.segment}) == 1
        spans = sorted((s.offset, s.offset + s.nbytes) for s in (a, b, c))
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
        assert all(s.offset % ALIGN == 0 for s in (a, b, c))
        views = [arena.view(s) for s in (a, b, c)]
        for k, v in enumerate(views):
            v[:] = k + 1
        assert [int(v.max()) for v in views] == [1, 2, 3]  # each wrote only its own bytes
        assert arena.used_bytes() == 3 * 1024
        held = views[1].reshape(10, 100)[2:5]  # a view of a view keeps the slot
        del views, v
        gc.collect()
        assert arena.used_bytes() == 1024
        # c's space joined the free tail, taken next (the search goes on from the
        # last slot taken: next fit), then a's; b's bytes are untouched
        again = [arena.take(1000) for _ in range(3)]
        assert [s.offset for s in again] == [c.offset, c.offset + 1024, a.offset]
        assert {s.segment for s in again} == {a.segment}
        assert int(held.min()) == 2 and len(arena.segment_names()) == 1
    finally:
        arena.close()


def test_a_new_segment_when_nothing_fits_released_once_wholly_free():
    arena = PatchArena(segment_bytes=4096)
    try:
        first = arena.take(4000)
        big = arena.take(10_000)  # no room in the first: a segment of its own size
        assert big.segment != first.segment
        assert os.path.exists(_file(big.segment)) and os.path.getsize(_file(big.segment)) >= 10_000
        view = arena.view(big)
        view[:] = 7
        del view
        gc.collect()
        arena.take(16)  # frees the dead view's slot: its segment is released
        assert not os.path.exists(_file(big.segment))
        assert arena.segment_names() == {first.segment}
        arena.give(first)
        assert os.path.exists(_file(first.segment))  # the first segment stays
    finally:
        arena.close()


def test_views_outlive_close_and_the_files_are_gone():
    arena = PatchArena(segment_bytes=4096)
    slot = arena.take(100)
    view = arena.view(slot)
    view[:] = np.arange(100, dtype=np.uint8)
    arena.close()
    assert not os.path.exists(_file(slot.segment))
    assert view.sum() == sum(range(100))  # still mapped: a batch may still hold it
    with pytest.raises(RuntimeError, match="closed"):
        arena.take(1)
    del view
    gc.collect()


def test_no_room_in_dev_shm_is_one_clear_error(monkeypatch):
    class Full:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(shared_patches.os, "statvfs", lambda path: Full())
    arena = PatchArena(segment_bytes=1 << 20)
    with pytest.raises(MemoryError) as err:
        arena.take(100)
    msg = str(err.value)
    assert SHM_DIR in msg and "--shm-size" in msg and "workers" in msg
    assert arena.segment_names() == frozenset()
    arena.close()
