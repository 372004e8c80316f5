"""Process-group setup and teardown for torchrun launches (gloo on CPU, nccl on CUDA)."""

from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    nodes: int = 1
    """Nodes (torchrun agents) of this launch; an elastic restart may change it."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a rendezvous or a one-process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEVICE_ENV = "TORCHTITAN_DEVICE"
DEVICE_CHOICES = ("auto", "cuda", "cpu")


def device_setting(environ: Mapping[str, str] | None = None) -> str:
    """`TORCHTITAN_DEVICE`: auto (CUDA when torch sees a GPU, else the CPU), cuda or cpu."""
    environ = os.environ if environ is None else environ
    value = environ.get(DEVICE_ENV, "") or "auto"
    if value not in DEVICE_CHOICES:
        raise ValueError(f"{DEVICE_ENV}={value!r}: expected one of {', '.join(DEVICE_CHOICES)}")
    return value


def init_distributed(timeout_s: int = 600) -> DistInfo:
    """Join the process group torchrun set up (or a one-process group when run
    directly with python). CUDA when visible (unless `TORCHTITAN_DEVICE=cpu`),
    else CPU; the backend follows. The launcher checked the choice (preflight.py)."""
    if "RANK" not in os.environ:
        # A plain `python -m torchtitan.train`: a group of one on this host.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_setting() != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    return DistInfo(rank, world, local_rank, device, backend, nodes)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's object, in rank order (small payloads: digests, loader state)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def exit_process(code: int) -> None:
    """Leave without running C++ destructors at interpreter shutdown.

    Tearing down a gloo group after FSDP2 work can abort the process
    ("terminate called without an active exception"). Every rank first meets
    at a barrier so no peer is still talking to it, then output is flushed
    and the process exits directly with its real status, skipping the gloo
    teardown (the OS reclaims its sockets).
    """
    if dist.is_initialized():
        try:
            if code == 0:
                dist.barrier()
            # gloo's teardown is the part that aborts; NCCL wants an explicit destroy.
            if dist.get_backend() == "nccl":
                dist.destroy_process_group()
        except Exception:  # a peer already gone: nothing left to tear down cleanly
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
