#!/usr/bin/env bash
# Set up everything a fresh clone needs: a virtualenv in .venv with pinned
# packages (CPU build of torch), this project installed editable, and the
# bundled sample corpus in data/sample (built from the local Python's stdlib).
# Safe to re-run: each step is skipped or quick when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: Python 3.11+ is required ($PY is $("$PY" --version 2>&1))" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# Pinned versions; torch==2.13.0 is the CPU build (a bare 'torch' would pull CUDA wheels).
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-ci.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
.venv/bin/python scripts/tools/build_sample_data.py --out data/sample
