"""The integration tests: torchrun and run_train.sh jobs, subprocesses and process
groups, and the long in-process ones. Every test collected from this folder is
marked `slow` (`pytest -m "not slow"` leaves them out); tests/unit/ holds the
in-process tests of seconds each."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's hook sees the whole session's items: mark only this folder's.
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def zephon_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The debug model trained on 4 processes for 6 steps, checkpoint at step 3 (once
    for all workers: tests only read it)."""
    from helpers.shared import once
    from helpers.train import ensure_sample_data, metrics, ok, torchrun

    ensure_sample_data()
    dump = once(tmp_path_factory, "ref4", lambda folder: ok(torchrun(4, folder)))
    return dump, metrics(dump)
