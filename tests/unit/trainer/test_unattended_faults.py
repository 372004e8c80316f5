"""Faults of a run left alone (issue 30), tested without a training job: the restart
budget that renews, storage errors named and not retried, crash reports that start
with what was raised and where, a monitor thread that outlives its own errors, a lock
that never fails a finished run and says when its lease frees it, a stop at once on
any rank reported as a stop, loss spikes and divergence advice that goes back before
the trouble, and a relaunch that never resumes silently from a step not finite."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from harness.train import immutable
from torchtitan.components.checkpoint import CheckpointError, manifest
from torchtitan.components.divergence import DivergenceGuard
from torchtitan.runtime import agent, failure, launcher, preemption
from torchtitan.runtime.dump_lock import LOCK_FILE, DumpFolderLocked, DumpLock
from torchtitan.runtime.monitor import RankMonitor

# -- the restart budget --------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_restart_budget_forgets_failures_older_than_its_window():
    clock = Clock()
    budget = agent.RestartBudget(3, 3600, clock)
    words = []
    for at in (0, 600, 1200):  # three failures within the hour: all restarted
        clock.now = 1000 + at
        ok, text = budget.failure()
        assert ok
        words.append(text)
    assert words == [f"failure {n} of 3 in the last hour" for n in (1, 2, 3)]
    clock.now = 1000 + 1800  # a fourth within the hour: the job ends
    assert budget.failure() == (False, "failure 4 of 3 in the last hour")
    # A week-long job: one failure every 25 minutes is never more than 3 an hour.
    budget = agent.RestartBudget(3, 3600, clock)
    for k in range(7 * 24 * 60 // 25):
        clock.now = 1000 + k * 25 * 60
        assert budget.failure()[0], k
    assert agent.RestartBudget(2, 120, clock).failure()[1] == "failure 1 of 2 in the last 2 min"


def test_the_restart_window_is_validated(monkeypatch):
    monkeypatch.setenv(agent.WINDOW_ENV, "90")
    assert agent.window_from_env() == 90
    monkeypatch.delenv(agent.WINDOW_ENV)
    assert agent.window_from_env() == 3600
    for bad in ("0", "-5", "an hour"):
        monkeypatch.setenv(agent.WINDOW_ENV, bad)
        with pytest.raises(ValueError, match="RESTART_WINDOW in run_train.sh") as err:
            agent.window_from_env()
        assert repr(bad) in str(err.value)


# -- what a failure says, and its exit status ------------------------------------------------


def _raise_deep() -> None:
    def inner() -> None:
        raise RuntimeError("pair closed by peer\nsecond line")

    inner()


def test_a_crash_report_starts_with_the_exception_and_where_it_was_raised():
    try:
        _raise_deep()
    except RuntimeError as exc:
        kind, message = failure.describe(exc)
    first = message.splitlines()[0]
    assert kind == "crash"
    assert first.startswith("RuntimeError: pair closed by peer (raised at ")
    assert first.endswith(
        f"{Path(__file__).name}:{_raise_deep.__code__.co_firstlineno + 2} in inner)"
    )
    assert "Traceback (most recent call last)" in message  # the tail is still there


def _storage_failures() -> Iterator[tuple[BaseException, str]]:
    path = "/ckpt/step-6/__0_0.distcp"
    yield PermissionError(errno.EACCES, "Permission denied", path), "Permission denied"
    yield OSError(errno.EROFS, "Read-only file system", path), "Read-only file system"
    yield OSError(errno.ENOSPC, "No space left on device", path), "No space left on device"
    try:  # raised from inside another error, as a writer thread re-raises
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded", path)
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as exc:
        yield exc, "Disk quota exceeded"
    # torch.distributed.checkpoint wraps each rank's error with its traceback
    wrapped = PermissionError(errno.EPERM, "Operation not permitted", path)
    yield CheckpointException("save", {1: (wrapped, None)}), "Operation not permitted"


@pytest.mark.parametrize("case", range(5))
def test_storage_errors_name_the_path_and_are_input_errors(case):
    exc, what = list(_storage_failures())[case]
    kind, message = failure.describe(exc)
    assert (kind, failure.KINDS[kind]) == ("user", 2)  # exit 2: an elastic job does not retry
    assert message.startswith("storage: cannot write /ckpt/step-6/__0_0.distcp: ")
    assert what in message and "\n" not in message
    assert agent.no_restart_reason({2}, "/nonexistent") == "an input error (exit 2)"


def test_other_os_errors_stay_crashes():
    kind, _ = failure.describe(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
    assert kind == "crash"


# -- the monitor thread ------------------------------------------------------------------


def test_the_monitor_thread_outlives_errors_of_its_tick(caplog):
    calls = 0
    enough = threading.Event()

    def tick() -> None:  # fails three times (a read-only dump folder), then works
        nonlocal calls
        calls += 1
        if calls >= 6:
            enough.set()
        if calls <= 3:
            raise PermissionError(errno.EROFS, "Read-only file system", "/dump/LOCK.json")

    monitor = RankMonitor(dist.HashStore(), 0, 1, timeout_s=1.0, on_tick=tick)
    monitor.interval = 0.01
    with caplog.at_level(logging.WARNING, logger="torchtitan"):
        monitor.start()
        assert enough.wait(30), f"the monitor stopped ticking after {calls} calls"
        assert monitor._thread.is_alive()
        monitor.stop()
    said = [r.getMessage() for r in caplog.records if "monitor:" in r.getMessage()]
    assert len(said) == 2, said  # the error once, not once per tick; then its end
    assert "Read-only file system" in said[0] and "retrying" in said[0]
    assert said[1].startswith("rank 0: monitor: recovered from")


# -- the dump-folder lock -----------------------------------------------------------------


def test_a_lock_that_cannot_be_removed_never_fails_a_finished_run(tmp_path, caplog):
    lock = DumpLock(str(tmp_path))
    lock.acquire()
    with immutable(tmp_path), caplog.at_level(logging.WARNING, logger="torchtitan"):
        lock._renewed = 0.0  # due for renewal: the write fails, the monitor reports it
        errors = []
        for _ in range(2):  # the same words each time (no temporary file's name)
            with pytest.raises(OSError) as err:
                lock.renew()
            errors.append(str(err.value))
        assert errors[0] == errors[1]
        assert f"cannot renew the dump-folder lock {tmp_path / LOCK_FILE}" in errors[0]
        lock.release()  # must not raise
    assert not lock.held
    assert "could not remove the dump-folder lock" in caplog.text
    assert "takes it over once its lease (60s) has run out" in caplog.text
    assert (tmp_path / LOCK_FILE).exists()


def test_a_lock_held_on_another_host_says_when_its_lease_frees_it(tmp_path):
    holder = {
        "host": "node-b",
        "pid": 4,
        "started": "T",
        "renewed": time.time() - 15,
        "lease_s": 60,
    }
    (tmp_path / LOCK_FILE).write_text(json.dumps(holder))
    with pytest.raises(DumpFolderLocked) as err:
        DumpLock(str(tmp_path)).acquire()
    msg = str(err.value)
    assert "pid 4 on node-b" in msg and "Stop that job" in msg
    assert "lease frees the lock 60s after the holder's last renewal: 45s from now" in msg


# -- a stop at once on any rank -----------------------------------------------------------


def test_the_launcher_reports_a_ranks_stop_at_once_as_a_stop(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(preemption.EXIT_CODE_ENV, raising=False)
    # rank 1 got SIGTERM twice; rank 0 saw it go (its collective broke)
    once = {"rank": 1, "step": None, "reason": "second SIGTERM", "what": preemption.AT_ONCE}
    (tmp_path / "stopped-1.json").write_text(
        json.dumps({**once, "at_once": True, "original": True})
    )
    seen = {**once, "rank": 0, "reason": "rank 1 stopped at once (second SIGTERM)"}
    (tmp_path / "stopped-0.json").write_text(json.dumps({**seen, "at_once": True, "follows": 1}))
    # rank 2 saw its collective break and could not reach the store: a crash record
    crash = failure.record(2, "crash", "RuntimeError: Connection reset by peer")
    (tmp_path / "rank-2.json").write_text(json.dumps(crash))
    assert launcher.report_end(str(tmp_path), {}) == 3
    line = capsys.readouterr().err.strip()
    assert line.startswith("stopped (rank 1, second SIGTERM): stopped at once: no checkpoint")
    assert line.endswith("; exit 3 (run the same command again to resume)")
    assert agent.no_restart_reason({3, 1}, str(tmp_path)) is not None


def test_a_failure_outranks_the_stops_it_caused(tmp_path, monkeypatch, capsys):
    """Rank 0 cannot write its checkpoint (exit 2); torchrun's SIGTERM to rank 1 then
    looks like a stop request whose collective broke: a consequence, not the news,
    and no reason to keep an elastic job from restarting a crash."""
    monkeypatch.delenv(preemption.EXIT_CODE_ENV, raising=False)
    user = failure.record(0, "user", "storage: cannot write /d/checkpoint: PermissionError")
    (tmp_path / "rank-0.json").write_text(json.dumps(user))
    derived = {"rank": 1, "step": None, "reason": "SIGTERM, then the collective failed",
               "what": preemption.AT_ONCE, "at_once": True, "original": False}  # fmt: skip
    (tmp_path / "stopped-1.json").write_text(json.dumps(derived))
    assert launcher.report_end(str(tmp_path), {}) == 2
    assert capsys.readouterr().err.startswith("error: storage: cannot write /d/checkpoint")
    assert agent.no_restart_reason({1}, str(tmp_path)) is None  # a crash there: restart
    # rank 0 killed by the kernel (no record of its own): not a stop either
    (tmp_path / "rank-0.json").unlink()
    killed = {0: SimpleNamespace(exitcode=-9), 1: SimpleNamespace(exitcode=3)}
    assert launcher.report_end(str(tmp_path), killed) == 1
    assert "rank 0 killed by SIGKILL" in capsys.readouterr().err
    # every rank ended as a stop does: the stop is the news
    assert launcher.report_end(str(tmp_path), {1: SimpleNamespace(exitcode=3)}) == 3


def test_a_peers_stop_at_once_ends_a_rank_as_a_stop(tmp_path, monkeypatch):
    monkeypatch.setenv(failure.ERROR_DIR_ENV, str(tmp_path))
    exits: list[int] = []

    def exit_now(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    saved = {s: signal.getsignal(s) for s in preemption.STOP_SIGNALS}
    monitor = RankMonitor(None, 0, 2, timeout_s=0)
    try:
        monitor.stop_requests = preemption.StopRequests(rank=0)
        rec = failure.record(1, preemption.STOPPED_KIND, "second SIGTERM")
        with pytest.raises(SystemExit):
            monitor._exit_for(rec)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert exits == [3]
    [mine] = preemption.stop_records(str(tmp_path))
    assert mine["rank"] == 0 and mine["reason"] == "rank 1 stopped at once (second SIGTERM)"
    assert mine["follows"] == 1


# -- divergence: spikes, the advice, the relaunch ---------------------------------------------


def test_a_loss_spike_is_trouble_and_the_advice_goes_back_before_it():
    guard = DivergenceGuard(3, spike_factor=4.0, log=False)
    for step in range(1, 11):  # a healthy run: losses around 3
        assert guard.update_ok(step, 1.0, 3.0 + 0.01 * step)
    assert guard.update_ok(11, 1.0, 11.0)  # below 4 x the median (3.05): not a spike
    # lr far too high: step 12's update ruins the parameters; step 13's loss is finite
    assert not guard.update_ok(13, 50.0, 80.0)
    assert not guard.last_finite and guard.first_bad == 13 and guard.safe_below == 12
    assert not guard.update_ok(14, float("nan"), float("nan"))
    assert not guard.update_ok(15, 50.0, 70.0) and guard.should_stop()
    msg = str(guard.stop_error(15, (10, "/d/step-10", 3.1)))
    assert "trouble began at step 13 (loss spike: 80 > 4 x 3.06, the median of the last" in msg
    assert "The checkpoint of step 12, if any, holds the update that led to it" in msg
    assert "step 10 (/d/step-10, loss 3.1)" in msg
    # off: only non-finite values count
    off = DivergenceGuard(3, spike_factor=0.0, log=False)
    assert not off.tracks_loss
    assert all(off.update_ok(s, 1.0, 3.0) for s in range(1, 11)) and off.update_ok(11, 1.0, 80.0)


def test_a_spike_needs_a_history_first():
    guard = DivergenceGuard(3, spike_factor=4.0, log=False)
    # the first losses of a run fall fast; no median yet, no spike
    assert all(guard.update_ok(s, 1.0, loss) for s, loss in enumerate([9.0, 2.0, 8.0], 1))


def _manifests(folder: Path, finite: dict[int, bool], losses: dict[int, float]) -> None:
    for step, ok in finite.items():
        d = folder / f"step-{step}"
        d.mkdir(parents=True)
        (d / manifest.LOADER_FILE).write_text(json.dumps({"step": step}))
        files = manifest.file_entries(str(d), [manifest.LOADER_FILE])
        doc = manifest.manifest_document(step, 1, files, ok, losses.get(step))
        (d / manifest.COMPLETE_FILE).write_text(json.dumps(doc))


def test_a_relaunch_never_resumes_silently_from_a_step_marked_not_finite(tmp_path):
    _manifests(tmp_path, {1: True, 2: True, 3: False}, {2: 3.5})
    with pytest.raises(CheckpointError) as err:
        manifest.select_resume_step(str(tmp_path), -1, "size")
    msg = str(err.value)
    assert "the latest checkpoint, step 3, is marked not finite" in msg
    assert "the newest finite one is step 2: resume from it with --checkpoint.load_step 2" in msg
    assert "pass --checkpoint.load_step 3 to resume from it anyway" in msg
    assert manifest.select_resume_step(str(tmp_path), 3, "size") == 3  # the user's choice
    assert manifest.select_resume_step(str(tmp_path), 2, "size") == 2
    assert (
        manifest.step_loss(str(tmp_path), 2) == 3.5 and manifest.step_loss(str(tmp_path), 1) is None
    )


def test_a_requeued_job_takes_over_its_own_lock_on_another_host(tmp_path, monkeypatch):
    """A requeue gets a new rendezvous id (etcd keeps the old one closed) but keeps the
    scheduler's job id: the lock of its earlier launch, on another host with a fresh
    lease, is its own (another job is still refused)."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "slurm-77-1")
    monkeypatch.setenv("TORCHTITAN_JOB_ID", "slurm-77")
    old = {"host": "node-a", "pid": 1, "renewed": time.time(), "lease_s": 60,
           "run_id": "slurm-77-0", "job_id": "slurm-77"}  # fmt: skip
    (tmp_path / LOCK_FILE).write_text(json.dumps(old))
    taker = DumpLock(str(tmp_path))
    taker.acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["run_id"] == "slurm-77-1"
    taker.release()
    (tmp_path / LOCK_FILE).write_text(json.dumps({**old, "job_id": "slurm-78"}))
    with pytest.raises(DumpFolderLocked, match="pid 1 on node-a"):
        DumpLock(str(tmp_path)).acquire()


