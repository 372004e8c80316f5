#!/usr/bin/env bash
# Set up everything a fresh clone needs: a virtualenv with pinned packages, this
# project installed editable, and the bundled sample corpus in data/sample (built
# from the local Python's stdlib). Safe to re-run: each step is skipped or quick
# when already done.
#
# Which torch (the rest is requirements-ci.txt's pins either way):
#   TORCH=auto (default)  a GPU node (`nvidia-smi -L` lists a GPU): the CUDA build
#                         of the pinned torch, from the PyTorch index for the
#                         driver's CUDA version; any other machine: the pinned
#                         torch as pip finds it (on Linux x86_64 PyPI's is a CUDA
#                         build, which runs on the CPU too)
#   TORCH=cuda | cpu      the same choice, forced
#   TORCH=keep            the torch this Python already has (a cluster image's):
#                         the venv sees the system's packages and installs the
#                         rest around it; refused below the supported floor
#   TORCH_VERSION=X.Y.Z   another torch than the pin (.ci/run: the floor, from
#                         requirements-floor.txt)
#   TORCH_INDEX_URL=URL   where the CUDA build comes from (default: by the driver)
#   VENV=DIR              the virtualenv (default .venv)
#   PYTHON=python3.12     the interpreter the venv is made from
#   SETUP_DRY_RUN=1       print the choices and stop before installing anything
#   SETUP_INSTALLER=pip   pip installs everything (default: pip torch, uv the rest;
#                         =uv: uv installs torch too, from PyPI or TORCH_INDEX_URL)
# Offline (no network on the node): PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH=${TORCH:-auto}
PINNED=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' requirements-ci.txt)
FLOOR=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' requirements-floor.txt)
TORCH_VERSION=${TORCH_VERSION:-$PINNED}

say() { echo "setup: $*"; }
die() { echo "setup: $*" >&2; exit 2; }

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  die "Python 3.11+ is required ($PY is $("$PY" --version 2>&1 || echo missing)); set PYTHON"
fi

# The GPUs the NVIDIA driver lists, and the newest CUDA version it supports.
gpus=0
driver_cuda=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  driver_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)
fi

case "$TORCH" in
  auto) if [ "$gpus" -gt 0 ]; then TORCH=cuda; else TORCH=cpu; fi ;;
  cuda | cpu | keep) ;;
  *) die "TORCH=$TORCH: expected auto, cuda, cpu or keep" ;;
esac

# The PyTorch index of the newest CUDA build this driver runs (cu130, cu128, cu126).
cuda_index() {
  local want=$1 major minor tag
  major=${want%%.*}
  minor=${want#*.}
  minor=${minor%%.*}
  for tag in 130 128 126; do
    if [ $((major * 10 + minor)) -ge "$tag" ]; then
      echo "https://download.pytorch.org/whl/cu$tag"
      return 0
    fi
  done
  return 1
}

torch_spec="torch==$TORCH_VERSION"
index_args=()
venv_args=()
case "$TORCH" in
  cuda)
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
      index=$TORCH_INDEX_URL
    elif [ -z "$driver_cuda" ]; then
      die "TORCH=cuda, but no NVIDIA driver answers (nvidia-smi); run on a GPU node, set TORCH_INDEX_URL, or use TORCH=cpu"
    elif ! index=$(cuda_index "$driver_cuda"); then
      die "the NVIDIA driver supports CUDA $driver_cuda, older than torch $TORCH_VERSION's builds (12.6 and newer): update the driver, or keep the image's torch with TORCH=keep"
    else
      # The build's own label, so a CPU torch already in the venv is replaced.
      torch_spec="torch==$TORCH_VERSION+${index##*/}"
    fi
    # The PyTorch index for torch (and its CUDA libraries), PyPI for the rest.
    index_args=(--index-url "$index" --extra-index-url https://pypi.org/simple)
    what="torch $TORCH_VERSION, CUDA build from $index (driver CUDA ${driver_cuda:-?}, $gpus GPU(s))"
    ;;
  cpu) what="torch $TORCH_VERSION as pip finds it (no NVIDIA GPU here)" ;;
  keep)
    if ! kept=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
      die "TORCH=keep, but $PY has no torch to keep; install one there, or use TORCH=auto"
    fi
    if [ "$(printf '%s\n' "$FLOOR" "${kept%%+*}" | sort -V | head -n 1)" != "$FLOOR" ]; then
      die "TORCH=keep: $PY has torch $kept, but this project needs torch >= $FLOOR; use TORCH=auto for the pinned one"
    fi
    TORCH_VERSION=${kept%%+*}
    torch_spec="torch==$TORCH_VERSION"
    venv_args=(--system-site-packages)
    what="torch $kept kept from $PY"
    ;;
esac

installer=${SETUP_INSTALLER:-}
case "$installer" in "" | pip | uv) ;; *) die "SETUP_INSTALLER=$installer: expected pip or uv" ;; esac
[ "$TORCH" != keep ] || installer=pip

say "venv $VENV from $("$PY" --version 2>&1); $what"
if [ -n "${SETUP_DRY_RUN:-}" ]; then
  say "dry run: TORCH=$TORCH torch_spec=$torch_spec index=${index_args[*]:-pip default} venv_args=${venv_args[*]:-none} installer=${installer:-pip torch, uv the rest}"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "${venv_args[@]}" "$VENV"
if [ "$TORCH" = keep ] && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  die "TORCH=keep: $VENV does not see $PY's torch (a venv made before without TORCH=keep, or PYTHON is itself a venv's); remove $VENV, or set PYTHON to the interpreter that has torch"
fi
# Who installs what: pip installs torch (it honours pip's own settings: a local
# wheel, an index, offline wheel folders) and uv the rest, several times faster.
# SETUP_INSTALLER=uv: uv installs torch too; =pip (and TORCH=keep): pip does all.
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
torch_pip=("${pip[@]}")
rest_pip=("${pip[@]}")
if [ "$installer" != pip ]; then
  "${pip[@]}" "$(sed -n 's/^\(uv==[^ ]*\).*/\1/p' requirements-ci.txt)"
  rest_pip=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python")
  [ "$installer" != uv ] || torch_pip=("${rest_pip[@]}")
fi
# The rest is pinned by requirements-ci.txt; torch by the choice above (kept: not
# installed, only held at its version so nothing replaces it).
rest=$(mktemp)
trap 'rm -f "$rest"' EXIT
grep -v -e '^torch==' -e '^uv==' requirements-ci.txt > "$rest"
if [ "$TORCH" != keep ]; then
  "${torch_pip[@]}" "${index_args[@]}" "$torch_spec"
fi
"${rest_pip[@]}" -r "$rest" -c <(echo "torch==${TORCH_VERSION%%+*}")
"${pip[@]}" --no-deps --no-build-isolation -e .
"$VENV/bin/python" scripts/tools/build_sample_data.py --out data/sample
"$VENV/bin/python" - <<'EOF'
import torch

build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
if torch.cuda.is_available():
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    device = f"{torch.cuda.device_count()} x {', '.join(names)} (nccl)"
else:
    device = "CPU (gloo)"
print(f"setup: torch {torch.__version__} ({build}) at {torch.__file__.rsplit('/', 2)[0]}; device: {device}")
EOF
