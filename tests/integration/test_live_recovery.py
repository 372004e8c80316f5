"""Live recovery (docs/fault_tolerance.md): two replica groups of one process under
torchft's lighthouse; one group is killed (SIGKILL, every process) after step 3. The
survivor goes on without a restart, makes the step in flight again with all the
lanes, and every step's global batch equals the one of an ordinary run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.shared import once

from harness.faults import STEPS, Job, digests_ok, steps_logged, wait_for
from harness.train import REPO, read_metrics
from torchtitan.distributed.utils import free_port

pytest.importorskip("torchft")

FT = {"fault_tolerance.enable": "true", "fault_tolerance.group_count": 2}


def _lighthouse(min_replicas: int = 1, port: int = 0) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchtitan.runtime.lighthouse", "--port", str(port),
         "--host", "127.0.0.1", "--heartbeat-timeout-ms", "1500",
         "--min-replicas", str(min_replicas)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "FT_LIGHTHOUSE=" in first, first
    return proc, first.split("FT_LIGHTHOUSE=")[1].rstrip(")\n")


def _group(dump: Path, extra: dict[str, Any], address: str, k: int) -> Job:
    """Replica group `k` of one process under the lighthouse at `address`."""
    env = {"FT_LIGHTHOUSE": address, "FT_REPLICA_ID": str(k)}
    return Job(dump, extra, nproc=1, name=f"group{k}", env=env)


def _both_trained(dump: Path) -> bool:
    return steps_logged(dump) >= 1 and any(
        r.get("replica_groups") == [0, 1] for r in read_metrics(dump).values()
    )


def _alone_trained(dump: Path) -> bool:
    return any(r.get("replica_groups") == [0] for r in read_metrics(dump).values())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """The records of an ordinary 2-process run of the same job."""

    def make(folder: Path) -> None:
        ref = Job(folder, nproc=2, name="ref")
        assert ref.wait(240) == 0, ref.output()[-3000:]

    return read_metrics(once(tmp_path_factory, "ft-reference", make))  # (for both workers)


def test_a_lost_group_costs_one_step_and_the_survivor_keeps_every_batch(
    tmp_path: Path, reference: dict[int, dict[str, Any]]
) -> None:
    want = reference

    lighthouse, address = _lighthouse()
    dump = tmp_path / "ft"
    try:
        groups = [_group(dump, FT, address, k) for k in range(2)]
        # Either group may start first (the other then joins, copying from it): kill
        # group 1 once a step was trained by both.
        assert wait_for(lambda: _both_trained(dump), groups[0], 180), groups[0].output()[-3000:]
        survivor = groups[0].rank_pid(0)
        groups[1].kill9()
        # Read again once the survivor trained alone: the same process, not a restart.
        alone = wait_for(lambda: _alone_trained(dump), groups[0], 120)
        after = groups[0].rank_pid(0)
        assert groups[0].wait(180) == 0, groups[0].output()[-3000:]
    finally:
        lighthouse.terminate()
        lighthouse.wait(10)

    # Every step once, with the ordinary run's global batch: the step in flight was
    # made again by the survivor alone, from every lane's state at its start.
    assert digests_ok(dump, want) is None, digests_ok(dump, want)
    got = read_metrics(dump)
    for step in range(1, STEPS + 1):
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=1e-5), step
    out = groups[0].output()
    recoveries = [line for line in out.splitlines() if "left at step" in line]
    assert len(recoveries) == 1 and "group 1 left at step" in recoveries[0], out[-3000:]
    redone = re.search(r"(\d+) steps? redone", recoveries[0])
    assert "no step redone" in recoveries[0] or (redone and int(redone[1]) <= 1), recoveries
    # The lanes followed the groups alive: 4 + 4 while both were, then all 8 on one.
    held = [(r["replica_groups"], r["lanes_per_group"]) for _, r in sorted(got.items())]
    assert ([0, 1], [4, 4]) in held and held[-1] == ([0], [8]), held
    # The survivor never restarted: one start, and its rank-0 process before the kill
    # is the one that trained alone after it.
    assert out.count("training steps 1..") == 1
    assert alone and survivor is not None and after == survivor, (survivor, after)
    # The goodput ledgers of both groups: every step kept once; the failed step and
    # the quorum that dropped group 1 under their causes; the two groups' time once.
    doc = json.loads((dump / "goodput.json").read_text())
    assert (doc["replica_groups"], doc["steps_committed"]) == ([0, 1], STEPS), doc
    assert doc["steps_redone"] == (int(redone[1]) if redone else 0), (doc, recoveries)
    bad = doc["badput_seconds"]
    # From the kill until the lighthouse drops group 1 (its 1.5 s heartbeat timeout)
    # the survivor is in the step that fails or in the quorum that follows.
    assert bad["recovery"] > 0 and bad["recovery"] + bad["steps_redone"] > 1.0, doc
    assert bad["between_attempts"] == 0, doc
    assert (bad["steps_redone"] > 0) == (doc["steps_redone"] > 0), doc
    assert doc["productive_seconds"] + sum(bad.values()) == pytest.approx(
        doc["job_seconds"], abs=0.01
    )
    assert bad["other"] < 0.05 * doc["job_seconds"], doc


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_group_paused_until_the_others_finished_writes_nothing(
    tmp_path: Path, reference: dict[int, dict[str, Any]]
) -> None:
    """Split brain: group 1 is stopped (SIGSTOP) after a step both trained, group 0
    drops it and finishes alone; group 1 then wakes up. It must not train the steps
    again on its own: every checkpoint file and record stays as group 0 left them."""
    lighthouse, address = _lighthouse()
    dump = tmp_path / "ft"
    quick = {**FT, "fault_tolerance.step_timeout_s": 5}
    try:
        groups = [_group(dump, quick, address, k) for k in range(2)]
        assert wait_for(lambda: _both_trained(dump), groups[0], 180), groups[0].output()[-3000:]
        paused = groups[1].tree()
        _signal(paused, signal.SIGSTOP)
        try:
            assert groups[0].wait(180) == 0, groups[0].output()[-3000:]
            checkpoints, records = _hashes(dump / "checkpoint"), _hashes(dump / "job")
            metrics = (dump / "metrics.jsonl").read_text()
            goodput = (dump / "goodput.json").read_text()
        finally:
            _signal(paused, signal.SIGCONT)
        assert groups[1].wait(180) == 0, groups[1].output()[-3000:]
    finally:
        lighthouse.terminate()
        lighthouse.wait(10)
    late = groups[1].output()
    assert re.search(
        r"replica group 1: the job finished at step 8 while this group was away \(it was at "
        r"step \d\); it wrote nothing and leaves", late
    ), late[-3000:]  # fmt: skip
    assert "training done" not in late
    assert _hashes(dump / "checkpoint") == checkpoints and len(checkpoints) > 0
    assert _hashes(dump / "job") == records
    assert (dump / "metrics.jsonl").read_text() == metrics
    assert (dump / "goodput.json").read_text() == goodput  # (its own ledger grew)
    assert digests_ok(dump, reference) is None, digests_ok(dump, reference)


def test_a_group_with_other_settings_refuses_and_a_lost_lighthouse_stops_the_other(
    tmp_path: Path, reference: dict[int, dict[str, Any]]
) -> None:
    """Group 1 joins a running group 0 with another seq_len: it refuses in one line
    naming the setting (exit 2) and group 0 trains on alone. Then the
    lighthouse is killed for good: group 0 says so in one line naming it, waits
    `quorum_timeout_s` keeping its state, then stops with the preemption status and
    one line from the launcher. Every step it committed is the job's, once, with the
    ordinary run's batches."""
    lighthouse, address = _lighthouse()
    dump = tmp_path / "ft"
    quick = {
        **FT,
        "fault_tolerance.quorum_timeout_s": 5,
        "training.steps": 40,
        "checkpoint.enable": "false",
    }  # (no checkpoint: group 1 joins, not resumes)
    try:
        groups = [_group(dump, quick, address, 0)]
        assert wait_for(lambda: steps_logged(dump) >= 1, groups[0], 180), groups[0].output()
        groups.append(_group(dump, {**quick, "training.seq_len": 32}, address, 1))
        assert groups[1].wait(180) == 2, groups[1].output()[-3000:]
        after = steps_logged(dump) + 2  # group 0 trained on alone
        assert wait_for(lambda: steps_logged(dump) >= after, groups[0], 180), groups[0].output()
    finally:
        lighthouse.kill()
        lighthouse.wait(10)
    assert groups[0].wait(120) == 3, groups[0].output()[-3000:]
    refused, out = groups[1].output(), groups[0].output()
    errors = [line for line in refused.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in refused, refused[-3000:]
    assert "replica group 1 has other settings than the groups training" in errors[0], errors
    assert "training.seq_len = 32 here, 64 there" in errors[0], errors
    lines = out.splitlines()
    lost = [x for x in lines if f"replica group 0: the lighthouse {address}" in x]
    assert len(lost) == 1 and "does not answer (ConnectionRefusedError)" in lost[0], lost
    ends = [x for x in lines if x.startswith("stopped at step")]
    assert len(ends) == 1, out[-3000:]
    assert (
        f"(lighthouse lost): replica group 0: no quorum from the lighthouse {address}" in (ends[0])
    ), ends
    assert "Traceback" not in out and "flight recorder" not in out, out[-3000:]
    assert not re.search(r"^\[rank0\]:[0-9:]+ $", out, re.M), "a blank log line"
    steps = [json.loads(x)["step"] for x in (dump / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3, steps  # each once
    got = read_metrics(dump)
    for step in range(1, min(len(steps), STEPS) + 1):  # (the reference has STEPS steps)
        assert got[step]["digest"] == reference[step]["digest"], step


def test_an_unreachable_lighthouse_and_a_second_group_with_one_id_are_one_line_each(
    tmp_path: Path,
) -> None:
    lighthouse, address = _lighthouse(min_replicas=2)  # the first group waits at its quorum
    dump = tmp_path / "ft"
    try:
        first = Job(dump, FT, nproc=1, name="first",
                    env={"FT_LIGHTHOUSE": address, "FT_REPLICA_ID": "0"})  # fmt: skip
        assert wait_for(lambda: "training steps 1.." in first.output(), first, 120), first.output()
        again = Job(dump, FT, nproc=1, name="again",
                    env={"FT_LIGHTHOUSE": address, "FT_REPLICA_ID": "0"})  # fmt: skip
        assert again.wait(120) == 2, again.output()[-3000:]
        first.kill9()
    finally:
        lighthouse.terminate()
        lighthouse.wait(10)
    assert "replica_id = 0: a replica group with this id already runs" in again.output()
    assert "Traceback" not in again.output()

    # A lighthouse nobody serves: one line naming it, after the connect timeout, exit 2.
    nobody = f"127.0.0.1:{free_port()}"
    lost = Job(tmp_path / "lost", {**FT, "fault_tolerance.connect_timeout_s": 3}, nproc=1,
               name="lost", env={"FT_LIGHTHOUSE": nobody, "FT_REPLICA_ID": "1"})  # fmt: skip
    assert lost.wait(120) == 2, lost.output()[-3000:]
    errors = [line for line in lost.output().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"lighthouse = '{nobody}'" in errors[0], lost.output()[-3000:]
