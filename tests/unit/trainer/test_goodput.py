"""The goodput ledger's arithmetic (torchtitan/components/goodput.py) on ledgers
written by its own appender with a driven clock: which seconds are productive,
which steps were redone, how overlapping replica groups and the gaps between
attempts count, and what the reader says of a ledger a crash cut short. The
trainer's own ledgers are checked end to end in integration/test_train_goodput.py."""

from __future__ import annotations

import json
import os

import pytest

from scripts.tools.goodput import main as goodput_cli
from torchtitan.components.goodput import (
    FOLDER,
    Ledger,
    Report,
    ledger_path,
    read_ledgers,
    summarize,
)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def _steps(ledger: Ledger, clock: Clock, steps: range, committed: bool = True) -> None:
    """Each step: 0.1 s quorum, 0.2 s data, 1.0 s compute, then 0.05 s between steps."""
    for s in steps:
        ledger.open_step(s)
        clock.advance(0.1)
        ledger.mark()
        clock.advance(0.2)
        ledger.mark()
        clock.advance(1.0)
        ledger.close_step(s, committed)
        clock.advance(0.05)


def _attempt(folder: str, start: float, group: int | None = None) -> tuple[Ledger, Clock]:
    clock = Clock(start + 2.0)  # 2 s of startup
    return Ledger(ledger_path(folder, group), start, group, clock=clock), clock


def test_a_crash_and_a_resume_count_the_redone_steps_and_the_gap(tmp_path):
    folder = str(tmp_path)
    a, clock = _attempt(folder, 100.0)
    _steps(a, clock, range(1, 3))  # steps 1, 2
    with a.span("checkpoint_save", 2):
        clock.advance(0.5)
    _steps(a, clock, range(3, 5))  # steps 3, 4: the crash comes before a save
    crash = clock.t  # no end record: killed
    b, clock = _attempt(folder, crash + 7.0)  # relaunched 7 s later
    with b.span("checkpoint_restore", 2):
        clock.advance(0.4)
    _steps(b, clock, range(3, 6))  # 3 and 4 again, then 5
    b.end(0)

    s = summarize(folder)
    assert s.attempts == 2 and s.steps_committed == 5 and s.steps_redone == 2
    assert s.productive_seconds == pytest.approx(5 * 1.0)
    bad = s.badput_seconds
    assert bad["steps_redone"] == pytest.approx(2 * 1.0)
    assert bad["recovery"] == pytest.approx(7 * 0.1)
    assert bad["data_wait"] == pytest.approx(7 * 0.2)
    assert bad["checkpoint_save"] == pytest.approx(0.5)
    assert bad["checkpoint_restore"] == pytest.approx(0.4)
    assert bad["startup"] == pytest.approx(2.0 + 2.0)  # the restore is not startup
    assert bad["between_attempts"] == pytest.approx(0.05 + 7.0)  # from its last record
    assert s.job_seconds == pytest.approx(s.productive_seconds + sum(bad.values()))
    assert s.job_seconds == pytest.approx(clock.t - 100.0)
    assert any("no end record" in n for n in s.notes)


def test_two_groups_training_together_count_each_second_once(tmp_path):
    """Group 1 is lost after step 3 and comes back (copying from group 0) for step 6:
    the job is productive whenever either group trains a step that counts."""
    folder = str(tmp_path)
    g0, c0 = _attempt(folder, 0.0, group=0)
    g1, c1 = _attempt(folder, 0.0, group=1)
    _steps(g0, c0, range(1, 4))
    _steps(g1, c1, range(1, 4))
    # Group 0's step 4 fails (its peer is gone) after a 5 s timeout, then is made again.
    g0.open_step(4)
    c0.advance(0.1)
    g0.mark()
    c0.advance(0.2)
    g0.mark()
    c0.advance(5.0)
    g0.close_step(4, committed=False)
    _steps(g0, c0, range(4, 7))
    g2, c2 = _attempt(folder, c0.t - 3 * 1.35 - 3.0, group=1)  # group 1 again
    c2.t = c0.t - 1.35
    _steps(g2, c2, range(6, 7))  # trained with group 0's step 6
    for g in (g0, g1, g2):
        g.end(0)

    s = summarize(folder)
    assert s.attempts == 3 and s.groups == [0, 1]
    assert s.steps_committed == 6 and s.steps_redone == 1  # the failed step only
    assert s.productive_seconds == pytest.approx(6 * 1.0)
    assert s.badput_seconds["steps_redone"] == pytest.approx(5.0)
    assert s.badput_seconds["between_attempts"] == 0.0  # a group was always there
    assert s.job_seconds == pytest.approx(s.productive_seconds + sum(s.badput_seconds.values()))


