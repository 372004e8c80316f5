"""Reliability end to end (issue 8): two scenarios of
scripts/experiments/fault_injection.py run the trainer through run_train.sh: a bad
record on rank 1 reaches the console once, and a stopped rank ends the job naming
it. The in-process checks are tests/unit/trainer/test_reliability.py."""

from __future__ import annotations

import re

import fault_injection as faults


def test_bad_record_on_rank_1_reaches_the_console_once(tmp_path):
    outcome = faults.bad_record_rank1(faults.Ctx(tmp_path, 0, 240), 0)
    assert outcome.startswith("exit 2,") and "drop: ok" in outcome, outcome


def test_stopped_rank_ends_the_job_naming_it(tmp_path):
    outcome = faults.stopped_rank(faults.Ctx(tmp_path, 0, 240), 0)
    assert outcome.startswith("exited in") and "naming rank 1" in outcome, outcome
    # The watchdog's own measure of the silence, from its message: not before
    # the 10 s timeout, and within three of its 2 s checks after it.
    silent = int(re.search(r"silent (\d+)s \(timeout 10s\)", outcome).group(1))
    assert 10 <= silent <= 16, outcome
