"""Training FLOPs per token of the Llama 3 model, for the MFU the trainer logs."""

from __future__ import annotations

from torchtitan.models.llama3.args import ModelArgs


def flops_per_token(args: ModelArgs, seq_len: int) -> float:
    """Training FLOPs per token: 6 x the matmul parameters (forward + backward)
    plus attention scores, 12 x layers x dim x seq_len (as upstream; the causal
    half is not discounted). Embedding lookups are free; the output projection
    counts (tied or not)."""
    h = args.dim
    kv = args.kv_heads * args.head_dim
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * args.ffn_hidden_dim
    matmul_params = args.n_layers * per_layer + h * args.vocab_size
    return 6 * matmul_params + 12 * args.n_layers * h * seq_len
