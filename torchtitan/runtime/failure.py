"""Reporting why a rank stops, once, wherever it happened.

A failing rank writes one record: to the launcher's error folder on its node
(`TORCHTITAN_ERROR_DIR`, set by torchtitan.runtime.launcher) and to the
rendezvous store, where every other rank's monitor sees it within a second
and exits at once instead of waiting in a collective. The launcher prints the
record and exits 2 for the user's input, 1 for anything else. Without the
launcher (plain torchrun) the failing rank prints its message itself.

Storage that refuses a write (permission, a read-only file system, a full disk
or quota) is the user's to fix, like a bad config: one line naming the path
and the OS error, exit 2, so an elastic job does not retry into the same wall.
A crash keeps the end of its traceback, after a first line that names the
exception and the file and line that raised it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
import traceback
from typing import Any

from torchtitan.components.checkpoint import CheckpointError
from torchtitan.components.divergence import TrainingDiverged
from torchtitan.config.job_config import ConfigError
from zephon import DataError, ZephonError, atomic_write

ERROR_DIR_ENV = "TORCHTITAN_ERROR_DIR"
# Input errors: exit 2, and an elastic launch does not retry them (agent.py).
USER_ERRORS: tuple[type[BaseException], ...] = (
    ZephonError,
    ConfigError,
    CheckpointError,
    TrainingDiverged,
)
EXIT_USER, EXIT_CRASH = 2, 1
KINDS = {"user": EXIT_USER, "crash": EXIT_CRASH, "hang": EXIT_CRASH, "orphan": EXIT_CRASH}

# OS errors that only the operator can fix: retrying the job fails the same way.
STORAGE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}
TRACEBACK_LINES = 30

DATA_HINT = (
    "\n(list every bad record with `zephon validate --scan RECIPE`; skip them with "
    'bad_records = "drop" in the recipe\'s [recipe] table)'
)


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc`, what it was raised from, and the per-rank errors of a distributed
    checkpoint's failure (torch.distributed.checkpoint wraps them)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        for value in (getattr(e, "failures", None) or {}).values():
            # DCP's CheckpointException: {rank: exception or (exception, traceback)}
            inner = value[0] if isinstance(value, tuple) and value else value
            if isinstance(inner, BaseException):
                todo.append(inner)
    return seen


def storage_error(exc: BaseException) -> OSError | None:
    """The OS error behind `exc` that only the operator can fix, or None."""
    for e in _causes(exc):
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return e
    return None


def storage_message(err: OSError) -> str:
    """`cannot write PATH: [Errno 13] Permission denied`, with what to do."""
    path = err.filename if err.filename is not None else "a file"
    what = f"{type(err).__name__}: [Errno {err.errno}] {err.strerror or os.strerror(err.errno)}"
    return (
        f"storage: cannot write {path}: {what}. Make the folder writable (or free space) "
        "and run the same command again; the newest complete checkpoint is the resume point"
    )


def raised_at(exc: BaseException) -> str:
    """`Type: message (raised at file:line in function)`: a crash's first line."""
    head = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return head
    last = frames[-1]
    return f"{head} (raised at {last.filename}:{last.lineno} in {last.name})"


def describe(exc: BaseException) -> tuple[str, str]:
    """(kind, message) of an exception that ends a rank."""
    if isinstance(exc, USER_ERRORS):
        msg = str(exc) + (DATA_HINT if isinstance(exc, DataError) else "")
        return "user", msg
    err = storage_error(exc)
    if err is not None:
        return "user", storage_message(err)
    tb = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return "crash", "\n".join([raised_at(exc), *tb[-TRACEBACK_LINES:]])


def record(rank: int, kind: str, message: str) -> dict[str, Any]:
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "kind": kind,
        "message": message,
        "time": time.time(),
    }


def write_record(rec: dict[str, Any], name: str | None = None) -> bool:
    """Into the launcher's error folder on this node; False without a launcher."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder or not os.path.isdir(folder):
        return False
    path = os.path.join(folder, name or f"rank-{rec['rank']}.json")
    atomic_write(path, json.dumps(rec))
    return True


def recorded_here(rec: dict[str, Any]) -> bool:
    """Whether this node's launcher already has the failing rank's own record (the
    rank ran on this node), or there is no launcher to tell."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder or not os.path.isdir(folder):
        return True
    return os.path.exists(os.path.join(folder, f"rank-{rec['rank']}.json"))


def format_record(rec: dict[str, Any], summary: bool = False) -> str:
    """`error: MESSAGE`, naming the rank unless it is rank 0 on this node."""
    tags = [] if rec["rank"] == 0 and not summary else [f"rank {rec['rank']}"]
    if summary:
        tags.append(f"host {rec['host']}")
    if rec["kind"] != "user":
        tags.append(rec["kind"])
    return f"error{' (' + ', '.join(tags) + ')' if tags else ''}: {rec['message']}"


def report(rank: int, kind: str, message: str, monitor: Any = None, say_here: bool = True) -> int:
    """Record a failure of this rank; returns the exit code to use. Without a
    launcher the message is printed here, if `say_here` and no peer published it."""
    rec = record(rank, kind, message)
    wrote = write_record(rec)  # before publishing: peers exit as soon as they see it
    first = monitor.publish_failure(rec) if monitor is not None else True
    if not wrote and first and say_here:
        # No launcher to print it: say it here, once for the whole job.
        print(format_record(rec), file=sys.stderr, flush=True)
    return KINDS.get(kind, EXIT_CRASH)
