"""What this project needs from torch that differs inside its supported range.

The range is pyproject.toml's `torch>=2.11,<2.14`: the floor, 2.11 (what
current CUDA images ship), is installed by `requirements-floor.txt` and tested
by `.ci/run`; the top, 2.13, is the pinned version of `requirements-ci.txt`.
Code that needs an API that is newer than the floor, or private, goes through
this module, which tests for the feature rather than the version string. The
floor check alone reads the version: it is what the user is told to change.

Known differences inside the range:
- torchrun's `--shutdown-timeout` (seconds between SIGTERM and SIGKILL when the
  agent stops its workers) is new in 2.13; 2.11's torchrun has none and waits
  its fixed 30 s. `parse_torchrun_args` parses it anyway and says it was ignored.
- `LocalElasticAgent._shutdown` took `(death_sig)` in 2.11 and takes
  `(death_sig, timeout)` in 2.13; the launcher's agent (runtime/agent.py)
  overrides it with a signature that passes any of them through.
- The all-gather into one tensor is `all_gather_single` in 2.13, which
  deprecates `all_gather_into_tensor`, 2.11's only name for it
  (`all_gather_tensor`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sysconfig

import torch
import torch.distributed as dist
from torch.torch_version import TorchVersion

TORCH_FLOOR = "2.11"  # the oldest torch `.ci/run` tests; pyproject.toml says the same
TORCH_TESTED = ("2.11.0", "2.13.0")  # requirements-floor.txt, requirements-ci.txt

SHUTDOWN_TIMEOUT = ("--shutdown-timeout", "--shutdown_timeout")


def floor_message(version: str | None = None) -> str | None:
    """The line to print when `version` (default: the installed torch) is below the
    floor, else None."""
    installed = str(torch.__version__) if version is None else version
    if TorchVersion(installed) >= TORCH_FLOOR:
        return None
    return (
        f"torch {installed} is installed, but this project needs torch >= {TORCH_FLOOR} "
        f"(tested: {', '.join(TORCH_TESTED)}); run `bash scripts/setup.sh` for the pinned "
        "one, or install a newer torch in this environment"
    )


def torchrun_parser() -> argparse.ArgumentParser:
    """The installed torchrun's argument parser."""
    from torch.distributed.run import get_args_parser

    return get_args_parser()


def parse_torchrun_args(
    argv: list[str], parser: argparse.ArgumentParser | None = None
) -> tuple[argparse.Namespace, list[str]]:
    """torchrun's arguments parsed by `parser` (default: the installed torchrun's),
    and the options given that this torchrun lacks and so ignores, as given
    (`--shutdown-timeout 15`). Feature test: adding the option to the parser fails
    where torchrun already has it."""
    parser = torchrun_parser() if parser is None else parser
    try:
        parser.add_argument(*SHUTDOWN_TIMEOUT, dest="unsupported_shutdown_timeout", default=None)
    except argparse.ArgumentError:  # this torchrun has it
        return parser.parse_args(argv), []
    args = parser.parse_args(argv)
    value = args.unsupported_shutdown_timeout
    del args.unsupported_shutdown_timeout
    return args, [] if value is None else [f"{SHUTDOWN_TIMEOUT[0]} {value}"]


def compile_problem(device_type: str) -> str | None:
    """Why `torch.compile` cannot build kernels for `device_type` on this machine, or
    None. Inductor compiles C++ with the Python headers on the CPU; on CUDA, triton
    builds its launcher with a C compiler and the Python headers, on GPUs of compute
    capability 7.0 or newer."""
    missing = []
    if device_type == "cuda":
        if importlib.util.find_spec("triton") is None:
            missing.append("triton (pip install triton, the version this torch names)")
        compilers, env = ("cc", "gcc", "clang"), "CC"
        if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 7:
            missing.append("a GPU of compute capability 7.0 or newer")
    else:
        compilers, env = ("g++", "clang++", "c++"), "CXX"
    chosen = os.environ.get(env)
    if not (shutil.which(chosen) if chosen else any(shutil.which(c) for c in compilers)):
        named = f"{env}={chosen}" if chosen else " or ".join(compilers)
        missing.append(f"a {'C' if env == 'CC' else 'C++'} compiler ({named} on PATH)")
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.isfile(headers):
        missing.append(f"the Python headers ({headers}: the python3-dev package)")
    if not missing:
        return None
    return (
        f"training.compile = true needs {'; '.join(missing)}, which this machine lacks: "
        "install it, or set --training.compile false"
    )


def all_gather_tensor(out: torch.Tensor, t: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Every member's `t`, one after another in group-rank order, into `out` (first
    dimension: the group size times `t`'s)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, t, group=group)


# (device type, dtype) -> whether torch._grouped_mm runs there (probed once)
_GROUPED_MM: dict[tuple[str, torch.dtype], bool] = {}


def _grouped_mm_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch's `torch._grouped_mm` (private, and not on every device and
    dtype) multiplies groups of rows here: tried once on a tiny problem."""
    key = (device.type, dtype)
    if key not in _GROUPED_MM:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                x = torch.ones(4, 8, device=device, dtype=dtype)
                w = torch.ones(2, 8, 8, device=device, dtype=dtype)
                offs = torch.tensor([1, 4], device=device, dtype=torch.int32)
                ok = bool(torch._grouped_mm(x, w, offs=offs).eq(8).all())
            except (RuntimeError, NotImplementedError):
                ok = False
        _GROUPED_MM[key] = ok
    return _GROUPED_MM[key]


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """`x [T, n]`, whose rows come in consecutive groups of `counts` (one per matrix),
    times `w [G, n, m]`: `[T, m]`, each group by its own matrix. `torch._grouped_mm`
    where it runs and the shapes are 16-byte aligned (what it asks); otherwise one
    batched matmul over the groups padded to the largest."""
    aligned = all(d * x.element_size() % 16 == 0 for d in (x.shape[1], w.shape[2]))
    if aligned and x.is_contiguous() and _grouped_mm_runs(x.device, x.dtype):
        offs = torch.tensor(counts, device=x.device, dtype=torch.int64).cumsum(0)
        return torch._grouped_mm(x, w, offs=offs.to(torch.int32))
    return padded_grouped_mm(x, w, counts)


def padded_grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """`grouped_mm` as one `bmm` over the groups padded to the largest."""
    groups, rows = len(counts), max(counts, default=0)
    if not rows:
        return x.new_zeros(0, w.shape[2])
    sizes = torch.tensor(counts, device=x.device)
    group = torch.repeat_interleave(torch.arange(groups, device=x.device), sizes)
    starts = torch.cumsum(sizes, 0) - sizes
    place = torch.arange(x.shape[0], device=x.device) - starts[group]
    padded = x.new_zeros(groups, rows, x.shape[1])
    padded = padded.index_put((group, place), x)
    return torch.bmm(padded, w)[group, place]
