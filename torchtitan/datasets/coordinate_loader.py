"""One loader per data-parallel coordinate.

Processes that share a data-parallel coordinate train on the same batch: today
the tensor-parallel peers (later also the pipeline stages). Only one of them
runs a loader: the group's rank 0 (tensor-parallel rank 0), the *loading peer*.
It hands every batch it loads to the others, the *receiving peers*, by
broadcast over the group. A receiver reads nothing, tokenizes nothing, decodes
no image and holds no loader state or lookahead.

The broadcast is generic over the batch: every tensor and numpy array found in
it (through dataclass fields, lists, tuples and dicts, so the token rows, labels,
positions, per-source counts and an `ImageBatch`'s patches and grids alike)
travels in one flat byte buffer; the rest (the step, the lane digests, names,
the batch's own class) travels pickled beside the buffer's layout. A field added
to a batch later travels without a change here. Each step costs one small object
broadcast and one buffer broadcast.

`batch_digest` hashes every field of a batch, tensor bytes included; the data
glue compares it between peers at logged steps (`TrainDataLoader.global_digest`),
so a receiver that got other bytes than its loading peer trains on is caught.

A failure of the loading peer (building its loader, or a batch) is sent to the
receivers, which raise the same exception, so the whole group stops with one
message instead of waiting in a broadcast. Checking a saved state and loading it
happen on the loading peer alone: receivers accept any state, as they keep none
(a refusal on the loading peer stops the job all the same).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torchtitan.datasets.contract import RankLoader

_ALIGN = 64  # every tensor starts at a multiple of this in the buffer (dtype views)


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where one tensor or array of a batch lies in the broadcast buffer."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    numpy: bool


@dataclasses.dataclass(frozen=True)
class _Record:
    """A dataclass instance: its class and its fields (tensors replaced by slots)."""

    cls: type
    fields: dict[str, Any]


def _strip(value: Any, tensors: list[tuple[_Slot, torch.Tensor]], end: list[int]) -> Any:
    """`value` with every tensor and numeric array replaced by a `_Slot`; the slots
    and their (contiguous) tensors are appended to `tensors`, `end[0]` is the
    buffer's size so far."""
    as_numpy = isinstance(value, np.ndarray)
    if as_numpy or isinstance(value, torch.Tensor):
        try:
            t = torch.from_numpy(np.ascontiguousarray(value)) if as_numpy else value.contiguous()
        except TypeError:  # strings, objects: not plain numbers, pickled with the layout
            return value
        nbytes = t.numel() * t.element_size()
        slot = _Slot(end[0], nbytes, t.dtype, tuple(value.shape), as_numpy)
        tensors.append((slot, t))
        end[0] += -(-nbytes // _ALIGN) * _ALIGN
        return slot
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _strip(getattr(value, f.name), tensors, end)
                  for f in dataclasses.fields(value)}  # fmt: skip
        return _Record(type(value), fields)
    if isinstance(value, list | tuple):
        return type(value)(_strip(v, tensors, end) for v in value)
    if isinstance(value, dict):
        return {k: _strip(v, tensors, end) for k, v in value.items()}
    return value


def _fill(layout: Any, buffer: torch.Tensor) -> Any:
    """The value `_strip` took apart, its tensors views of `buffer`."""
    if isinstance(layout, _Slot):
        raw = buffer[layout.offset : layout.offset + layout.nbytes]
        t = raw.view(layout.dtype).view(layout.shape)
        return t.numpy() if layout.numpy else t
    if isinstance(layout, _Record):
        obj = layout.cls.__new__(layout.cls)  # fields as they were, no __post_init__
        for name, v in layout.fields.items():
            object.__setattr__(obj, name, _fill(v, buffer))
        return obj
    if isinstance(layout, list | tuple):
        return type(layout)(_fill(v, buffer) for v in layout)
    if isinstance(layout, dict):
        return {k: _fill(v, buffer) for k, v in layout.items()}
    return layout


def _pack(batch: Any) -> tuple[Any, torch.Tensor]:
    """(layout, buffer): the batch's tensors copied into one uint8 buffer."""
    tensors: list[tuple[_Slot, torch.Tensor]] = []
    end = [0]
    layout = _strip(batch, tensors, end)
    buffer = torch.empty(end[0], dtype=torch.uint8)
    for slot, t in tensors:
        if slot.nbytes:
            buffer[slot.offset : slot.offset + slot.nbytes] = t.reshape(-1).view(torch.uint8)
    return layout, buffer


