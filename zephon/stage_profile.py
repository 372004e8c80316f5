"""Opt-in CPU breakdown of the pipeline by stage: where its own cost per token goes.

The tokenizer's native thread pool is the work the pipeline exists to feed;
everything else (reading, parsing, planning, turning encodings into id
arrays, mixing and packing, assembling batches) is overhead that competes
with it for cores. This module measures that overhead as thread CPU time,
not wall time, so a busy machine changes the figures little.

Each pipeline thread owns a `ThreadClock` and tells it when it moves from one
stage to another (`switch`): the thread CPU (`time.thread_time_ns`) since the
last switch is charged to the stage it leaves. So a thread's stages always
add up to all of its CPU while it was registered. Waits are stages too (their
CPU is close to zero), and their wall time is kept apart. The tokenizer's
native threads run no Python, so they cannot switch: their CPU is read from
`/proc/self/task/<tid>/schedstat` when a snapshot is taken (every thread of
the process that never ran Python counts as the tokenizer's pool).

Off by default, and then free: the loader builds no profile, the scheduler
and producer keep `None` instead of a clock and test it once per call (a
tokenizer call, a read, a step, never per token or per document), and code
that cannot be handed a clock (the source readers) asks `current()`, which
is one module-level test while no profile is active.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

# Stages, in the order the breakdown lists them.
STAGES = (
    "read",  # I/O and decompression
    "parse",  # JSON / Parquet records -> Python values
    "plan",  # the need planner and its bookkeeping
    "tokenize",  # inside the native call, its thread pool included
    "convert",  # encodings -> int32 id arrays
    "image",  # header plans when read; decoding, patches, framing (not the native pool)
    "pack",  # mixing and packing, lane by lane
    "assemble",  # batch arrays, tensors, digests
    "other",  # pipeline threads outside any stage: locks, loops, hand-offs
    "wait",  # blocked (CPU ~0; the wall time is reported apart)
)
READ, PARSE, PLAN, TOKENIZE, CONVERT, IMAGE, PACK, ASSEMBLE, OTHER, WAIT = range(len(STAGES))
# The consumer's thread between next_batch calls: the trainer's time, not counted.
OUTSIDE = len(STAGES)

_active = 0  # profiles collecting now: while 0, current() costs one test
_local = threading.local()
_thread_cpu_ns = time.thread_time_ns  # the calling thread's CPU clock (tests drive their own)


class ThreadClock:
    """One thread's CPU, charged to the stage the thread is in."""

    __slots__ = ("name", "stage", "since", "cpu", "wait_ns", "native_id", "switches")

    def __init__(self, name: str, stage: int = OTHER):
        self.name, self.stage = name, stage
        self.native_id = threading.get_native_id()
        self.cpu = [0] * (len(STAGES) + 1)
        self.wait_ns = self.switches = 0
        self.since = _thread_cpu_ns()

    def switch(self, stage: int) -> int:
        """Enter `stage`; returns the stage left (to switch back to)."""
        now = _thread_cpu_ns()
        self.cpu[self.stage] += now - self.since
        self.since = now
        self.switches += 1
        left, self.stage = self.stage, stage
        return left

    def wait_begin(self) -> tuple[int, int]:
        """Start blocking; pass the result to `wait_end`."""
        return self.switch(WAIT), time.perf_counter_ns()

    def wait_end(self, begun: tuple[int, int]) -> None:
        left, t0 = begun
        self.wait_ns += time.perf_counter_ns() - t0
        self.switch(left)

    def wait(self, cond: threading.Condition, timeout: float | None = None) -> bool:
        """`cond.wait(timeout)`, counted as a wait (its wall time kept apart)."""
        begun = self.wait_begin()
        try:
            return cond.wait(timeout)
        finally:
            self.wait_end(begun)


class ProcessClock:
    """CPU spent for the pipeline by another process (image decode processes),
    added as its tasks report it; listed among the threads under its name."""

    __slots__ = ("name", "stage", "since", "cpu", "wait_ns", "native_id", "switches", "_lock")

    def __init__(self, name: str):
        self.name, self.stage, self.since = name, OUTSIDE, 0
        self.native_id = None  # no thread of this process: nothing open to read
        self.cpu = [0] * (len(STAGES) + 1)
        self.wait_ns = self.switches = 0
        self._lock = threading.Lock()

    def add(self, stage: int, ns: int) -> None:
        with self._lock:
            self.cpu[stage] += ns


class NullClock:
    """The clock of a thread nobody profiles: every call does nothing."""

    __slots__ = ()

    def switch(self, stage: int) -> int:
        return stage

    def wait_begin(self) -> tuple[int, int]:
        return 0, 0

    def wait_end(self, begun: tuple[int, int]) -> None:
        pass

    def wait(self, cond: threading.Condition, timeout: float | None = None) -> bool:
        return cond.wait(timeout)


