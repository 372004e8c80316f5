"""Reversible JSON encoding of a StatefulDataLoader state: the loader state is
saved as a human-readable document beside the checkpoint, never as a pickle,
and torchdata's state holds tuples, tensors, numpy scalars and non-string keys."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch

from zephon import StateError


def to_json(value: Any) -> Any:
    """Make a StatefulDataLoader state JSON-serialisable, reversibly."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [to_json(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k.startswith("__") for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return {"__items__": [[to_json(k), to_json(v)] for k, v in value.items()]}
    if isinstance(value, torch.Tensor):
        return {
            "__tensor__": value.detach().cpu().tolist(),
            "dtype": str(value.dtype).removeprefix("torch."),
        }
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    raise StateError(
        f"hf loader: cannot store a {type(value).__name__} from the dataloader state as JSON"
    )


def from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(from_json(v) for v in value["__tuple__"])
        if "__items__" in value:
            return {from_json(k): from_json(v) for k, v in value["__items__"]}
        if "__tensor__" in value:
            return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
        if "__bytes__" in value:
            return base64.b64decode(value["__bytes__"])
        return {k: from_json(v) for k, v in value.items()}
    return value