def batch_digest(batch: Any) -> bytes:
    """SHA-256 of everything a batch holds: its layout (class, field names, plain
    values, each tensor's dtype and shape) and every tensor's bytes. Equal on two
    processes exactly when they hold the same batch."""
    tensors: list[tuple[_Slot, torch.Tensor]] = []
    layout = _strip(batch, tensors, [0])
    h = hashlib.sha256(repr(layout).encode())
    for _, t in tensors:
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.digest()


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError with its message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _GroupLink:
    """Broadcasts from the group's rank 0 to the others (`device`: where the
    collectives run, a CUDA device under NCCL)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.group, self.device = group, device
        self.src = dist.get_global_rank(group, 0)

    def send_object(self, obj: Any) -> None:
        dist.broadcast_object_list([obj], group=self.group, group_src=0, device=self.device)

    def receive_object(self) -> Any:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, group=self.group, group_src=0, device=self.device)
        return box[0]

    def send_buffer(self, buffer: torch.Tensor) -> None:
        if buffer.numel():
            dist.broadcast(buffer.to(self.device), group=self.group, group_src=0)

    def receive_buffer(self, nbytes: int) -> torch.Tensor:
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        if nbytes:
            dist.broadcast(buffer, group=self.group, group_src=0)
        return buffer.cpu()

    def raise_remote(self, exc: BaseException) -> None:
        exc.add_note(f"(raised by the loading peer, rank {self.src}, and sent to this rank)")
        raise exc


class LoadingPeer:
    """The group's rank 0: runs the loader and broadcasts every batch. The rest of
    the contract is the wrapped loader's."""

    def __init__(
        self, build: Callable[[], RankLoader], group: dist.ProcessGroup, device: torch.device
    ) -> None:
        self.link = _GroupLink(group, device)
        try:
            self.loader = build()
        except Exception as exc:
            self.link.send_object(("error", _portable(exc)))
            raise
        self.link.send_object(("ready", tuple(self.loader.source_names)))
        self.sent_bytes = self.sent_batches = self.broadcast_ns = 0

    @property
    def source_names(self) -> tuple[str, ...]:
        return self.loader.source_names

    def next_batch(self) -> Any:
        try:
            batch = self.loader.next_batch()
        except Exception as exc:
            self.link.send_object(("error", _portable(exc)))
            raise
        t0 = time.perf_counter_ns()
        if batch is None:
            self.link.send_object(("end",))
            return None
        layout, buffer = _pack(batch)
        self.link.send_object(("batch", layout, buffer.numel()))
        self.link.send_buffer(buffer)
        self.broadcast_ns += time.perf_counter_ns() - t0
        self.sent_bytes += buffer.numel()
        self.sent_batches += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        return self.loader.merge_states(states)

    def check_resumable(self, doc: dict[str, Any]) -> None:
        self.loader.check_resumable(doc)

    def load_state(self, doc: dict[str, Any]) -> None:
        self.loader.load_state(doc)

    def needs_merged_state(self) -> bool:
        return self.loader.needs_merged_state()

    def dropped_records(self) -> int | None:
        return self.loader.dropped_records()

    def work_done(self) -> dict[str, int]:
        return {
            **self.loader.work_done(),
            "broadcast_batches": self.sent_batches,
            "broadcast_bytes": self.sent_bytes,
            "broadcast_us": self.broadcast_ns // 1000,
        }

    def close(self) -> None:
        self.loader.close()


class ReceivingPeer:
    """Any other rank of the group: receives each batch; holds no loader and no
    state (the loading peer's state is the coordinate's, saved once)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.link = _GroupLink(group, device)
        what, *rest = self.link.receive_object()
        if what == "error":
            self.link.raise_remote(rest[0])
        self._source_names: tuple[str, ...] = rest[0]
        self.received_bytes = 0

    @property
    def source_names(self) -> tuple[str, ...]:
        return self._source_names

    def next_batch(self) -> Any:
        what, *rest = self.link.receive_object()
        if what == "error":
            self.link.raise_remote(rest[0])
        if what == "end":
            return None
        layout, nbytes = rest
        buffer = self.link.receive_buffer(nbytes)
        self.received_bytes += nbytes
        return _fill(layout, buffer)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def check_resumable(self, doc: dict[str, Any]) -> None:
        pass  # the loading peer checks; its refusal stops the job

    def load_state(self, doc: dict[str, Any]) -> None:
        pass

    def needs_merged_state(self) -> bool:
        return False  # the loading peers (one data-parallel group) hand over states

    def dropped_records(self) -> int | None:
        return None  # counted by the loading peers' data-parallel group

    def work_done(self) -> dict[str, int]:
        return {"receivers": 1, "received_bytes": self.received_bytes}

    def close(self) -> None:
        pass


def one_loader_per_coordinate(
    build: Callable[[], RankLoader], group: dist.ProcessGroup | None, device: torch.device
) -> RankLoader:
    """This rank's side of its coordinate's loader: `build()` itself without a group
    (or a group of one), a `LoadingPeer` on the group's rank 0, else a
    `ReceivingPeer`. Collective over `group` (the loader's source names, or the
    failure to build it, are sent at once)."""
    if group is None or dist.get_world_size(group) == 1:
        return build()
    if dist.get_rank(group) == 0:
        return LoadingPeer(build, group, device)
    return ReceivingPeer(group, device)
