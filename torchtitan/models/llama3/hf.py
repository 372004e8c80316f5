"""Hugging Face Llama checkpoints in and out: config.json <-> ModelArgs, parameter
names, and the rotary layout of the query/key projections.

Rotary layout: this model rotates adjacent pairs (2i, 2i+1) of each head (Meta's
layout); Hugging Face's Llama rotates halves (i, i + head_dim/2), and its
converted checkpoints have the rows of q_proj / k_proj permuted to match. Row
2i+j of a head here is row j*head_dim/2 + i of the same head there.

Loading reads, for every parameter, only the rows (and columns) of this rank's
shard, with safetensors slices; a sharded checkpoint's index file says which
file holds which tensor.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from torchtitan.models.llama3.args import ModelArgs, RopeScaling

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ROPE_TYPES = ("default", "llama3")


class HFCheckpointError(ValueError):
    """A Hugging Face folder that cannot be loaded or written, with the reason."""


def is_hf_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, CONFIG_FILE)) and (
        os.path.isfile(os.path.join(path, SINGLE_FILE))
        or os.path.isfile(os.path.join(path, INDEX_FILE))
    )


# --------------------------------------------------------------------------- config


def read_config(folder: str) -> dict[str, Any]:
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


def _rope(cfg: dict[str, Any], file: str) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from transformers 5 `rope_parameters` or 4.x `rope_theta`/`rope_scaling`."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    merged = {**scaling, **params}
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise HFCheckpointError(
            f"{file}: rope scaling type {kind!r} is not supported (supported: "
            f"{', '.join(ROPE_TYPES)})"
        )
    if kind == "default":
        return theta, None
    try:
        return theta, RopeScaling(
            factor=float(merged["factor"]),
            low_freq_factor=float(merged["low_freq_factor"]),
            high_freq_factor=float(merged["high_freq_factor"]),
            original_max_seq_len=int(merged["original_max_position_embeddings"]),
        )
    except KeyError as exc:
        raise HFCheckpointError(f"{file}: llama3 rope scaling lacks {exc.args[0]!r}") from None


def model_args_from_config(folder: str, **overrides: Any) -> ModelArgs:
    """ModelArgs of the Llama model in `folder`; refuses settings this model lacks."""
    file = os.path.join(folder, CONFIG_FILE)
    cfg = read_config(folder)

    def need(key: str) -> Any:
        if key not in cfg:
            raise HFCheckpointError(f"{file}: missing {key!r}")
        return cfg[key]

    if cfg.get("model_type") != "llama":
        raise HFCheckpointError(
            f"{file}: model_type {cfg.get('model_type')!r} is not supported (expected 'llama')"
        )
    refused = {
        "hidden_act": ("silu", cfg.get("hidden_act", "silu")),
        "attention_bias": (False, cfg.get("attention_bias", False)),
        "mlp_bias": (False, cfg.get("mlp_bias", False)),
    }
    for key, (want, got) in refused.items():
        if got != want:
            raise HFCheckpointError(f"{file}: {key} = {got!r} is not supported (only {want!r})")
    dim, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    head_dim = cfg.get("head_dim")
    if head_dim is not None and int(head_dim) * heads != dim:
        raise HFCheckpointError(
            f"{file}: head_dim {head_dim} x num_attention_heads {heads} != hidden_size {dim}; "
            "only head_dim = hidden_size / num_attention_heads is supported"
        )
    theta, scaling = _rope(cfg, file)
    try:
        args = ModelArgs(
            dim=dim,
            n_layers=int(need("num_hidden_layers")),
            n_heads=heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            vocab_size=int(need("vocab_size")),
            ffn_hidden_size=int(need("intermediate_size")),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            init_std=float(cfg.get("initializer_range", 0.02)),
            **overrides,
        )
    except ValueError as exc:
        raise HFCheckpointError(f"{file}: {exc}") from None
    return args


def config_from_model_args(args: ModelArgs, dtype: str = "float32") -> dict[str, Any]:
    """A transformers LlamaConfig document for `args`."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": args.rope_theta}
    if args.rope_scaling is not None:
        s = args.rope_scaling
        rope = {
            "rope_type": "llama3",
            "rope_theta": args.rope_theta,
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_seq_len,
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": args.tie_embeddings,
        "initializer_range": args.init_std,
        "dtype": dtype,
    }


# --------------------------------------------------------------------------- names


_LAYER = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAME = re.compile(r"^layers\.(\d+)\.(.+)$")


def hf_name(name: str) -> str:
    """The Hugging Face name of this model's parameter `name`."""
    if name in _TOP:
        return _TOP[name]
    m = _LAYER_NAME.match(name)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}"
    raise HFCheckpointError(f"parameter {name!r} has no Hugging Face Llama name")


def rotary_heads(name: str, args: ModelArgs) -> int:
    """Heads whose rows need the rotary layout conversion (0: none)."""
    if name.endswith("attention.wq.weight"):
        return args.n_heads
    if name.endswith("attention.wk.weight"):
        return args.kv_heads
    return 0


def hf_rows(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Hugging Face row of each of this model's q/k rows (same head, halves layout)."""
    head, k = rows // head_dim, rows % head_dim
    return head * head_dim + (k % 2) * (head_dim // 2) + k // 2


def to_hf_layout(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Full q/k weight: adjacent-pair rows -> Hugging Face half rows."""
    out = torch.empty_like(w)
    out[hf_rows(torch.arange(w.shape[0]), w.shape[0] // heads)] = w
    return out


# --------------------------------------------------------------------------- reading


class HFReader:
    """Tensors of a Hugging Face safetensors folder (single file or sharded), read by slice."""

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
        else:  # q/k rows of this shard: their covering range, then reordered
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
def load_hf_weights(model: torch.nn.Module, args: ModelArgs, folder: str) -> int:
    """Copy the Hugging Face checkpoint in `folder` into `model` (sharded or not);
    each rank reads only its shards' rows. Returns the bytes this rank read."""
    reader = HFReader(folder)
    try:
        for name, param, local in named_local_params(model):
            src = hf_name(name)
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
            heads = rotary_heads(name, args)
            if heads:
                rows = hf_rows(torch.arange(offset[0], offset[0] + shape[0]), args.head_dim)
            cols = slice(offset[1], offset[1] + shape[1]) if len(shape) > 1 else slice(None)
            local.copy_(reader.read(src, rows, cols).to(local.dtype).reshape(local.shape))
        return reader.bytes_read
    finally:
        reader.close()


# --------------------------------------------------------------------------- writing


def to_hf_state(state: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Full (unsharded) parameters of this model -> Hugging Face names and layout."""
    out = {}
    for name, t in state.items():
        heads = rotary_heads(name, args)
        out[hf_name(name)] = (to_hf_layout(t, heads) if heads else t).contiguous()
    return out


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
