"""A Hugging Face model folder, whatever the model: `config.json` plus safetensors
(one `model.safetensors`, or shards listed by `model.safetensors.index.json`).

Reading is sharded: for every parameter each rank reads only the rows (and
columns) of its own FSDP/TP shard, with safetensors slices; where the model
keeps rows in another order than the checkpoint (e.g. a rotary layout), the
model's state-dict adapter says which checkpoint rows to read. Writing splits
the tensors into files below a size and writes the index. Names, layouts and
the config's meaning belong to the model's adapter, not here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from torchtitan.models.spec import StateDictAdapter

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class HFCheckpointError(ValueError):
    """A Hugging Face folder that cannot be loaded or written, with the reason."""


def is_hf_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CONFIG_FILE)) and (
        os.path.isfile(os.path.join(path, SINGLE_FILE))
        or os.path.isfile(os.path.join(path, INDEX_FILE))
    )


def read_config(folder: str) -> dict[str, Any]:
    """The folder's config.json as a dict (what it means is the model adapter's business)."""
    file = os.path.join(folder, CONFIG_FILE)
    try:
        with open(file, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise HFCheckpointError(f"{file}: not found (a Hugging Face folder needs it)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HFCheckpointError(f"{file}: cannot read: {exc}") from None
    if not isinstance(cfg, dict):
        raise HFCheckpointError(f"{file}: expected a JSON object")
    return cfg


class SafetensorsReader:
    """Tensors of a safetensors folder (single file or sharded), read by slice."""

    def __init__(self, folder: str):
        try:
            from safetensors import safe_open
        except ImportError:
            raise HFCheckpointError(
                "Hugging Face weights need the safetensors package (pip install -e '.[hf]')"
            ) from None

        self.folder = folder
        index = os.path.join(folder, INDEX_FILE)
        if os.path.isfile(index):
            try:
                with open(index, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
                raise HFCheckpointError(f"{index}: not a safetensors index: {exc}") from None
        else:
            single = os.path.join(folder, SINGLE_FILE)
            if not os.path.isfile(single):
                raise HFCheckpointError(f"{folder}: has neither {SINGLE_FILE} nor {INDEX_FILE}")
            with safe_open(single, framework="pt") as f:
                weight_map = dict.fromkeys(f.keys(), SINGLE_FILE)
        self.weight_map: dict[str, str] = weight_map
        self._open: dict[str, Any] = {}
        self._safe_open = safe_open
        self.bytes_read = 0

    def _file(self, name: str) -> Any:
        if name not in self.weight_map:
            raise HFCheckpointError(f"{self.folder}: has no tensor {name!r}")
        file = os.path.join(self.folder, self.weight_map[name])
        if file not in self._open:
            try:
                self._open[file] = self._safe_open(file, framework="pt")
            except Exception as exc:  # safetensors raises its own error types
                raise HFCheckpointError(f"{file}: cannot open: {exc}") from None
        return self._open[file]

    def shape(self, name: str) -> list[int]:
        return list(self._file(name).get_slice(name).get_shape())

    def read(self, name: str, rows: torch.Tensor | slice, cols: slice) -> torch.Tensor:
        """Rows (a range, or indices: read as their covering range) and columns."""
        part = self._file(name).get_slice(name)
        if isinstance(rows, slice):
            block = part[rows] if len(part.get_shape()) == 1 else part[rows, cols]
            out = block
        else:  # reordered rows of this shard: their covering range, then picked
            lo, hi = int(rows.min()), int(rows.max()) + 1
            block = part[lo:hi] if len(part.get_shape()) == 1 else part[lo:hi, cols]
            out = block[rows - lo]
        self.bytes_read += block.numel() * block.element_size()
        return out

    def close(self) -> None:
        self._open.clear()


def _local_box(param: torch.Tensor) -> tuple[list[int], list[int]]:
    """(shape, global offset) of this rank's part of `param` (a DTensor or a full tensor)."""
    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(
            param.shape, param.device_mesh, param.placements
        )
        return list(shape), list(offset)
    return list(param.shape), [0] * param.dim()


def named_local_params(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, parameter, its local tensor) for every parameter."""
    for name, p in model.named_parameters():
        yield name, p, p.to_local() if isinstance(p, DTensor) else p


@torch.no_grad()
def load_hf_folder(model: torch.nn.Module, adapter: StateDictAdapter, folder: str) -> int:
    """Copy the checkpoint in `folder` into `model` (sharded or not); each rank
    reads only its shards' rows. Returns the bytes this rank read."""
    reader = SafetensorsReader(folder)
    try:
        for name, param, local in named_local_params(model):
            src = adapter.hf_name(name)
            full = reader.shape(src)
            if full != list(param.shape):
                raise HFCheckpointError(
                    f"{folder}: {src} has shape {full}, the model's {name} needs "
                    f"{list(param.shape)}"
                )
            shape, offset = _local_box(param)
            if 0 in shape:
                continue  # this rank holds no part of it
            rows: torch.Tensor | slice = slice(offset[0], offset[0] + shape[0])
            moved = adapter.hf_rows(name, torch.arange(offset[0], offset[0] + shape[0]))
            if moved is not None:
                rows = moved
            cols = slice(offset[1], offset[1] + shape[1]) if len(shape) > 1 else slice(None)
            local.copy_(reader.read(src, rows, cols).to(local.dtype).reshape(local.shape))
        return reader.bytes_read
    finally:
        reader.close()


def write_hf_folder(
    out: str,
    tensors: dict[str, torch.Tensor],
    config: dict[str, Any],
    max_shard_bytes: int = 5 * 2**30,
) -> list[str]:
    """config.json and safetensors (sharded with an index past `max_shard_bytes`)."""
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    files = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for file, shard in zip(files, shards, strict=True):
        save_file(shard, os.path.join(out, file), metadata={"format": "pt"})
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
            "weight_map": {n: f for f, s in zip(files, shards, strict=True) for n in s},
        }
        with open(os.path.join(out, INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
    with open(os.path.join(out, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return files
