"""Smoke test: benchmarks/bench_pipeline.py --quick runs and prints its ratio line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from torchtitan.launch import ensure_sample_data

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_pipeline.py"


def test_bench_pipeline_quick(tmp_path: Path) -> None:
    ensure_sample_data()  # build the sample corpus rather than skip without it
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "RATIO pipeline/raw = " in proc.stdout
    assert out.is_file()
