import json
from pathlib import Path

import pytest
import torch

from torchtitan.components.metrics import (
    MetricsLogger,
    StepMetrics,
    format_step,
    peak_memory_gib,
    trim_logs_to_start,
)
from torchtitan.config.job_config import MetricsConfig


def sample(step: int = 3, **kw: object) -> StepMetrics:
    values = dict(
        step=step,
        loss=7.25,
        grad_norm=1.5,
        lr=1e-3,
        tokens=8192,
        step_time_s=2.0,
        data_wait_s=0.5,
        digest="0123456789abcdef0123456789abcdef",
    )
    values.update(kw)
    return StepMetrics(**values)  # type: ignore[arg-type]


def test_format_step_fields() -> None:
    line = format_step(sample(memory_gib=1.5))
    for text in (
        "step      3",
        "loss   7.2500",
        "grad_norm  1.5000",
        "lr 1.000e-03",
        "tok/s 4,096",
        "data_wait 0.500s (25.0%)",
        "mem 1.50GiB",
        "digest 0123456789abcdef",
    ):
        assert text in line
    assert "0123456789abcdef0" not in line  # digest shortened to 16 hex chars


def test_format_step_optional_fields_absent() -> None:
    line = format_step(sample(digest=None, step_time_s=0.0))
    assert "digest" not in line and "mem" not in line and "tok/s 0" in line


def test_peak_memory_off_gpu() -> None:
    assert peak_memory_gib(torch.device("cpu")) is None


def test_jsonl_written_and_appended(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "metrics.jsonl"
    with MetricsLogger(jsonl_path=str(path)) as ml:
        line = ml.log(sample(1))
        ml.log(sample(2, loss=float("nan")))
    assert "step      1" in line
    with MetricsLogger(jsonl_path=str(path)) as ml:  # a resumed run appends
        ml.log(sample(3))
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert set(rows[0]) == {
        "step",
        "loss",
        "grad_norm",
        "lr",
        "tokens_per_s",
        "step_time_s",
        "data_wait_s",
        "digest",
        "time",
    }
    assert rows[0]["time"] <= rows[2]["time"]  # wall clock: when each step was logged
    assert rows[0]["loss"] == 7.25 and rows[0]["tokens_per_s"] == 4096.0
    assert rows[0]["digest"] == "0123456789abcdef0123456789abcdef"
    assert rows[1]["loss"] is None


def test_from_config_paths(tmp_path: Path) -> None:
    cfg = MetricsConfig(enable_tensorboard=False, jsonl_file="m.jsonl")
    with MetricsLogger.from_config(cfg, str(tmp_path)) as ml:
        ml.log(sample())
        assert "validation" in ml.log_validation(3, 2.5)
    assert (tmp_path / "m.jsonl").exists()
    assert not (tmp_path / "tb").exists()
    with MetricsLogger.from_config(MetricsConfig(jsonl_file=""), str(tmp_path / "x")) as ml:
        ml.log(sample())
    assert not (tmp_path / "x").exists()


def test_tensorboard_only_when_enabled(tmp_path: Path) -> None:
    cfg = MetricsConfig(enable_tensorboard=True, save_tb_folder="tb", jsonl_file="")
    with MetricsLogger.from_config(cfg, str(tmp_path)) as ml:
        ml.log(sample(memory_gib=2.0))
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())


def test_validation_loss_is_written_at_full_precision(tmp_path):
    from harness.train import read_validation

    logger = MetricsLogger(val_jsonl_path=str(tmp_path / "validation.jsonl"))
    line = logger.log_validation(12, 7.204070567)
    logger.close()
    assert "7.2041" in line
    assert read_validation(tmp_path) == {12: 7.204070567}


def test_a_run_drops_the_records_of_the_steps_it_trains_again(tmp_path: Path) -> None:
    def write(*steps: int) -> None:
        for name in ("m.jsonl", "validation.jsonl"):
            (tmp_path / name).write_text("".join(json.dumps({"step": s}) + "\n" for s in steps))

    def steps(name: str) -> list[int]:
        return [json.loads(x)["step"] for x in (tmp_path / name).read_text().splitlines()]

    cfg = MetricsConfig(jsonl_file="m.jsonl")
    write(1, 2, 3, 4)
    assert trim_logs_to_start(cfg, str(tmp_path), 2) == 4  # resumed from step 2
    assert steps("m.jsonl") == steps("validation.jsonl") == [1, 2]
    # No checkpoint completed (a kill inside the first save): the run starts at
    # step 0 and trains every logged step again.
    write(1, 2, 3)
    assert trim_logs_to_start(cfg, str(tmp_path), 0) == 6
    assert steps("m.jsonl") == steps("validation.jsonl") == []
    write(1, 2)
    assert trim_logs_to_start(MetricsConfig(jsonl_file=""), str(tmp_path), 0) == 0  # no JSONL
    assert steps("m.jsonl") == [1, 2]


def test_the_running_goodput_goes_to_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchtitan.components.goodput import Ledger, ledger_path, summarize

    ledger = Ledger(ledger_path(str(tmp_path), None), started=0.0)
    ledger.open_step(1)
    ledger.mark()
    ledger.mark()
    ledger.close_step(1, committed=True)
    ledger.end(0)
    summary = summarize(str(tmp_path))
    cfg = MetricsConfig(enable_tensorboard=True, save_tb_folder="tb", jsonl_file="")
    with MetricsLogger.from_config(cfg, str(tmp_path)) as ml:
        ml.log_goodput(5, summary)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"goodput/goodput", "goodput/badput_startup_s", "goodput/badput_other_s"} <= set(tags)
    (point,) = events.Scalars("goodput/badput_startup_s")
    assert point.step == 5 and point.value == pytest.approx(summary.badput_seconds["startup"])
