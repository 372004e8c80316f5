import dataclasses
from collections import Counter

import pytest
import torch

from torchtitan.components.loss import cross_entropy_sum
from torchtitan.models.llama3.args import LLAMA3_FLAVORS, ModelArgs, get_model_args
from torchtitan.models.llama3.model import FeedForward, Transformer, document_causal_mask
from torchtitan.models.llama3.parallelize import apply_activation_checkpointing
from torchtitan.models.spec import count_parameters

VOCAB = 256


def debug_model(seed: int = 0, **overrides: object) -> Transformer:
    args = get_model_args("debugmodel", vocab_size=VOCAB, **overrides)
    model = Transformer(args)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


@pytest.mark.parametrize("flavor,expected", [("1B", 1.236e9), ("8B", 8.030e9)])
def test_parameter_counts_on_meta(flavor: str, expected: float) -> None:
    with torch.device("meta"):
        model = Transformer(LLAMA3_FLAVORS[flavor])
    assert abs(count_parameters(model) - expected) / expected < 0.005


def test_ffn_hidden_dims() -> None:
    assert LLAMA3_FLAVORS["1B"].ffn_hidden_dim == 8192
    assert LLAMA3_FLAVORS["8B"].ffn_hidden_dim == 14336


def test_forward_shape_and_gqa_shapes() -> None:
    model = debug_model()
    args = model.args
    attn = model.layers["0"].attention
    assert (args.n_heads, args.kv_heads, args.head_dim) == (4, 2, 32)
    assert attn.wq.weight.shape == (args.n_heads * args.head_dim, args.dim)
    assert attn.wk.weight.shape == (args.kv_heads * args.head_dim, args.dim)
    assert attn.wv.weight.shape == (args.kv_heads * args.head_dim, args.dim)
    tokens = torch.randint(0, VOCAB, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, VOCAB)
    assert torch.isfinite(logits).all()


def test_vocab_override_and_frozen_flavors() -> None:
    args = dataclasses.replace(LLAMA3_FLAVORS["debugmodel"], vocab_size=300)
    assert Transformer(args).tok_embeddings.weight.shape == (300, 128)
    with pytest.raises(dataclasses.FrozenInstanceError):
        LLAMA3_FLAVORS["debugmodel"].vocab_size = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown llama3 flavor"):
        get_model_args("70B")
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelArgs(dim=128, n_heads=4, n_kv_heads=3)


def test_document_causal_mask() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    mask = document_causal_mask(positions)[0, 0]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 0, 0, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def packed_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    doc_a = torch.randint(0, VOCAB, (1, 11), generator=gen)
    doc_b = torch.randint(0, VOCAB, (1, 13), generator=gen)
    tokens = torch.cat([doc_a, doc_b], dim=1)
    positions = torch.cat([torch.arange(11), torch.arange(13)]).unsqueeze(0)
    return doc_a, doc_b, tokens, positions


def test_doc_causal_packed_equals_separate() -> None:
    model = debug_model()
    doc_a, doc_b, tokens, positions = packed_inputs()
    with torch.no_grad():
        packed = model(tokens, positions)
        alone_a = model(doc_a, torch.arange(11).unsqueeze(0))
        alone_b = model(doc_b)  # positions=None behaves like a single document
    torch.testing.assert_close(packed[:, :11], alone_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[:, 11:], alone_b, atol=1e-5, rtol=0)


def test_causal_path_ignores_documents() -> None:
    doc_model = debug_model()
    causal_model = debug_model(attention="causal")
    doc_a, _, tokens, positions = packed_inputs()
    with torch.no_grad():
        doc_logits = doc_model(tokens, positions)
        causal_logits = causal_model(tokens, positions)
        # Same weights: identical on the first document, different on the second.
        torch.testing.assert_close(causal_logits[:, :11], doc_logits[:, :11], atol=1e-5, rtol=0)
        assert (causal_logits[:, 11:] - doc_logits[:, 11:]).abs().max() > 1e-3
        # The causal path equals no positions at all.
        torch.testing.assert_close(causal_logits, causal_model(tokens), atol=0, rtol=0)


