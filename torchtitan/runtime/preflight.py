"""What the launcher checks once, before any worker starts.

A setting that every rank would refuse alike is refused here, once: the user
gets one line and exit 2 every time, instead of a race between ranks over
who reports it first while the agent stops the others. The checks:
- the job config parses (`load_job_config`: unknown keys with did-you-mean,
  types, ranges), when the launched module is the trainer;
- the device: `NGPU` no larger than the GPUs torch sees; a machine whose
  NVIDIA GPUs torch cannot use (a CPU build, or a CUDA build the driver does
  not support) is refused unless `DEVICE=cpu` asks for the CPU; `DEVICE=cuda`
  without a usable GPU is refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch

from torchtitan.config.job_config import ConfigError, load_job_config
from torchtitan.distributed.utils import DEVICE_ENV, device_setting
from torchtitan.models import check_model_name

TRAINER_MODULE = "torchtitan.train"
NVIDIA_PROC = "/proc/driver/nvidia/gpus"


def nvidia_gpus(proc: str = NVIDIA_PROC) -> int:
    """GPUs the NVIDIA kernel driver has (one folder each), whatever torch can use."""
    try:
        return len(os.listdir(proc))
    except OSError:
        return 0


def job_config_problem(module: bool, script: str, script_args: Sequence[str]) -> str | None:
    """The trainer's config error for these arguments, or None (another program, or
    a request for help, is the worker's to handle)."""
    if not module or script != TRAINER_MODULE or {"-h", "--help"} & set(script_args):
        return None
    try:
        check_model_name(load_job_config(list(script_args)))
    except ConfigError as exc:
        return str(exc)
    return None


def device_problem(
    nproc: int,
    environ: Mapping[str, str],
    cuda_devices: int,
    driver_gpus: int,
    cuda_build: str | None,
) -> str | None:
    """Whether `nproc` processes per node fit the device choice: `cuda_devices` is
    what torch sees, `driver_gpus` what the driver has, `cuda_build` the CUDA
    version torch was built for (None: a CPU build)."""
    try:
        choice = device_setting(environ)
    except ValueError as exc:
        return str(exc)
    build = f"torch {torch.__version__} ({f'CUDA {cuda_build}' if cuda_build else 'CPU'} build)"
    if choice == "cpu":
        return None
    if cuda_devices > 0:
        if nproc > cuda_devices:
            visible = environ.get("CUDA_VISIBLE_DEVICES")
            where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
            return (
                f"NGPU={nproc} (--nproc-per-node) but torch sees {cuda_devices} GPU(s){where}: "
                f"set NGPU to at most {cuda_devices}, one process per GPU"
            )
        return None
    if choice == "cuda":
        why = (
            "no NVIDIA driver is loaded on this machine"
            if driver_gpus == 0
            else f"it cannot use this machine's {driver_gpus} NVIDIA GPU(s)"
        )
        return (
            f"{DEVICE_ENV}=cuda, but {build} finds no usable GPU: {why}; run on a GPU "
            f"node, or leave {DEVICE_ENV} unset to train on the CPU"
        )
    if driver_gpus > 0:
        fix = (
            "run `bash scripts/setup.sh` there (it installs the CUDA build)"
            if not cuda_build
            else "install a torch built for this driver's CUDA version (`nvidia-smi` "
            "shows it; `bash scripts/setup.sh` picks one)"
        )
        return (
            f"this machine has {driver_gpus} NVIDIA GPU(s), but {build} cannot use them: "
            f"{fix}; or set {DEVICE_ENV}=cpu to train on the CPU anyway"
        )
    return None


def problems(args: object, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every reason not to start the workers of this torchrun launch (parsed
    arguments `args`), in the order a user fixes them: device, then config. (The torch version
    is checked before, by the launcher's first line.)"""
    environ = os.environ if environ is None else environ
    found = []
    nproc = getattr(args, "nproc_per_node", "1")
    if str(nproc).isdigit():
        found.append(
            device_problem(
                int(nproc),
                environ,
                torch.cuda.device_count() if torch.cuda.is_available() else 0,
                nvidia_gpus(),
                torch.version.cuda,
            )
        )
    found.append(
        job_config_problem(
            bool(getattr(args, "module", False)),
            str(getattr(args, "training_script", "")),
            list(getattr(args, "training_script_args", [])),
        )
    )
    return [p for p in found if p]