NULL_CLOCK = NullClock()
Clock = ThreadClock | NullClock


def current() -> Clock:
    """The calling thread's clock, if a profile is collecting on it (else NULL_CLOCK)."""
    if not _active:
        return NULL_CLOCK
    return getattr(_local, "clock", NULL_CLOCK)


def _task_cpu_ns() -> dict[int, int]:
    """CPU time (ns) of every thread of this process, by thread id."""
    out: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
    return out


class StageProfile:
    """The stage clocks of one loader's threads, and their sum as a breakdown."""

    def __init__(self) -> None:
        global _active
        self.clocks: list[ThreadClock | ProcessClock] = []
        self._lock = threading.Lock()
        self._python_tids = {t.native_id for t in threading.enumerate() if t.native_id}
        self._native_start = self._native_cpu()
        self._process_start = time.process_time_ns()
        self.tokens = 0  # tokens delivered (non-padding), counted by the loader
        self.closed = False
        _active += 1

    def _native_cpu(self) -> dict[int, int]:
        if not os.path.isdir("/proc/self/task"):  # not Linux: no native breakdown
            return {}
        self._python_tids |= {t.native_id for t in threading.enumerate() if t.native_id}
        self._python_tids |= {c.native_id for c in self.clocks}
        return {k: v for k, v in _task_cpu_ns().items() if k not in self._python_tids}

    def clock(self, name: str, stage: int = OTHER) -> ThreadClock:
        """A clock for the calling thread, which becomes its `current()` one."""
        clock = ThreadClock(name, stage)
        with self._lock:
            self.clocks.append(clock)
            self._python_tids.add(clock.native_id)
        _local.clock = clock
        return clock

    def external(self, name: str) -> ProcessClock:
        """A clock that other processes' CPU is added to (`ProcessClock.add`)."""
        clock = ProcessClock(name)
        with self._lock:
            self.clocks.append(clock)
        return clock

    def here(self, name: str) -> ThreadClock:
        """The calling thread's clock of this profile, made on its first use."""
        clock = getattr(_local, "clock", None)
        if clock is None or clock not in self.clocks:
            clock = self.clock(name, OUTSIDE)
        return clock

    def close(self) -> None:
        global _active
        if not self.closed:
            self.closed = True
            _active -= 1

    def snapshot(self) -> dict[str, Any]:
        """CPU ns per stage since the profile began, over every pipeline thread.

        `tokenize` includes the tokenizer's native pool (`native_tokenize_ns`).
        A clock's open interval is read as of now only for the calling thread;
        other threads' stages count up to their last switch (their open
        interval is `unswitched_ns`, taken from their thread CPU clocks).
        `process_cpu_ns`: the whole process over the same time, for a check.
        """
        process = time.process_time_ns() - self._process_start
        cpu = [0] * (len(STAGES) + 1)
        threads: dict[str, dict[str, int]] = {}
        wait_ns: dict[str, int] = {}
        unswitched = switches = 0
        me = getattr(_local, "clock", None)
        for c in list(self.clocks):
            if c is me:
                c.switch(c.stage)
            else:
                unswitched += _open_interval(c)
            for i, v in enumerate(c.cpu[: len(STAGES)]):
                cpu[i] += v
            key = c.name if c.name not in threads else f"{c.name}-{c.native_id}"
            threads[key] = {s: v for s, v in zip(STAGES, c.cpu, strict=False) if v}
            wait_ns[key] = c.wait_ns
            switches += c.switches
        start, now = self._native_start, self._native_cpu()
        native = sum(v - start.get(k, 0) for k, v in now.items())
        cpu[TOKENIZE] += native
        return {
            "cpu_ns": dict(zip(STAGES, cpu, strict=False)),
            "total_cpu_ns": sum(cpu[: len(STAGES)]),
            "native_tokenize_ns": native,
            "unswitched_ns": unswitched,
            "process_cpu_ns": process,
            "wait_ns": wait_ns,
            "switches": switches,
            "threads": threads,
            "tokens": self.tokens,
        }


def _open_interval(c: ThreadClock | ProcessClock) -> int:
    """CPU a thread spent since its last switch (0 when its clock cannot be read;
    a ProcessClock has nothing open)."""
    if isinstance(c, ProcessClock):
        return 0
    try:
        ident = next(t.ident for t in threading.enumerate() if t.native_id == c.native_id)
        if c.stage == OUTSIDE:
            return 0
        return max(0, time.clock_gettime_ns(time.pthread_getcpuclockid(ident)) - c.since)
    except (StopIteration, OSError, AttributeError, TypeError):
        return 0


def per_token(snapshot: dict[str, Any], tokens: int) -> dict[str, float]:
    """ns per token of each stage, and of their total."""
    n = max(tokens, 1)
    out = {s: v / n for s, v in snapshot["cpu_ns"].items()}
    out["total"] = snapshot["total_cpu_ns"] / n
    return out
