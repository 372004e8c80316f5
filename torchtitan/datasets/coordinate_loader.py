"""One loader per data-parallel coordinate.

Processes that share a data-parallel coordinate train on the same batch: today
the tensor-parallel peers (later also the pipeline stages). Only one of them
runs a loader: the group's rank 0 (tensor-parallel rank 0), the *loading peer*.
It hands every batch it loads to the others, the *receiving peers*, by
broadcast over the group. A receiver reads nothing, tokenizes nothing, decodes
no image and holds no loader state or lookahead.

The broadcast is generic over the batch: every tensor and numpy array found in
it (through dataclass fields, lists, tuples, dicts and other sequences, which
travel as lists, so the token rows, labels, positions, per-source counts and
an `ImageBatch`'s patches and grids alike) is copied into one byte frame after
the pickled rest (the step, the lane digests, names, the batch's own class,
where each tensor lies). Lane digests computed when read (images) are
therefore computed by the loading peer as it sends. A field added to a batch
later travels without a change here. Each step costs two broadcasts over the
group: the frame's size, then the frame.

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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from torchtitan.datasets.contract import RankLoader

_ALIGN = 64  # every tensor starts at a multiple of this in the frame (dtype views)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where one tensor or array of a batch lies in the broadcast frame."""

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
        end[0] += _aligned(nbytes)
        return slot
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _strip(getattr(value, f.name), tensors, end)
                  for f in dataclasses.fields(value)}  # fmt: skip
        return _Record(type(value), fields)
    if isinstance(value, list | tuple):
        return _same_sequence(value, [_strip(v, tensors, end) for v in value])
    if isinstance(value, dict):
        return {k: _strip(v, tensors, end) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        # any other sequence travels as a list: a batch's lane digests computed when
        # read (zephon.images.assembly.LaneDigests) are computed here, by the loading peer
        return [_strip(v, tensors, end) for v in value]
    return value


def _same_sequence(like: list[Any] | tuple[Any, ...], items: list[Any]) -> Any:
    """`items` as a sequence of `like`'s type (a named tuple takes them one by one)."""
    return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)


def _fill(layout: Any, buffer: torch.Tensor) -> Any:
    """The value `_strip` took apart, its tensors views of `buffer` (the frame's
    tensor part)."""
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
        return _same_sequence(layout, [_fill(v, buffer) for v in layout])
    if isinstance(layout, dict):
        return {k: _fill(v, buffer) for k, v in layout.items()}
    return layout


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
    """Messages from the group's rank 0 to the others (`device`: where the
    collectives run, a CUDA device under NCCL). A message is a picklable object
    and, for a batch, its tensors: two broadcasts, the sizes and then one frame
    (the pickled object, then the tensors' bytes at their slots' offsets)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.group, self.device = group, device
        self.src = dist.get_global_rank(group, 0)
        self.bytes = 0  # frame bytes sent or received so far

    def send(self, message: tuple[Any, ...], value: Any = None) -> None:
        """Broadcast `message`; with `value`, its layout (`_strip`) is appended to
        the message and its tensors fill the frame."""
        tensors: list[tuple[_Slot, torch.Tensor]] = []
        end = [0]
        if value is not None:
            message = (*message, _strip(value, tensors, end))
        payload = pickle.dumps(message)
        head = _aligned(len(payload))
        frame = torch.empty(head + end[0], dtype=torch.uint8)
        frame[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        for slot, t in tensors:
            if slot.nbytes:
                at = head + slot.offset
                frame[at : at + slot.nbytes] = t.reshape(-1).view(torch.uint8)
        sizes = torch.tensor([len(payload), frame.numel()], dtype=torch.int64)
        dist.broadcast(sizes.to(self.device), group=self.group, group_src=0)
        dist.broadcast(frame.to(self.device), group=self.group, group_src=0)
        self.bytes += frame.numel()

    def receive(self) -> tuple[Any, torch.Tensor]:
        """(message, the frame after the pickled message: where its tensors lie)."""
        sizes = torch.empty(2, dtype=torch.int64, device=self.device)
        dist.broadcast(sizes, group=self.group, group_src=0)
        n, total = sizes.tolist()
        frame = torch.empty(total, dtype=torch.uint8, device=self.device)
        dist.broadcast(frame, group=self.group, group_src=0)
        frame = frame.cpu()
        self.bytes += total
        message = pickle.loads(frame[:n].numpy().tobytes())
        if message[0] == "error":
            exc = message[1]
            exc.add_note(f"(raised by the loading peer, rank {self.src}, and sent to this rank)")
            raise exc
        return message, frame[_aligned(n) :]


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
            self.link.send(("error", _portable(exc)))
            raise
        self.link.send(("ready", tuple(self.loader.source_names)))
        self.sent_batches = self.broadcast_ns = 0

    @property
    def source_names(self) -> tuple[str, ...]:
        return self.loader.source_names

    def next_batch(self) -> Any:
        try:
            batch = self.loader.next_batch()
        except Exception as exc:
            self.link.send(("error", _portable(exc)))
            raise
        if batch is None:
            self.link.send(("end",))
            return None
        t0 = time.perf_counter_ns()
        self.link.send(("batch",), batch)
        self.broadcast_ns += time.perf_counter_ns() - t0
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
            "broadcast_bytes": self.link.bytes,
            "broadcast_us": self.broadcast_ns // 1000,
        }

    def close(self) -> None:
        self.loader.close()


class ReceivingPeer:
    """Any other rank of the group: receives each batch; holds no loader and no
    state (the loading peer's state is the coordinate's, saved once)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.link = _GroupLink(group, device)
        (_, names), _ = self.link.receive()
        self._source_names: tuple[str, ...] = names

    @property
    def source_names(self) -> tuple[str, ...]:
        return self._source_names

    def next_batch(self) -> Any:
        message, tensors = self.link.receive()
        if message[0] == "end":
            return None
        return _fill(message[1], tensors)

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
        return {"receivers": 1, "received_bytes": self.link.bytes}

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
