"""Reporting why a rank stops, once, wherever it happened.

A failing rank writes one record: to the launcher's error folder on its node
(`TORCHTITAN_ERROR_DIR`, set by torchtitan.runtime.launcher) and to the
rendezvous store, where every other rank's monitor sees it within a second
and exits at once instead of waiting in a collective. The launcher prints the
record and exits 2 for the user's input, 1 for anything else. Without the
launcher (plain torchrun) the failing rank prints its message itself.
"""

from __future__ import annotations

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
from zephon.errors import DataError, ZephonError
from zephon.files import atomic_write

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

DATA_HINT = (
    "\n(list every bad record with `zephon validate --scan RECIPE`; skip them with "
    'bad_records = "drop" in the recipe\'s [recipe] table)'
)


def describe(exc: BaseException) -> tuple[str, str]:
    """(kind, message) of an exception that ends a rank."""
    if isinstance(exc, USER_ERRORS):
        msg = str(exc) + (DATA_HINT if isinstance(exc, DataError) else "")
        return "user", msg
    tb = "".join(traceback.format_exception(exc)).rstrip()
    return "crash", "\n".join(tb.splitlines()[-30:])


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


def format_record(rec: dict[str, Any], summary: bool = False) -> str:
    """`error: MESSAGE`, naming the rank unless it is rank 0 on this node."""
    tags = [] if rec["rank"] == 0 and not summary else [f"rank {rec['rank']}"]
    if summary:
        tags.append(f"host {rec['host']}")
    if rec["kind"] != "user":
        tags.append(rec["kind"])
    return f"error{' (' + ', '.join(tags) + ')' if tags else ''}: {rec['message']}"


def report(rank: int, kind: str, message: str, monitor: Any = None) -> int:
    """Record a failure of this rank; returns the exit code to use."""
    rec = record(rank, kind, message)
    wrote = write_record(rec)  # before publishing: peers exit as soon as they see it
    first = monitor.publish_failure(rec) if monitor is not None else True
    if not wrote and first:
        # No launcher to print it: say it here, once for the whole job.
        print(format_record(rec), file=sys.stderr, flush=True)
    return KINDS.get(kind, EXIT_CRASH)
