"""Atomic writes: a reader sees the old file or the new one, never a part."""

from __future__ import annotations

import os

import pytest

from zephon.files import atomic_file, atomic_path, atomic_write


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    dest = tmp_path / "sub" / "state.json"
    atomic_write(str(dest), "old")
    atomic_write(str(dest), b"new")
    assert dest.read_bytes() == b"new"
    assert os.listdir(dest.parent) == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    dest = tmp_path / "index.npy"
    atomic_write(str(dest), "old")
    with pytest.raises(RuntimeError), atomic_file(str(dest), "w") as f:
        f.write("half of the new")
        raise RuntimeError("crash mid-write")
    assert dest.read_text() == "old"
    assert os.listdir(tmp_path) == ["index.npy"]


def test_atomic_path_for_writers_that_take_a_path(tmp_path):
    dest = tmp_path / "seek_points"
    with atomic_path(str(dest)) as tmp:
        assert tmp != str(dest) and os.path.dirname(tmp) == str(tmp_path)
        with open(tmp, "wb") as f:
            f.write(b"points")
        assert not dest.exists()  # nothing visible before the block ends
    assert dest.read_bytes() == b"points"


def test_append_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="new file"), atomic_file(str(tmp_path / "x"), "a"):
        pass
