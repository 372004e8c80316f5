"""Checkpoints that cannot lie, one error from any rank, no silent hangs, one
writer per dump folder, and tolerant data checks (issue 8).

The tests use real files: a real DCP save, real loaders, real locks. The two
end-to-end scenarios through run_train.sh (a bad record on rank 1; a stopped
rank) are tests/integration/test_train_reliability.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import REPO
from helpers.loader import close, make_ranks

from torchtitan.components.checkpoint import CheckpointError, manifest
from torchtitan.components.metrics import drop_records_after
from torchtitan.config.job_config import ConfigError, load_job_config
from torchtitan.datasets.dataloader import check_validation_ends
from torchtitan.runtime.dump_lock import LOCK_FILE, DumpFolderLocked, DumpLock
from zephon import load_recipe
from zephon.errors import DataError
from zephon.tools.cli import main as zephon_main

# dcp.save without a process group says it assumes one process: that is the intent here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


# -- manifest -------------------------------------------------------------------------------


def _write_step(folder: Path, step: int, loader_step: int | None = None) -> Path:
    """A real step folder: DCP files, a loader state and the manifest."""
    d = folder / f"step-{step}"
    gen = torch.Generator().manual_seed(step)
    dcp.save({"w": torch.randn(4096, generator=gen)}, checkpoint_id=str(d))
    state = {"format": "zephon.loader_state", "step": step if loader_step is None else loader_step}
    (d / manifest.LOADER_FILE).write_text(json.dumps(state))
    files = manifest.file_entries(str(d), manifest.files_of_rank(str(d), 0))
    doc = manifest.manifest_document(step, 1, files)
    (d / manifest.COMPLETE_FILE).write_text(json.dumps(doc))
    return d


def _damage(d: Path, kind: str) -> Path:
    shard = d / "__0_0.distcp"
    if kind == "zeros":
        with open(shard, "r+b") as f:
            f.seek(shard.stat().st_size // 2)
            f.write(b"\0" * 4096)
    elif kind == "truncated":
        os.truncate(shard, shard.stat().st_size - 1)
    elif kind == "deleted":
        shard.unlink()
    elif kind == "metadata":
        (d / ".metadata").unlink()
        return d / ".metadata"
    elif kind == "swapped":
        (d / manifest.LOADER_FILE).write_text((d.parent / "step-2" / "dataloader.json").read_text())
        return d / manifest.LOADER_FILE
    return shard


@pytest.mark.parametrize("kind", ["zeros", "truncated", "deleted", "metadata", "swapped"])
def test_damaged_latest_step_is_refused_naming_file_and_good_step(tmp_path, kind):
    _write_step(tmp_path, 2)
    d = _write_step(tmp_path, 4)
    assert manifest.select_resume_step(str(tmp_path), -1, "full") == 4
    bad = _damage(d, kind)
    with pytest.raises(CheckpointError) as exc:
        manifest.select_resume_step(str(tmp_path), -1, "full")
    msg = str(exc.value)
    assert str(bad) in msg and "--checkpoint.load_step 2" in msg, msg
    # Falling back is explicit, and the older step verifies.
    assert manifest.select_resume_step(str(tmp_path), 2, "full") == 2
    with pytest.raises(CheckpointError, match="checkpoint.load_step = 4 fails verification"):
        manifest.select_resume_step(str(tmp_path), 4, "full")


def test_size_mode_misses_same_size_zeros_but_catches_the_rest(tmp_path):
    _write_step(tmp_path, 2)
    _damage(_write_step(tmp_path, 4), "zeros")
    assert manifest.select_resume_step(str(tmp_path), -1, "size") == 4  # the documented cost
    d = _write_step(tmp_path, 6, loader_step=2)  # a loader state of another step
    with pytest.raises(CheckpointError, match="loader state of step 2 in the folder of step 6"):
        manifest.verify_step_dir(str(d), "size")


def test_pre_manifest_checkpoint_is_accepted_with_a_warning(tmp_path, caplog):
    d = _write_step(tmp_path, 3)
    (d / manifest.COMPLETE_FILE).write_text(json.dumps({"step": 3, "world_size": 1}))
    with caplog.at_level("WARNING", logger="torchtitan"):
        assert manifest.select_resume_step(str(tmp_path), -1, "full") == 3
    assert "written before checkpoint manifests" in caplog.text


def test_verify_command(tmp_path):
    _write_step(tmp_path, 2)
    _damage(_write_step(tmp_path, 4), "truncated")
    (tmp_path / "step-6").mkdir()  # a save that never finished
    cmd = [sys.executable, "-m", "torchtitan.components.checkpoint", "verify", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"ok   {tmp_path / 'step-2'}")
    assert lines[1].startswith(f"FAIL {tmp_path / 'step-4'}") and "__0_0.distcp" in lines[1]
    assert lines[2].startswith(f"skip {tmp_path / 'step-6'}")


# -- dump-folder lock ---------------------------------------------------------------------------


def test_second_writer_refused_and_dead_holder_taken_over(tmp_path):
    first = DumpLock(str(tmp_path))
    first.acquire()
    with pytest.raises(DumpFolderLocked, match=f"pid {os.getpid()} on "):
        DumpLock(str(tmp_path)).acquire()
    first.release()
    assert not (tmp_path / LOCK_FILE).exists()
    # A job that died without releasing: its pid no longer runs.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    holder = {"host": first.me["host"], "pid": int(dead.stdout), "renewed": 0, "lease_s": 60}
    (tmp_path / LOCK_FILE).write_text(json.dumps(holder))
    taker = DumpLock(str(tmp_path))
    taker.acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    taker.release()
    # Another host: only a fresh lease counts as alive.
    import time

    remote = {"host": "elsewhere", "pid": 1, "renewed": time.time(), "lease_s": 60}
    (tmp_path / LOCK_FILE).write_text(json.dumps(remote))
    with pytest.raises(DumpFolderLocked, match="pid 1 on elsewhere"):
        DumpLock(str(tmp_path)).acquire()
    (tmp_path / LOCK_FILE).write_text(json.dumps({**remote, "renewed": time.time() - 61}))
    DumpLock(str(tmp_path)).acquire()


# -- bad records ----------------------------------------------------------------------------------


def _break_line(path: Path, line: int, text: bytes) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = text
    path.write_bytes(b"\n".join(lines))


def test_drop_changes_only_the_lane_of_the_bad_record(make_recipe, tokenizer_path):
    recipe_path = make_recipe()
    clean = make_ranks(recipe_path, tokenizer_path, 1)
    ref = [clean[0].next_batch().digests for _ in range(30)]
    close(clean)
    _break_line(recipe_path.parent / "prose.jsonl", 5, b'{"text": "unterminated')
    failing = make_ranks(recipe_path, tokenizer_path, 1)
    with pytest.raises(DataError, match=r"prose.jsonl:5: not valid JSON"):
        for _ in range(30):
            failing[0].next_batch()
    close(failing)
    error_fp = load_recipe(recipe_path).digest()
    text = recipe_path.read_text().replace("[recipe]\n", '[recipe]\nbad_records = "drop"\n')
    recipe_path.write_text(text)
    assert load_recipe(recipe_path).digest() == error_fp  # a policy, not data identity
    dropping = make_ranks(recipe_path, tokenizer_path, 1, num_workers=2, prefetch=2)
    got = [dropping[0].next_batch().digests for _ in range(30)]
    state = dropping[0].state_dict()
    assert dropping[0].dropped_records() == 1
    close(dropping)
    assert state["dropped_records"] == {"code": [], "prose": [4]}
    changed = {
        lane for a, b in zip(ref, got, strict=True) for lane in range(8) if a[lane] != b[lane]
    }
    assert len(changed) == 1, changed  # every other lane reads exactly what it read before


def test_scan_reports_every_bad_record(make_recipe, tokenizer_path, capsys):
    recipe_path = make_recipe()
    prose = recipe_path.parent / "prose.jsonl"
    _break_line(prose, 3, b'{"text": "broken')
    _break_line(prose, 7, b'{"text": "bad \xff utf8"}')
    _break_line(prose, 250, b'{"body": "no text"}')
    code = zephon_main(["validate", str(recipe_path), "--tokenizer", tokenizer_path, "--scan",
                        "--global-batch", "16", "--scan-workers", "2"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2
    assert "scan      500 records read, 3 bad" in out
    for where in (f"{prose}:3: not valid JSON", f"{prose}:7: not valid UTF-8", f"{prose}:250: no"):
        assert where in out, out
    assert err.count("error:") == 1 and "3 bad record(s)" in err


# -- smaller items -------------------------------------------------------------------------------


def test_metrics_after_the_checkpoint_are_not_repeated(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 8)) + '{"step": 8')
    assert drop_records_after(str(path), 4) == 4
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3, 4]


def test_endless_validation_is_refused():
    cfg = load_job_config(["--validation.recipe", "train_configs/data/sample_mix.toml"])
    with pytest.raises(ConfigError, match="repeats source.s. prose, code forever"):
        check_validation_ends(cfg, load_recipe(cfg.validation.recipe))
    check_validation_ends(cfg, load_recipe("train_configs/data/sample_val.toml"))


def test_watchdog_names_a_frozen_rank_and_a_rank_stuck_on_data():
    """Two monitors on a real TCPStore: rank 0 watches rank 1. Their clock is
    driven by hand, so the test sees the watchdog stay quiet just before its
    timeout and fire exactly at it (no sleeping, no wall-clock margins)."""
    import datetime

    import torch.distributed as dist

    from torchtitan.runtime.monitor import RankMonitor

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10))  # fmt: skip
    store = dist.PrefixStore("t/", master)
    now = [1000.0]  # seconds; steps below are exact in binary

    def clock() -> float:
        return now[0]

    timeout = 8.0
    watcher = RankMonitor(store, 0, 2, timeout_s=timeout, clock=clock)
    peer = RankMonitor(store, 1, 2, timeout_s=timeout, clock=clock)
    # The threads are not started: beats are driven by hand, so a "frozen" rank
    # is one whose beat stops, exactly as under SIGSTOP.
    watcher.set_phase("collective", 5)
    watcher._beat()
    peer.set_phase("data", 5)
    peer._beat()
    assert watcher.diagnose() is None  # first sight
    now[0] += timeout - 0.25
    peer._beat()  # alive, waiting for its data for just under the timeout
    assert watcher.diagnose() is None
    now[0] += 0.25
    peer._beat()  # waiting for exactly the timeout
    rec = watcher.diagnose()
    assert rec is not None and rec["rank"] == 1 and rec["frozen_pid"] is None
    assert "has waited 8s for its data at step 5" in rec["message"]
    assert "rank 0: collective (step 5)" in rec["message"]
    peer.set_phase("collective", 5)
    peer._beat()
    assert watcher.diagnose() is None  # beating, not on data: fine
    now[0] += timeout - 0.25  # no beat since: silent, but not yet for the timeout
    assert watcher.diagnose() is None
    now[0] += 0.25
    rec = watcher.diagnose()
    assert rec is not None and "sent no heartbeat for 8s" in rec["message"]
    assert rec["frozen_pid"] == os.getpid()
    peer.stop()
    assert watcher.diagnose() is None  # a rank that finished is not silent
