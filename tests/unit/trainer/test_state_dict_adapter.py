"""The Llama 3 state-dict adapter without files: config.json <-> args, parameter
names, and the rotary row order (checked against the rotate-half rotation that
Hugging Face's Llama applies). `tests/unit/trainer/test_hf_weights.py` checks the whole path
against `transformers` itself."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torchtitan.models import MODEL_NAMES, get_model_spec
from torchtitan.models.hf_folder import HFCheckpointError
from torchtitan.models.llama3.args import get_model_args
from torchtitan.models.llama3.model import Transformer, apply_rope, build_rope_cache
from torchtitan.models.llama3.state_dict_adapter import (
    Llama3StateDictAdapter,
    args_from_hf_config,
    config_from_model_args,
)

SMALL = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16)


@pytest.mark.parametrize("flavor", ["debugmodel", "1B", "8B"])
def test_config_round_trip(flavor):
    args = get_model_args(flavor)
    doc = config_from_model_args(args)
    back = args_from_hf_config(doc, "config.json")
    assert config_from_model_args(back) == doc
    # The config names the FFN width instead of the rule that derives it.
    derived = dict(ffn_hidden_size=args.ffn_hidden_dim, multiple_of=256, ffn_dim_multiplier=None)
    assert back == dataclasses.replace(args, **derived)


def test_unsupported_configs_are_refused_by_key():
    doc = config_from_model_args(get_model_args("debugmodel"))
    cases = {
        "model_type": ("mistral", "model_type 'mistral' is not supported"),
        "attention_bias": (True, "attention_bias = True is not supported"),
        "rope_parameters": ({"rope_type": "yarn"}, "rope scaling type 'yarn'"),
        "head_dim": (7, "head_dim 7 x num_attention_heads"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(HFCheckpointError, match=f"^x/config.json: {message}"):
            args_from_hf_config({**doc, key: value}, "x/config.json")
    with pytest.raises(HFCheckpointError, match="missing 'vocab_size'"):
        args_from_hf_config({k: v for k, v in doc.items() if k != "vocab_size"}, "c.json")


@pytest.mark.parametrize("tie", [False, True])
def test_names_and_layout_round_trip(tie):
    args = get_model_args("debugmodel", **SMALL, tie_embeddings=tie)
    model = Transformer(args)
    model.init_weights(torch.Generator().manual_seed(0))
    state = model.state_dict()
    adapter = Llama3StateDictAdapter(args)
    hf = adapter.to_hf(state)
    assert ("lm_head.weight" in hf) == (not tie)
    assert {"model.embed_tokens.weight", "model.norm.weight"} <= set(hf)
    pairs = {
        "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj",
        "feed_forward.w3": "mlp.up_proj", "attention.wv": "self_attn.v_proj",
        "attention.wo": "self_attn.o_proj", "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }  # fmt: skip
    for ours, theirs in pairs.items():
        assert torch.equal(hf[f"model.layers.1.{theirs}.weight"], state[f"layers.1.{ours}.weight"])
    # q/k rows are permuted, nothing else is.
    q = "layers.0.attention.wq.weight"
    assert not torch.equal(hf["model.layers.0.self_attn.q_proj.weight"], state[q])
    back = adapter.from_hf(hf)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)
    with pytest.raises(HFCheckpointError, match="'layers.0.attention.bogus.weight'"):
        adapter.hf_name("layers.0.attention.bogus.weight")


def test_shard_rows_map_to_the_converted_rows():
    """What the sharded reader relies on: rows r..s of a parameter are rows
    `hf_rows(name, r..s)` of the converted tensor."""
    args = get_model_args("debugmodel", **SMALL)
    adapter = Llama3StateDictAdapter(args)
    for name, rows in (("layers.1.attention.wk.weight", 16), ("layers.1.attention.wq.weight", 32)):
        w = torch.randn(rows, args.dim, generator=torch.Generator().manual_seed(rows))
        hf = adapter.to_hf({name: w})[adapter.hf_name(name)]
        shard = torch.arange(rows // 2, rows)  # the second of two row shards
        assert torch.equal(hf[adapter.hf_rows(name, shard)], w[shard])
    assert adapter.hf_rows("layers.0.attention.wv.weight", torch.arange(4)) is None


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face Llama's rotation: pairs (i, i + head_dim/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def test_converted_query_rows_rotate_like_hugging_face():
    """Queries of converted weights, rotated the rotate-half way, are this model's
    rotated queries with each head's features in Hugging Face's order."""
    args = get_model_args("debugmodel", **SMALL)
    adapter = Llama3StateDictAdapter(args)
    name = "layers.0.attention.wq.weight"
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(args.n_heads * args.head_dim, args.dim, generator=gen)
    x = torch.randn(1, 5, args.dim, generator=gen)
    rope = build_rope_cache(args)[:5].unsqueeze(0)  # [1, S, D/2, 2]
    ours = apply_rope((x @ w.T).view(1, 5, args.n_heads, args.head_dim), rope)
    w_hf = adapter.to_hf({name: w})[adapter.hf_name(name)]
    q_hf = (x @ w_hf.T).view(1, 5, args.n_heads, args.head_dim)
    cos, sin = rope[..., 0].unsqueeze(2), rope[..., 1].unsqueeze(2)
    theirs = _rotate_half(q_hf, cos, sin)
    # Feature 2i+j of a head here is feature j*D/2 + i there.
    order = adapter.hf_rows(name, torch.arange(args.head_dim))
    assert torch.allclose(theirs[..., order], ours, atol=1e-5)


def test_registry():
    assert MODEL_NAMES == ("llama3", "vlm", "moe")
    spec = get_model_spec("llama3")
    assert spec.name == "llama3" and set(spec.flavors) == {"debugmodel", "1B", "8B"}
    args = spec.model_args("debugmodel", vocab_size=300)
    assert isinstance(spec.state_dict_adapter(args), Llama3StateDictAdapter)
    with torch.device("meta"):
        assert isinstance(spec.build(args), Transformer)
    with pytest.raises(ValueError, match="unknown model 'gpt': expected one of 'llama3', 'vlm'"):
        get_model_spec("gpt")
