"""Where decoded patches live: shared memory that decode processes write into.

A decode process (images/decode_processes.py) writes an image's patches once,
into a *slot* the loader took for it when it planned the call: the slot's size
is known from the header (`ImageSizing.patch_bytes`), so no pixel array
crosses a pipe and none is copied again. The loader's view of a filled slot is
what lanes carry and what `ImageBatch` hands the model (one view per image);
the slot is free again once the last view of it is gone (a finalizer on the
view), so the same pages are reused step after step instead of being faulted
in afresh for every batch.

Memory comes in *segments* of POSIX shared memory (files in /dev/shm on
Linux): one of `segment_bytes` to start, another when no free range fits (at
least the request's size). A segment other than the first is released once
wholly free. The lookahead's byte budget (`[execution] lookahead_bytes`)
bounds what is decoded ahead; batches the consumer still holds keep their
slots, so holding many batches grows the arena, as it would grow the heap.

Thread-safe: views die on whatever thread drops them last, and the garbage
collector may drop one in the middle of `take`; so a dying view only queues
its slot, and the next `take` frees it.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import mmap
import os
import threading
import weakref
from multiprocessing import resource_tracker
from typing import NamedTuple

import numpy as np

ALIGN = 64  # bytes: slots start on cache lines
SEGMENT_BYTES = 64 << 20
SHM_DIR = "/dev/shm"  # POSIX shared memory on Linux
_serial = itertools.count()


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Slot(NamedTuple):
    """`nbytes` bytes at `offset` of shared memory segment `segment` (its name).
    A tuple: one is made per image, on the loader's busiest thread."""

    segment: str
    offset: int
    nbytes: int


