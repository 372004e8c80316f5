"""Tiny Hugging Face Llama models for the weight conversion tests (unit and
integration), and the logits both sides are compared on. Needs `transformers`
(the tests skip without it)."""

from __future__ import annotations

from pathlib import Path

import torch

TOL = 1e-4  # float32, logits of order 1
VOCAB = 8192  # the committed tokenizer's


def hf_model(
    folder: Path, tie: bool, rope: dict | None = None, vocab: int = VOCAB
) -> torch.nn.Module:
    """A tiny random LlamaForCausalLM saved by transformers in `folder` (sharded, with
    an index), its norms away from 1 so that a wrong mapping cannot hide."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 5000.0},
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, max_shard_size="200KB")
    return model


def logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(tokens)
    return out.logits if hasattr(out, "logits") else out
