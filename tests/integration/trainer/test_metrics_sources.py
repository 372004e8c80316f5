"""Per-source counts in the step metrics, and Weights & Biases logging in offline mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO

from torchtitan.components.metrics import MetricsLogger, StepMetrics, format_step
from torchtitan.components.source_metrics import global_source_counts
from zephon import Batch


def _step(step: int = 1, **kw: object) -> StepMetrics:
    base: dict = dict(
        step=step, loss=3.0, grad_norm=1.0, lr=1e-3, tokens=1000, step_time_s=0.5,
        data_wait_s=0.01, source_tokens={"prose": 700, "code": 300},
        source_docs={"prose": 9, "code": 2},
    )  # fmt: skip
    base.update(kw)
    return StepMetrics(**base)


def test_compact_line_and_full_jsonl(tmp_path: Path) -> None:
    assert format_step(_step()).endswith("mix prose 70% code 30%")
    assert "mix" not in format_step(_step(source_tokens=None, source_docs=None))
    path = tmp_path / "m.jsonl"
    with MetricsLogger(jsonl_path=str(path)) as ml:
        ml.log(_step(1))
        ml.log(_step(2, source_tokens=None, source_docs=None))
    first, second = (json.loads(x) for x in path.read_text().splitlines())
    assert first["source_tokens"] == {"prose": 700, "code": 300}
    assert first["source_docs"] == {"prose": 9, "code": 2}
    assert "source_tokens" not in second  # loaders that do not count add nothing


def test_counts_from_batch_fields() -> None:
    ids = torch.zeros((2, 4), dtype=torch.int64)
    batch = Batch(0, ids, ids, ids, [])
    assert global_source_counts(batch, ["a", "b"], torch.device("cpu")) is None
    batch.source_tokens = np.array([6, 2], dtype=np.int64)  # the loader's fields
    batch.source_docs = np.array([3, 1], dtype=np.int64)
    tokens, docs = global_source_counts(batch, ["a", "b"], torch.device("cpu"))
    assert (tokens, docs) == ({"a": 6, "b": 2}, {"a": 3, "b": 1})
    with pytest.raises(ValueError, match="expected \\(3,\\)"):
        global_source_counts(batch, ["a", "b", "c"], torch.device("cpu"))


WANDB_RUN = """
import sys
from torchtitan.components.metrics import MetricsLogger, StepMetrics
from torchtitan.config.job_config import Metrics
ml = MetricsLogger.from_config(Metrics(enable_wandb=True, jsonl_file=""), sys.argv[1],
                               {"training": {"steps": 2}})
for s in (1, 2):
    ml.log(StepMetrics(step=s, loss=3.0, grad_norm=1.0, lr=1e-3, tokens=100, step_time_s=0.1,
                       data_wait_s=0.01, source_tokens={"prose": 70, "code": 30},
                       source_docs={"prose": 3, "code": 1}))
ml.log_validation(2, 2.5)
ml.close()
"""


def test_wandb_offline_run_is_written(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    # A subprocess: wandb starts a service process and patches the interpreter.
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-c", WANDB_RUN, str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    record = runs[0].read_bytes()
    for key in (b"train/loss", b"train/source_tokens/prose", b"train/source_docs/code",
                b"validation/loss"):  # fmt: skip
        assert key in record


def test_phase_mixture_is_summed_over_the_phase_and_survives_a_resume(tmp_path: Path) -> None:
    """With data phases each record carries its phase, the scheduled shares and the
    realised shares over the phase so far; a logger opened on the same file (a
    resume) continues the phase's sums, and a new phase starts its own."""
    from torchtitan.components.source_metrics import mixture_rows

    path = tmp_path / "metrics.jsonl"
    target = {"prose": 0.5, "code": 0.5}
    steps = [(1, "main", 600, 400), (2, "main", 400, 600), (3, "main", 200, 800),
             (4, "anneal", 900, 100)]  # fmt: skip

    def log(ml: MetricsLogger, step: int, phase: str, prose: int, code: int) -> str:
        return ml.log(_step(step, phase=phase, scheduled_shares=target,
                            source_tokens={"prose": prose, "code": code}))  # fmt: skip

    with MetricsLogger(jsonl_path=str(path)) as ml:
        for s in steps[:2]:
            line = log(ml, *s)
    assert (
        "phase main | mix prose 40% code 60% | main so far prose 50% code 50% (target 50% 50%)"
        in line
    )
    with MetricsLogger(jsonl_path=str(path)) as ml:  # resumed after step 2
        for s in steps[2:]:
            log(ml, *s)
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["phase"] for r in records] == ["main", "main", "main", "anneal"]
    assert records[2]["phase_shares"] == {"prose": 0.4, "code": 0.6}  # 1200 / 3000 since step 1
    assert records[3]["phase_shares"] == {"prose": 0.9, "code": 0.1}  # the anneal's own
    rows = mixture_rows(records)
    assert [(r.step, r.phase) for r in rows] == [(s[0], s[1]) for s in steps]
    assert rows[2].realised == {"prose": 0.2, "code": 0.8} and rows[2].scheduled == target
    # A recipe without phases: records as before.
    with MetricsLogger(jsonl_path=str(tmp_path / "plain.jsonl")) as ml:
        assert "phase" not in ml.log(_step(1))
    assert "phase" not in json.loads((tmp_path / "plain.jsonl").read_text())
