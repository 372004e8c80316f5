"""Mixture-of-experts decoder hyper-parameters and the named flavors.

The attention, norms, rotary embeddings and vocabulary are Llama 3's (`ModelArgs`);
the feed-forward of every layer after the first `n_dense_layers` is a mixture of
`n_experts` routed experts (each token goes to its `top_k`, none is dropped) plus
`n_shared_experts` that every token goes through.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from torchtitan.models.llama3.args import ModelArgs


@dataclass(frozen=True)
class MoEArgs(ModelArgs):
    n_experts: int = 8
    top_k: int = 2
    expert_hidden_dim: int = 256
    """SwiGLU width of one routed (and one shared) expert."""
    n_shared_experts: int = 0
    n_dense_layers: int = 0
    """The first layers keep a dense SwiGLU feed-forward of `ffn_hidden_dim`."""
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    """Router scores: softmax over the experts (Mixtral, Qwen3), or an independent
    sigmoid per expert (DeepSeek-V3)."""
    route_norm: bool = True
    """Renormalise the chosen experts' scores to sum to 1 (sigmoid scores mostly)."""
    route_scale: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k {self.top_k}: expected 1 to the expert count {self.n_experts}")
        if self.score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func {self.score_func!r}: expected 'softmax' or 'sigmoid'")
        if not 0 <= self.n_dense_layers <= self.n_layers:
            raise ValueError(f"n_dense_layers {self.n_dense_layers}: expected 0 to n_layers")

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.n_dense_layers


# Tiny model for CPU tests and smoke runs: 8 experts, 2 a token, one shared.
_DEBUG = MoEArgs(
    dim=128,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=2048,
    multiple_of=256,
    max_seq_len=2048,
    n_experts=8,
    top_k=2,
    expert_hidden_dim=128,
    n_shared_experts=1,
    n_dense_layers=1,
)

MOE_FLAVORS: dict[str, MoEArgs] = {
    "debugmodel": _DEBUG,
    # The same with DeepSeek-V3's sigmoid router (renormalised top-k scores).
    "debugmodel_sigmoid": dataclasses.replace(_DEBUG, score_func="sigmoid"),
    # A small GPU shape: 1.75B parameters with the Llama 3 vocabulary, 0.43B of them
    # in the matmuls a token goes through (32 experts, 4 a token, one shared).
    "1.7B": MoEArgs(
        dim=1024,
        n_layers=16,
        n_heads=16,
        n_kv_heads=8,
        vocab_size=128256,
        multiple_of=256,
        rope_theta=500000.0,
        max_seq_len=8192,
        n_experts=32,
        top_k=4,
        expert_hidden_dim=1024,
        n_shared_experts=1,
        n_dense_layers=1,
        tie_embeddings=True,
    ),
}


def get_model_args(flavor: str, **overrides: object) -> MoEArgs:
    """The named flavor with ``overrides`` applied (e.g. vocab_size from the tokenizer)."""
    if flavor not in MOE_FLAVORS:
        raise ValueError(f"unknown moe flavor {flavor!r}: expected one of {list(MOE_FLAVORS)}")
    return dataclasses.replace(MOE_FLAVORS[flavor], **overrides)
