"""Folders a test session makes once, whatever the number of pytest-xdist workers.

A session- or module-scoped fixture runs once per worker process: with `-n 2`, a
reference training run that tests on both workers use would be trained twice.
`once` makes the folder under the directory the workers share; the first worker
to ask makes it while the others wait on a file lock, then every worker reads it.
The fixtures that use it make deterministic runs and tests only read them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `make(folder)` the first time any worker asks."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # popen-gw<N>'s parent: this session's, shared by the workers
    folder = root / f"once-{name}"
    with FileLock(f"{folder}.lock"):
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker whose `make` failed
            folder.mkdir(parents=True)
            make(folder)
            (folder / ".made").touch()
    return folder
