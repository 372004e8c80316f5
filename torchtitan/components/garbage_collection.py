"""Python's garbage collection at fixed steps instead of whenever allocations add up.

Python starts a collection when allocations pass a threshold, in whichever
thread allocates, and holds the GIL for all of it. The loader's threads
allocate a few objects per document, so collections of the oldest generation,
which walk every object of the process (torch's and the model's modules and
the loader's lookahead: about 45 ms with torch loaded, on the 2-core CI
machine), fall on random steps. Meanwhile every other thread waits: the
loader's feeding threads among them, so its decode processes run dry; and on
many ranks, one rank's collection is everyone's slow step.

`ScheduledCollection(every)` turns automatic collection off and collects the
young generations every `every` steps, every generation every `FULL_EVERY`-th
time (so cycles that lived long enough to be promoted are still freed in a run
of a week), on the same steps on every rank. `every = 0` leaves collection to
Python. (`[training] gc_every_steps`, docs/training.md.)
"""

from __future__ import annotations

import gc
from collections.abc import Callable

FULL_EVERY = 20  # every 20th scheduled collection takes every generation


class ScheduledCollection:
    """Collections at steps that are multiples of `every`; automatic collection off
    until `close`. `collect`: gc.collect (tests pass their own)."""

    def __init__(self, every: int, collect: Callable[[int], int] = gc.collect):
        if every < 0:
            raise ValueError(f"training.gc_every_steps must be 0 (off) or positive, got {every}")
        self.every, self._collect = every, collect
        self._was_enabled = gc.isenabled()
        if every:
            gc.disable()
            collect(2)  # start from a clean heap: what the model's setup left behind

    def after_step(self, step: int) -> None:
        if self.every and step % self.every == 0:
            full = (step // self.every) % FULL_EVERY == 0
            self._collect(2 if full else 1)

    def close(self) -> None:
        """Automatic collection as it was before."""
        if self.every and self._was_enabled:
            gc.enable()
