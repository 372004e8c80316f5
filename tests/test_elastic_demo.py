"""scripts/elastic_resume_demo.py end to end, in a reduced configuration: the
Zephon resumes on other process counts see the reference's global batches at
every step after the checkpoint; the hf baseline's resume does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import REPO, ensure_sample_data

pytestmark = pytest.mark.slow

STEPS, K, REF_PROCS = 4, 2, 2


def test_demo_reduced_configuration(tmp_path: Path) -> None:
    ensure_sample_data()
    out = tmp_path / "demo"
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "elastic_resume_demo.py"),
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--ckpt-step",
        str(K),
        "--ref-procs",
        str(REF_PROCS),
        "--resume-sizes",
        "1,4",
        "--hf-resume-sizes",
        "4",  # one hf resume is enough to show the contrast, and saves a run
        "--seq-len",
        "32",
        "--global-batch",
        "16",
        "--local-batch",
        "2",
    ]
    proc = subprocess.run(
        cmd, cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (out / "loss_curves.png").stat().st_size > 10_000

    res = json.loads((out / "results.json").read_text())
    assert res["zephon_all_match"] is True
    rows = {(r["loader"], r["resume_size"]): r for r in res["rows"]}
    assert set(rows) == {("zephon", 1), ("zephon", 4), ("hf", 4)}

    runs = {(r["loader"], r["role"], r["nproc"]): r for r in res["runs"]}
    after_k = list(range(K + 1, STEPS + 1))

    def digests(key: tuple[str, str, int]) -> dict[int, str]:
        return {s["step"]: s["digest"] for s in runs[key]["steps"] if s["step"] > K}

    zephon_ref = digests(("zephon", "reference", REF_PROCS))
    assert sorted(zephon_ref) == after_k
    for n in (1, 4):
        row = rows[("zephon", n)]
        assert row["digests_equal"] == row["steps_compared"] == STEPS - K
        assert row["first_differing_step"] is None
        assert digests(("zephon", "resume", n)) == zephon_ref
        assert row["max_abs_loss_diff"] < 1e-3  # same data: reduction-order noise only

    hf_ref = digests(("hf", "reference", REF_PROCS))
    hf_resumed = digests(("hf", "resume", 4))
    assert sorted(hf_resumed) == sorted(hf_ref) == after_k
    assert all(hf_resumed[s] != hf_ref[s] for s in after_k)
    assert rows[("hf", 4)]["digests_equal"] == 0
    assert rows[("hf", 4)]["first_differing_step"] == K + 1
