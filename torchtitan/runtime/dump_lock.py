"""One writer per dump folder: `<dump>/LOCK.json`, held by global rank 0's trainer.

The lock names its holder (host, pid, process start time, job start, the
rendezvous run id) and a lease renewed every few seconds. A second job is
refused with the holder's name while the holder lives: on the same host the pid
must still run with the same start time; on another host the lease must be
fresh. A dead holder's lock is taken over (with a warning). A holder with this
job's own id (`TORCHTITAN_JOB_ID`, the scheduler's job id that run_train.sh
exports, which a requeue keeps; else the rendezvous run id `TORCHELASTIC_RUN_ID`)
is an earlier attempt of the same job, before an elastic restart or a requeue: the new rank 0, on whatever host, takes it over
at once, and the old holder stops renewing a lock that is no longer its own.

Renewal errors (a dump folder made read-only) propagate to the monitor thread,
which reports them and retries; `release` never raises: a run that finished and
saved must not be turned into a failure by the lock file it leaves behind (its
lease lets the next job take it over).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

from torchtitan.components.checkpoint import CheckpointError
from zephon import atomic_write

logger = logging.getLogger("torchtitan")

LOCK_FILE = "LOCK.json"
JOB_ID_ENV = "TORCHTITAN_JOB_ID"
LEASE_S = 60.0


class DumpFolderLocked(CheckpointError):
    """Another live job writes into this dump folder."""


def _proc_start(pid: int) -> str | None:
    """Start time of a process (clock ticks since boot), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive_here(holder: dict[str, Any]) -> bool:
    pid = int(holder.get("pid", -1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    start = _proc_start(pid)
    return start is None or holder.get("proc_start") in (None, start)


class DumpLock:
    def __init__(self, dump_folder: str):
        self.path = os.path.join(dump_folder, LOCK_FILE)
        self.me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "proc_start": _proc_start(os.getpid()),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
            # The job across its launches (a requeue gets a new rendezvous id): run_train.sh
            "job_id": os.environ.get(JOB_ID_ENV) or os.environ.get("TORCHELASTIC_RUN_ID"),
        }
        self.held = False
        self._renewed = 0.0

    def _doc(self) -> str:
        return json.dumps({**self.me, "renewed": time.time(), "lease_s": LEASE_S})

    def _read(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # half-written or garbage: treated as a dead holder

    def _same_job(self, holder: dict[str, Any]) -> bool:
        mine = self.me["job_id"]
        return bool(mine) and holder.get("job_id", holder.get("run_id")) == mine

    def _holder_alive(self, holder: dict[str, Any]) -> bool:
        if not holder or self._same_job(holder):
            return False
        if holder.get("host") == self.me["host"]:
            return _alive_here(holder)
        return time.time() - float(holder.get("renewed", 0)) < float(holder.get("lease_s", LEASE_S))

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = self._read()
                if holder is None:
                    continue  # released meanwhile: try again
                if self._holder_alive(holder):
                    raise DumpFolderLocked(self._refusal(holder)) from None
                whose = (
                    f"an earlier attempt of this job (job {self.me['job_id']})"
                    if self._same_job(holder)
                    else "a job that is gone"
                )
                logger.warning(
                    f"taking over {self.path} from {whose} (pid {holder.get('pid')} "
                    f"on {holder.get('host')}, started {holder.get('started')})"
                )
                # Rename away, then create exclusively: of two jobs taking over at
                # once, only one wins the create.
                try:
                    os.replace(self.path, f"{self.path}.stale-{os.getpid()}")
                    os.remove(f"{self.path}.stale-{os.getpid()}")
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self._doc())
            self.held, self._renewed = True, time.time()
            return
        raise DumpFolderLocked(f"{self.path}: could not take the lock (another job races for it)")

    def _refusal(self, holder: dict[str, Any]) -> str:
        """Who holds the folder, and what frees it."""
        msg = (
            f"{os.path.dirname(self.path)} is in use by another job: pid {holder.get('pid')} "
            f"on {holder.get('host')}, started {holder.get('started')} ({self.path}). Stop "
            "that job or choose another --job.dump_folder"
        )
        if holder.get("host") == self.me["host"]:
            return msg + " (the lock frees when that process ends)"
        lease = float(holder.get("lease_s", LEASE_S))
        left = max(0.0, lease - (time.time() - float(holder.get("renewed", 0))))
        return msg + (
            f". Its lease frees the lock {lease:.0f}s after the holder's last renewal: "
            f"{left:.0f}s from now if that job is already gone"
        )

    def _mine(self, holder: dict[str, Any] | None) -> bool:
        return (
            bool(holder)
            and holder.get("pid") == self.me["pid"]
            and holder.get("host") == self.me["host"]
        )

    def renew(self) -> None:
        """Refresh the lease (cheap; called from the monitor thread); a lock taken
        over by a later attempt of this job is left to it."""
        if not self.held or time.time() - self._renewed < LEASE_S / 6:
            return
        if not self._mine(self._read()):
            self.held = False
            return
        try:
            atomic_write(self.path, self._doc())
        except OSError as exc:  # the same words every time: the monitor reports it once
            raise OSError(
                exc.errno, f"cannot renew the dump-folder lock {self.path}: {exc.strerror}"
            ) from exc
        self._renewed = time.time()

    def release(self) -> None:
        """Remove the lock if it is still ours; an error is logged, never raised."""
        if not self.held:
            return
        self.held = False
        try:
            if self._mine(self._read()):
                os.remove(self.path)
        except OSError as exc:
            logger.warning(
                f"could not remove the dump-folder lock {self.path} ({exc}); the next job "
                f"takes it over once its lease ({LEASE_S:.0f}s) has run out"
            )