def test_init_weights_deterministic_and_meta() -> None:
    a = debug_model(seed=5)
    b = debug_model(seed=5)
    c = debug_model(seed=6)
    with torch.device("meta"):
        d = Transformer(a.args)
    d.to_empty(device="cpu")
    d.init_weights(torch.Generator().manual_seed(5))
    sa, sc, sd = a.state_dict(), c.state_dict(), d.state_dict()
    assert set(sa) == set(sd)
    for name, value in b.state_dict().items():
        assert torch.equal(sa[name], value), name
        assert torch.equal(sa[name], sd[name]), name
    assert not torch.equal(sa["tok_embeddings.weight"], sc["tok_embeddings.weight"])
    assert torch.equal(a.rope_cache, d.rope_cache)
    assert "rope_cache" not in sa  # non-persistent
    assert torch.all(sa["layers.0.attention_norm.weight"] == 1)
    assert sa["tok_embeddings.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    assert sa["layers.0.attention.wo.weight"].std().item() == pytest.approx(
        0.02 / (2 * a.args.n_layers) ** 0.5, rel=0.05
    )


def test_tied_embeddings() -> None:
    model = debug_model(tie_embeddings=True)
    assert model.output is None
    untied = debug_model()
    diff = count_parameters(untied) - count_parameters(model)
    assert diff == VOCAB * model.args.dim
    assert model(torch.randint(0, VOCAB, (1, 8))).shape == (1, 8, VOCAB)


def test_activation_checkpointing_same_grads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same gradients with and without activation checkpointing, and the
    checkpointing happened: the forward pass kept a fraction of the tensors for
    backward, and each block's feed-forward ran again in backward (the
    recomputation). A flag that did nothing would pass the gradient check alone."""
    tokens = torch.randint(0, VOCAB, (2, 32))
    labels = torch.randint(0, VOCAB, (2, 32))
    positions = torch.cat([torch.arange(20), torch.arange(12)]).repeat(2, 1)
    ffn_calls = Counter()
    ffn_forward = FeedForward.forward

    def counted(self: FeedForward, x: torch.Tensor) -> torch.Tensor:
        ffn_calls["n"] += 1
        return ffn_forward(self, x)

    # Patched on the class: module hooks do not fire when checkpoint recomputes.
    monkeypatch.setattr(FeedForward, "forward", counted)
    grads, work = [], []
    for ac in (False, True):
        model = debug_model()
        if ac:
            apply_activation_checkpointing(model)
        saved = Counter()

        def keep(t: torch.Tensor, saved: Counter = saved) -> torch.Tensor:
            saved["n"] += 1
            return t

        ffn_calls.clear()
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            loss, n = cross_entropy_sum(model(tokens, positions), labels)
        in_forward = ffn_calls["n"]
        (loss / n).backward()
        work.append((in_forward, ffn_calls["n"] - in_forward, saved["n"]))
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    layers = len(model.layers)
    (plain_fwd, plain_bwd, plain_saved), (ac_fwd, ac_bwd, ac_saved) = work
    assert (plain_fwd, plain_bwd, ac_fwd, ac_bwd) == (layers, 0, layers, layers), work
    assert ac_saved < plain_saved / 4, work  # block inputs only, not their activations
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


def test_cross_entropy_sum_ignores_index() -> None:
    logits = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    labels = torch.tensor([[1, -100, 2], [0, 4, -100]])
    loss_sum, n_valid = cross_entropy_sum(logits, labels)
    assert loss_sum.dtype == torch.float32 and n_valid.item() == 4
    keep = labels != -100
    ref = torch.nn.functional.cross_entropy(logits.float()[keep], labels[keep], reduction="sum")
    torch.testing.assert_close(loss_sum, ref)
