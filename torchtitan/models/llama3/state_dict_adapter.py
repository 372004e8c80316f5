"""Llama 3 <-> Hugging Face `LlamaForCausalLM`, as pure conversions: config.json
<-> ModelArgs, parameter names, and the rotary layout of the query/key rows.

Rotary layout: this model rotates adjacent pairs (2i, 2i+1) of each head (Meta's
layout); Hugging Face's Llama rotates halves (i, i + head_dim/2), and its
converted checkpoints have the rows of q_proj / k_proj permuted to match. Row
2i+j of a head here is row j*head_dim/2 + i of the same head there.

Files are read and written by the model-agnostic `torchtitan/models/hf_folder.py`;
the last two functions here only bind this adapter to it.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from torchtitan.models.hf_folder import (
    CONFIG_FILE,
    HFCheckpointError,
    load_hf_folder,
    read_config,
)
from torchtitan.models.llama3.args import ModelArgs, RopeScaling

ROPE_TYPES = ("default", "llama3")

# --------------------------------------------------------------------------- config


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


def args_from_hf_config(cfg: dict[str, Any], file: str, **overrides: Any) -> ModelArgs:
    """ModelArgs of a Llama config.json document (`file` names it in errors);
    refuses settings this model lacks."""

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
        return ModelArgs(
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


# --------------------------------------------------------------------------- names and rows


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
_HF_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_FROM_LAYER = {v: k for k, v in _LAYER.items()}
_FROM_TOP = {v: k for k, v in _TOP.items()}


def hf_rows(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Hugging Face row of each of this model's q/k rows (same head, halves layout)."""
    head, k = rows // head_dim, rows % head_dim
    return head * head_dim + (k % 2) * (head_dim // 2) + k // 2


class Llama3StateDictAdapter:
    """Parameter names and q/k row order between this model and Hugging Face's Llama."""

    def __init__(self, args: ModelArgs) -> None:
        self.args = args

    def hf_name(self, name: str) -> str:
        if name in _TOP:
            return _TOP[name]
        m = _LAYER_NAME.match(name)
        if m and m.group(2) in _LAYER:
            return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}"
        raise HFCheckpointError(f"parameter {name!r} has no Hugging Face Llama name")

    def name_from_hf(self, hf: str) -> str:
        if hf in _FROM_TOP:
            return _FROM_TOP[hf]
        m = _HF_LAYER_NAME.match(hf)
        if m and m.group(2) in _FROM_LAYER:
            return f"layers.{m.group(1)}.{_FROM_LAYER[m.group(2)]}"
        raise HFCheckpointError(f"tensor {hf!r} is not a parameter of this Llama model")

    def _rotary(self, name: str) -> bool:
        return name.endswith(("attention.wq.weight", "attention.wk.weight"))

    def hf_rows(self, name: str, rows: torch.Tensor) -> torch.Tensor | None:
        return hf_rows(rows, self.args.head_dim) if self._rotary(name) else None

    def to_hf(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in state.items():
            if self._rotary(name):
                moved = torch.empty_like(t)
                moved[hf_rows(torch.arange(t.shape[0]), self.args.head_dim)] = t
                t = moved
            out[self.hf_name(name)] = t.contiguous()
        return out

    def from_hf(self, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for hf, t in hf_state.items():
            name = self.name_from_hf(hf)
            if self._rotary(name):
                t = t[hf_rows(torch.arange(t.shape[0]), self.args.head_dim)]
            out[name] = t.contiguous()
        return out


def to_hf_state(state: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Full (unsharded) parameters of this model -> Hugging Face names and layout."""
    return Llama3StateDictAdapter(args).to_hf(state)


# --------------------------------------------------------------------------- bound to files


def model_args_from_config(folder: str, **overrides: Any) -> ModelArgs:
    """ModelArgs of the Llama model in `folder` (reads its config.json)."""
    return args_from_hf_config(read_config(folder), os.path.join(folder, CONFIG_FILE), **overrides)


def load_hf_weights(model: torch.nn.Module, args: ModelArgs, folder: str) -> int:
    """Copy the Hugging Face Llama checkpoint in `folder` into `model` (sharded or
    not); each rank reads only its shards' rows. Returns the bytes this rank read."""
    return load_hf_folder(model, Llama3StateDictAdapter(args), folder)
