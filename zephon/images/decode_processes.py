"""Image work in processes of its own: decode, resize and patches where the loader's
Python cannot hold them up.

Pillow releases the GIL while it decodes and resizes, but everything around
it (opening the header, the numpy calls, returning to Python between chunks)
needs the GIL, and so do the loader's reading, planning, packing and
assembling. On a few cores, decode threads then wait on the loader's Python and
the cores idle. A decode process has an interpreter of its own.

What crosses: a task is a few documents' encoded images (bytes, as read) with
a slot of shared memory each (images/shared_patches.py), sized from the header
when the call was planned; the process writes each image's patches into its
slot and sends back only grid, token count and digest (or the document's
first ImageError), plus the CPU it spent. Pixels are written once, by the
decoder, into the memory the batch hands the model.

Bytes do not depend on the process: the same Pillow, the same calls
(images/prepare.py), the same single-threaded integer arithmetic as in a
thread (images/pixels/decode.py).

The processes are plain `python -m zephon.images.decode_processes` children
talking pickles over their stdin and stdout, a sending and a taking thread
each in the loader, two tasks in each pipe (`DEPTH`). Not multiprocessing:
its "spawn" re-imports the launching program's main module in every child
(the whole trainer, seconds and hundreds of MB), and "fork" copies the locks
of the loader's threads. They import only numpy,
Pillow and zephon, are shared by every loader of the process with the same
count (tests and the benchmark build many loaders), ignore SIGINT and SIGTERM
(a stop is the loader's to handle; they run in a session of their own) and
end when the loader's process does (end of their stdin). One that dies
(killed, out of memory) fails its task with a message that says so.
"""

from __future__ import annotations

import collections
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from zephon.errors import ImageError
from zephon.images.shared_patches import SegmentViews, Slot


@dataclass(frozen=True)
class Task:
    """Documents to decode: per document, (encoded bytes, record name, slot) per image."""

    spec: Any  # ImageSpec
    docs: list[list[tuple[bytes, str, Slot]]]
    live: frozenset[str]  # the arena's segments now (others may be unmapped)


# Per document: (grid, num_tokens) per image, or its first bad image's error.
DocResult = list[tuple[tuple[int, int], int]] | ImageError
TaskResult = tuple[list[DocResult], int]  # and the CPU ns the process spent on the task


def decode_task(task: Task, views: SegmentViews) -> TaskResult:
    """Every image of every document of the task into its slot (in a decode process)."""
    from zephon.images.prepare import prepare_image

    cpu0 = time.process_time_ns()
    views.forget(task.live)
    out: list[DocResult] = []
    for doc in task.docs:
        images: DocResult = []
        for data, name, slot in doc:
            try:
                p = prepare_image(data, name, task.spec, out=views.view(slot))
            except ImageError as exc:
                images = exc
                break
            images.append((p.grid, p.num_tokens))
        out.append(images)
    return out, time.process_time_ns() - cpu0


# -- framing: a length, then a pickle ---------------------------------------------------

_LEN = struct.Struct("<Q")


