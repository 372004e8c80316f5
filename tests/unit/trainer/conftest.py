"""Fixtures of the trainer's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist


@pytest.fixture
def one_process_group(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of this process alone, destroyed after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