def test_a_ledger_cut_short_is_read_as_far_as_it_goes(tmp_path, capsys):
    folder = str(tmp_path)
    a, clock = _attempt(folder, 0.0)
    _steps(a, clock, range(1, 4))
    a.end(0)
    path = ledger_path(folder, None)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"a": "x", "format": 7, "start": 50.0}) + "\n")
        f.write('{"a": "y", "step": 9, "t": [1.0, 2.')  # a crash mid-line
    attempts, notes = read_ledgers(folder)
    assert [len(a.steps) for a in attempts] == [3]
    assert notes == [
        f"{FOLDER}/ledger.jsonl line 6: ledger format 7, this version reads 1; ignored",
        f"{FOLDER}/ledger.jsonl line 7: cut short (the process stopped while writing it); ignored",
    ]
    assert goodput_cli([folder]) == 0
    out = capsys.readouterr().out
    assert "steps: 3 kept" in out and "line 7: cut short" in out


def test_the_command_names_a_folder_without_a_ledger(tmp_path, capsys):
    assert goodput_cli([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path}/{FOLDER}: no goodput ledger (the trainer writes one in "
                   "every run's dump folder)"]  # fmt: skip
    with open(os.path.join(tmp_path, "goodput.json"), "w", encoding="utf-8") as f:
        json.dump({"format": 0, "job_seconds": 12.5, "badput_seconds": {"x": 1}}, f)
    assert goodput_cli([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "format 0, this version writes 1" in out
    assert "job_seconds: 12.5" in out and "productive_seconds: missing" in out


@pytest.mark.parametrize("code", [0, 1])
def test_a_step_open_when_the_attempt_fails_counts_as_redone(tmp_path, code):
    """A failure inside a step (a peer lost, a stop from outside, whatever the exit
    status): the step's time so far did not commit. A step dropped first (the data
    ran out: it is never trained) leaves no record."""
    folder = str(tmp_path)
    a, clock = _attempt(folder, 0.0)
    _steps(a, clock, range(1, 3))
    a.open_step(3)
    clock.advance(0.1)
    a.mark()
    clock.advance(0.2)
    a.mark()
    clock.advance(4.0)  # its collectives wait for a lost peer, until the end
    if code == 0:
        a.drop_step()
    a.end(code)
    s = summarize(folder)
    assert s.steps_committed == 2 and s.steps_redone == (1 if code else 0)
    assert s.badput_seconds["steps_redone"] == pytest.approx(4.0 if code else 0.0)
    assert s.badput_seconds["other"] == pytest.approx(2 * 0.05 + (0 if code else 4.3))


@pytest.mark.parametrize("where", ["save", "step"])
def test_a_failed_attempts_teardown_is_recovery(tmp_path, where):
    """A peer lost during a save (or a step): the collective raises, then the rank
    waits for the peer's report and stops its loader before its end record. That
    teardown is the failure's recovery, not unexplained time; a step open at the
    failure is redone up to the failure only."""
    folder = str(tmp_path)
    a, clock = _attempt(folder, 0.0)
    _steps(a, clock, range(1, 3))
    if where == "save":
        with pytest.raises(RuntimeError), a.span("checkpoint_save", 2):
            clock.advance(1.5)  # the save's collective waits for the lost peer, then breaks
            raise RuntimeError("Connection closed by peer")
    else:
        a.open_step(3)
        clock.advance(0.3)
        a.mark()
        a.mark()
        clock.advance(1.5)
    a.failed()
    clock.advance(6.0)  # the peer's report awaited, the loader stopped
    a.failed()  # (a second call changes nothing)
    a.end(1)
    s = summarize(folder)
    bad = s.badput_seconds
    assert bad["recovery"] == pytest.approx(2 * 0.1 + 6.0 + (0.3 if where == "step" else 0.0))
    assert bad["checkpoint_save"] == pytest.approx(1.5 if where == "save" else 0.0)
    assert bad["steps_redone"] == pytest.approx(1.5 if where == "step" else 0.0)
    assert bad["other"] == pytest.approx(2 * 0.05)  # only the bookkeeping between steps
    assert s.steps_redone == (1 if where == "step" else 0)


def test_the_report_of_a_running_job_is_made_aside_and_ignores_the_line_being_written(tmp_path):
    """At a checkpoint goodput.json is made on a thread of its own while the run goes
    on; the attempt still running has no end yet and its last line may be half
    written: neither is a note. At the end it is made at once."""
    folder = str(tmp_path)
    a, clock = _attempt(folder, 0.0)
    _steps(a, clock, range(1, 3))
    with open(ledger_path(folder, None), "a", encoding="utf-8") as f:
        f.write('{"a": "' + a.attempt + '", "step": 3, "t": [1')  # being written
    report = Report(folder, a)
    report.refresh()
    assert report._thread is not None
    report._thread.join()
    running = report.take()
    assert running is not None and report.take() is None  # handed over once
    assert running.until_now and running.notes == [] and running.steps_committed == 2
    assert json.loads((tmp_path / "goodput.json").read_text())["running"] is True
    a.end(0)
    final = report.final()
    assert final is not None and not final.until_now
    assert json.loads((tmp_path / "goodput.json").read_text())["running"] is False