class _Segment:
    """One shared memory segment and its free ranges [start, end), sorted, coalesced.

    A file in /dev/shm mapped here; views are made with `np.frombuffer`, which
    holds the mapping (an export), so a released segment stays mapped until
    its last view is gone. Registered with multiprocessing's resource tracker,
    which unlinks it if this process dies without releasing it."""

    def __init__(self, nbytes: int):
        _check_room(nbytes)
        self.name = f"zephon-patches-{os.getpid()}-{next(_serial)}"
        fd = os.open(f"{SHM_DIR}/{self.name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self.map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        resource_tracker.register(f"/{self.name}", "shared_memory")
        self.size = nbytes
        self.starts = [0]
        self.ends = [nbytes]
        self.used = 0
        self.rover = 0  # where the next search starts (after the last slot taken)

    def take(self, n: int) -> int | None:
        """Next fit: the first free range of `n` bytes from where the last slot was
        taken on, wrapping round. Slots are freed roughly in the order they were
        taken, so the range after the last slot is mostly the free one, found at
        once instead of after every small hole before it."""
        count = len(self.starts)
        first = max(0, bisect.bisect(self.starts, self.rover) - 1)
        for k in range(count):
            i = (first + k) % count
            a, b = self.starts[i], self.ends[i]
            if b - a >= n:
                if b - a == n:
                    del self.starts[i], self.ends[i]
                else:
                    self.starts[i] = a + n
                self.used += n
                self.rover = a + n
                return a
        return None

    def give(self, a: int, n: int) -> None:
        b = a + n
        i = bisect.bisect(self.starts, a)
        if i > 0 and self.ends[i - 1] == a:  # joins the range before it
            i -= 1
            self.ends[i] = b
        else:
            self.starts.insert(i, a)
            self.ends.insert(i, b)
        if i + 1 < len(self.starts) and self.starts[i + 1] == self.ends[i]:  # and the one after
            self.ends[i] = self.ends.pop(i + 1)
            del self.starts[i + 1]
        self.used -= n

    def release(self) -> None:
        try:
            os.unlink(f"{SHM_DIR}/{self.name}")
        except FileNotFoundError:
            pass
        resource_tracker.unregister(f"/{self.name}", "shared_memory")
        try:
            self.map.close()
        except BufferError:  # views still held by batches: unmapped with the last one
            pass


def _check_room(nbytes: int) -> None:
    """Refuse a segment /dev/shm has no room for: touching its pages would kill the
    process with SIGBUS instead (containers often give /dev/shm 64 MiB)."""
    st = os.statvfs(SHM_DIR)
    free = st.f_bavail * st.f_frsize
    if free < nbytes:
        raise MemoryError(
            f"{SHM_DIR} has {free >> 20} MiB free; the image decode processes need "
            f"{nbytes >> 20} MiB more for decoded patches. Give it more room (docker "
            "--shm-size, or a larger tmpfs), lower [execution] lookahead_bytes, or set "
            "[execution] workers below 2 to decode in the loader's own memory"
        )


class PatchArena:
    """Slots of shared memory for decoded patches, and views that free them."""

    def __init__(self, segment_bytes: int = SEGMENT_BYTES):
        self.segment_bytes = segment_bytes
        self._segments: dict[str, _Segment] = {}
        self._lock = threading.Lock()
        self._dead: collections.deque[Slot] = collections.deque()  # slots of dead views
        self.closed = False
        # an arena dropped or left open at exit still unlinks its segments
        weakref.finalize(self, _release, self._segments)

    def take(self, nbytes: int) -> Slot:
        """A slot of `nbytes` (free it with `give`, or hand it to `view`)."""
        n = _aligned(max(nbytes, 1))
        with self._lock:
            if self.closed:
                raise RuntimeError("the patch arena is closed")
            self._free_dead()
            for name, seg in self._segments.items():
                at = seg.take(n)
                if at is not None:
                    return Slot(name, at, nbytes)
            seg = _Segment(max(self.segment_bytes, n))
            self._segments[seg.name] = seg
            at = seg.take(n)
            assert at is not None
            return Slot(seg.name, at, nbytes)

    def give(self, slot: Slot) -> None:
        """Free a slot no view was made of (a decode that failed or never ran)."""
        with self._lock:
            self._free(slot)

    def give_later(self, slot: Slot) -> None:
        """`give` from anywhere (a finalizer, another thread's callback): freed by the
        next `take`, as a dead view's slot."""
        self._dead.append(slot)

    def _free_dead(self) -> None:
        while self._dead:
            self._free(self._dead.popleft())

    def _free(self, slot: Slot) -> None:
        seg = self._segments.get(slot.segment)
        if seg is None:  # released by close
            return
        seg.give(slot.offset, _aligned(max(slot.nbytes, 1)))
        if seg.used == 0 and slot.segment != next(iter(self._segments)):
            del self._segments[slot.segment]
            seg.release()

    def view(self, slot: Slot) -> np.ndarray:
        """The slot's bytes as a uint8 array; the slot is freed when the array and
        every view made of it are gone."""
        with self._lock:
            seg = self._segments[slot.segment]
            arr = np.frombuffer(seg.map, np.uint8, slot.nbytes, slot.offset)
        weakref.finalize(arr, self._dead.append, slot)  # freed by the next take
        return arr

    def segment_names(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._segments)

    def used_bytes(self) -> int:
        """Bytes of slots taken and not freed (dead views' slots freed first)."""
        with self._lock:
            self._free_dead()
            return sum(s.used for s in self._segments.values())

    def close(self) -> None:
        """Unlink every segment; mappings still viewed by batches stay valid until
        those batches are dropped."""
        with self._lock:
            self.closed = True
            _release(self._segments)


def _release(segments: dict[str, _Segment]) -> None:
    for seg in list(segments.values()):
        seg.release()
    segments.clear()


class SegmentViews:
    """A decode process's side: writable views of slots, each segment mapped once
    (not registered with a resource tracker: the loader owns and unlinks it)."""

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}

    def view(self, slot: Slot) -> np.ndarray:
        m = self._maps.get(slot.segment)
        if m is None:
            fd = os.open(f"{SHM_DIR}/{slot.segment}", os.O_RDWR)
            try:
                m = self._maps[slot.segment] = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        return np.frombuffer(m, np.uint8, slot.nbytes, slot.offset)

    def forget(self, keep: frozenset[str]) -> None:
        """Unmap the segments not in `keep` (released by the loader)."""
        for name in [n for n in self._maps if n not in keep]:
            m = self._maps.pop(name)
            try:
                m.close()
            except BufferError:  # a view of it is still alive: unmapped with it
                pass
