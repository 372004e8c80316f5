"""The repository stays ruff-clean (lint and format)."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_ruff_check_and_format():
    for args in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
