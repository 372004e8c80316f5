"""Garbage collection at fixed steps (torchtitan/components/garbage_collection.py):
automatic collection off while training, the young generations every N steps and
every generation every 20th time, Python's own collection back at close."""

from __future__ import annotations

import gc

import pytest

from torchtitan.components.garbage_collection import FULL_EVERY, ScheduledCollection
from torchtitan.config.job_config import ConfigError, load_job_config


def _run(every: int, steps: int) -> tuple[list[int], list[tuple[int, int]], bool, bool]:
    """(generations collected at start, (step, generation) of each later collection,
    automatic collection during the run, and after close)."""
    calls: list[int] = []
    schedule = ScheduledCollection(every, collect=lambda g: calls.append(g) or 0)
    at_start = list(calls)
    done: list[tuple[int, int]] = []
    for step in range(1, steps + 1):
        before = len(calls)
        schedule.after_step(step)
        done += [(step, g) for g in calls[before:]]
    during = gc.isenabled()
    schedule.close()
    return at_start, done, during, gc.isenabled()


def test_collections_fall_on_multiples_of_the_interval_full_ones_every_twentieth():
    assert gc.isenabled()
    at_start, done, during, after = _run(10, 10 * FULL_EVERY * 2 + 5)
    assert at_start == [2]  # what setting up the model left behind
    assert [s for s, _ in done] == list(range(10, 10 * FULL_EVERY * 2 + 1, 10))
    full = [s for s, g in done if g == 2]
    assert full == [10 * FULL_EVERY, 20 * FULL_EVERY]
    assert all(g == 1 for s, g in done if s not in full)
    assert (during, after) == (False, True)


def test_zero_leaves_collection_to_python():
    at_start, done, during, after = _run(0, 500)
    assert (at_start, done, during, after) == ([], [], True, True)


def test_a_negative_interval_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"training\.gc_every_steps"):
        load_job_config(["--training.gc_every_steps", "-1"])
    assert load_job_config([]).training.gc_every_steps == 50
