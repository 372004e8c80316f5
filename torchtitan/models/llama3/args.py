"""Llama 3 model hyper-parameters and the named flavors."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1 rotary-frequency scaling for long contexts: low frequencies are
    divided by ``factor``, high ones kept, with a smooth ramp between."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_seq_len: int = 8192


@dataclass(frozen=True)
class ModelArgs:
    # Frozen so the shared flavor table cannot be mutated by accident; derive
    # variants with dataclasses.replace (e.g. vocab_size from the tokenizer).
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    """None = n_heads (plain multi-head attention)."""
    vocab_size: int = 2048
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    ffn_hidden_size: int | None = None
    """Explicit SwiGLU width (a Hugging Face config's intermediate_size); None =
    derived from dim, ffn_dim_multiplier and multiple_of."""
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_seq_len: int = 2048
    """Length of the rotary cache; positions must stay below it."""
    tie_embeddings: bool = False
    attention: Literal["doc_causal", "causal"] = "doc_causal"
    attention_impl: Literal["dense", "flex"] = "dense"
    """How doc_causal is computed: dense SDPA mask, or a FlexAttention block mask."""
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.attention not in ("doc_causal", "causal"):
            raise ValueError(f"attention {self.attention!r}: expected 'doc_causal' or 'causal'")
        if self.attention_impl not in ("dense", "flex"):
            raise ValueError(f"attention_impl {self.attention_impl!r}: expected 'dense' or 'flex'")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        """SwiGLU width as Llama 3 sizes it: 2/3 of 4*dim (three matrices instead
        of two keep the parameter count), scaled, rounded up to multiple_of."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)


LLAMA3_FLAVORS: dict[str, ModelArgs] = {
    # Tiny model for CPU tests and smoke runs.
    "debugmodel": ModelArgs(
        dim=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=2048,
        multiple_of=256,
        rope_theta=10000.0,
        max_seq_len=2048,
    ),
    # Llama 3.2 1B shape.
    "1B": ModelArgs(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        multiple_of=256,
        ffn_dim_multiplier=1.5,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=32.0),
        max_seq_len=8192,
        tie_embeddings=True,
    ),
    # Llama 3.1 8B shape.
    "8B": ModelArgs(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        multiple_of=1024,
        ffn_dim_multiplier=1.3,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=8.0),
        max_seq_len=8192,
    ),
}


def get_model_args(flavor: str, **overrides: object) -> ModelArgs:
    """The named flavor with ``overrides`` applied, e.g.
    ``get_model_args("debugmodel", vocab_size=tok.vocab_size, attention="causal")``."""
    if flavor not in LLAMA3_FLAVORS:
        raise ValueError(
            f"unknown llama3 flavor {flavor!r}: expected one of {list(LLAMA3_FLAVORS)}"
        )
    return dataclasses.replace(LLAMA3_FLAVORS[flavor], **overrides)