def _send(pipe: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_LEN.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _receive(pipe: BinaryIO) -> Any:
    head = pipe.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    (n,) = _LEN.unpack(head)
    data = pipe.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


def serve() -> None:
    """A decode process's loop: tasks in on stdin, results out on stdout, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tasks, results = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the results
    views = SegmentViews()
    while True:
        try:
            task = _receive(tasks)
        except EOFError:
            return
        try:
            out: Any = decode_task(task, views)
        except Exception as exc:  # anything but a bad image: the loader raises it
            out = RuntimeError(f"zephon image decode process: {type(exc).__name__}: {exc}")
        try:
            _send(results, out)
        except BrokenPipeError:
            return


# -- the loader's side ------------------------------------------------------------------

# Tasks in a decode process's pipe at once. The loader's threads that feed the
# pipes need its GIL, which its other threads may hold for a switch interval
# (5 ms) at a time: with one task in flight, a process idles from the end of
# each task until its feeder runs again. With two, the next task is already in
# its pipe, so the feeder has a whole task's time to send another.
DEPTH = 2


# glibc's malloc in a decode process, as set through its environment. By default
# it hands the freed buffers of one image back to the kernel (trimming the heap
# top, unmapping large blocks), so the next image's buffers are fresh pages: on
# the web scenes, 220 page faults and 5.2 ms of CPU an image in one decode
# process, against 17 and 4.7 ms with buffers up to 32 MiB taken from the heap
# and up to 64 MiB of it kept free for the next image
# (benchmarks/bench_image_work.py).
MALLOC_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
# A decode process does no linear algebra, but importing numpy starts OpenBLAS's
# thread pool, one thread a core: 0.29 s of CPU to start a process against 0.18
# with one thread (hand-timed), taken from the cores while the first batch waits.
THREAD_SETTINGS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class DecodeProcesses:
    """`count` decode processes, a thread sending each its tasks and one taking its
    results (in order: a process decodes its tasks one after another);
    `submit` returns a Future."""

    def __init__(self, count: int):
        self._tasks = _TaskQueue()
        self._procs: list[subprocess.Popen[bytes]] = []
        self.broken: str | None = None
        self._closed = False
        self._lock = threading.Lock()  # broken, and what is queued when it breaks
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # where `zephon` is importable from
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        for name, value in {**MALLOC_SETTINGS, **THREAD_SETTINGS}.items():
            env.setdefault(name, value)  # the user's own settings win
        for i in range(count):
            proc = subprocess.Popen(
                [sys.executable, "-m", "zephon.images.decode_processes"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
            self._procs.append(proc)
            sent: collections.deque[Future[TaskResult]] = collections.deque()
            room: queue.SimpleQueue[None] = queue.SimpleQueue()  # a token per free place
            for _ in range(DEPTH):
                room.put(None)
            for target, role in ((self._send, "send"), (self._take, "take")):
                t = threading.Thread(
                    target=target, args=(proc, sent, room), name=f"zephon-{role}-{i}"
                )
                t.daemon = True
                t.start()

    def hurry(self, futures: list[Future[TaskResult]]) -> None:
        """A step needs these tasks: those still queued go first, in their order."""
        self._tasks.hurry(futures)

    def submit(self, task: Task) -> Future[TaskResult]:
        future: Future[TaskResult] = Future()
        with self._lock:
            if self.broken is None:
                self._tasks.put((task, future))
                return future
        future.set_exception(RuntimeError(self.broken))
        return future

    def _send(
        self,
        proc: subprocess.Popen[bytes],
        sent: collections.deque[Future[TaskResult]],
        room: queue.SimpleQueue[None],
    ) -> None:
        """Tasks into the process's pipe, at most DEPTH not yet answered."""
        assert proc.stdin is not None
        try:
            while True:
                room.get()  # before taking a task: a full process leaves it to another
                item = self._tasks.get()
                if item is None:
                    return
                task, future = item
                if not future.set_running_or_notify_cancel():  # cancelled while queued
                    room.put(None)
                    continue
                sent.append(future)  # before the send: the answer may come at once
                try:
                    _send(proc.stdin, task)
                except OSError:  # the process is gone
                    self._died(proc, sent)
                    return
        finally:
            try:
                proc.stdin.close()  # the process ends at the end of its input
            except OSError:
                pass

    def _take(
        self,
        proc: subprocess.Popen[bytes],
        sent: collections.deque[Future[TaskResult]],
        room: queue.SimpleQueue[None],
    ) -> None:
        """The process's answers, to the futures of its tasks in the order sent."""
        assert proc.stdout is not None
        while True:
            try:
                out = _receive(proc.stdout)
            except (EOFError, OSError):
                if sent or not self._closed:  # a close ends it with every task answered
                    self._died(proc, sent)
                return
            future = sent.popleft()
            room.put(None)
            if isinstance(out, Exception):
                future.set_exception(out)
            else:
                future.set_result(out)

    def _died(
        self, proc: subprocess.Popen[bytes], sent: collections.deque[Future[TaskResult]]
    ) -> None:
        """A process is gone: fail its tasks and every queued one, and later submits."""
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        failed = []
        with self._lock:
            if self.broken is None:
                self.broken = (
                    f"a zephon image decode process (pid {proc.pid}) died"
                    f"{f' with status {code}' if code is not None else ''} "
                    "(killed, or out of memory?); the loader cannot go on without it"
                )
            while True:  # the loader cannot go on: nothing queued waits forever
                try:
                    item = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    failed.append(item[1])
                else:
                    self._tasks.put(None)  # a close's: still ends a sender
                    break
            while sent:
                failed.append(sent.popleft())
        for future in failed:
            if not future.done():
                future.set_exception(RuntimeError(self.broken))

    def close(self) -> None:
        """End the processes once the tasks already submitted are done."""
        self._closed = True
        for _ in self._procs:
            self._tasks.put(None)


class _TaskQueue:
    """The tasks not yet sent, in order, save those a step waits on (`hurry`): a
    SimpleQueue whose items can move ahead (None: a sender's end). Hurried tasks
    go first, in the order they were hurried: a step packed while the one before
    it waits for its pixels (batch_production.py) queues its tasks behind that
    step's, not in front of them."""

    def __init__(self) -> None:
        self._items: collections.deque[tuple[Task, Future[TaskResult]] | None] = collections.deque()
        self._hurried = 0  # the first items of the queue are hurried ones
        self._ready = threading.Condition()

    def put(self, item: tuple[Task, Future[TaskResult]] | None) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify()

    def get(self) -> tuple[Task, Future[TaskResult]] | None:
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._pop()

    def get_nowait(self) -> tuple[Task, Future[TaskResult]] | None:
        with self._ready:
            if not self._items:
                raise queue.Empty
            return self._pop()

    def _pop(self) -> tuple[Task, Future[TaskResult]] | None:
        self._hurried = max(0, self._hurried - 1)
        return self._items.popleft()

    def hurry(self, futures: list[Future[TaskResult]]) -> None:
        wanted = {id(f) for f in futures}
        with self._ready:
            items = list(self._items)
            before, rest = items[: self._hurried], items[self._hurried :]
            moved = [x for x in rest if x is not None and id(x[1]) in wanted]
            if moved:
                rest = [x for x in rest if x is None or id(x[1]) not in wanted]
                self._items = collections.deque(before + moved + rest)
                self._hurried += len(moved)


_pools: dict[int, DecodeProcesses] = {}
_pools_lock = threading.Lock()


def decode_processes(count: int) -> DecodeProcesses:
    """The process's shared `count` decode processes (started on first use; started
    again if one died)."""
    with _pools_lock:
        pool = _pools.get(count)
        if pool is None or pool.broken is not None:
            if pool is not None:
                pool.close()  # its other processes end with their stdin
            pool = _pools[count] = DecodeProcesses(count)
        return pool


if __name__ == "__main__":
    serve()