def test_a_rank_killed_from_outside_is_named_as_the_cause(monkeypatch):
    """No record from any rank: the one killed by a signal is the cause, the others
    (exit 128 + SIGTERM: the launcher's stop) stopped with it; under replica groups
    the group leaves. A crash of another kind keeps the generic line."""
    monkeypatch.delenv("FT_REPLICA_ID", raising=False)
    lost = {0: SimpleNamespace(exitcode=143), 1: SimpleNamespace(exitcode=-signal.SIGKILL)}
    assert launcher.lost_ranks_line(lost) == (
        "no rank reported an error (rank 0 stopped by the launcher, rank 1 killed by SIGKILL): "
        "a process was killed from outside the job (an operator, the out-of-memory killer) "
        "and the others were stopped after it"
    )
    monkeypatch.setenv("FT_REPLICA_ID", "1")
    assert launcher.lost_ranks_line(lost).endswith(
        "; replica group 1 left the job (run it again to rejoin)"
    )
    crashed = {0: SimpleNamespace(exitcode=1), 1: SimpleNamespace(exitcode=-signal.SIGKILL)}
    assert launcher.lost_ranks_line(crashed) == (
        "the job failed without a message from a rank (rank 0 exit 1, rank 1 killed by "
        "SIGKILL); see the log above"
    )


def test_the_agent_marks_its_folder_before_torchrun_stops_the_other_workers(tmp_path):
    """torchrun's process context signals the surviving workers itself when one fails;
    the mark must be there first, so a rank does not take it for a preemption."""
    mark = tmp_path / preemption.AGENT_STOPPING
    seen: list[bool] = []
    context = SimpleNamespace(close=lambda *a, **k: seen.append(mark.exists()))
    agent.mark_before_close(context, str(mark))
    context.close(signal.SIGTERM)
    assert seen == [True]
