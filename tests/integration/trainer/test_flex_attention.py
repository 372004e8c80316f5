"""FlexAttention's document block mask computes the same function as the dense
[rows, 1, S, S] mask: same logits and losses on real packed rows and on rows
with padding and mid-document starts (CPU: forward only, eager)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from harness.train import REPO, ensure_sample_data
from torchtitan.components.loss import cross_entropy_sum
from torchtitan.models.llama3 import model as model_module
from torchtitan.models.llama3.args import get_model_args
from torchtitan.models.llama3.flex import document_ids
from torchtitan.models.llama3.model import Transformer
from zephon import ZephonLoader, load_recipe

TOL = 1e-5


FLEX_CALLS = Counter()


def loss_of(model: Transformer, impl: str, tokens, positions, labels) -> float:
    """The loss with attention `impl`; checks that exactly that path ran (a
    dispatch that ignored the setting would compare dense with dense)."""
    model.args = dataclasses.replace(model.args, attention_impl=impl)
    FLEX_CALLS.clear()
    with torch.no_grad():
        loss_sum, n = cross_entropy_sum(model(tokens, positions), labels)
    expected = len(model.layers) if impl == "flex" else 0
    assert FLEX_CALLS["attention"] == expected, (impl, FLEX_CALLS)
    return float(loss_sum / n)


@pytest.fixture(autouse=True)
def count_flex_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count the model's calls of the FlexAttention kernel wrapper."""
    flex = model_module.flex_doc_attention

    def counted(*args, **kwargs):
        FLEX_CALLS["attention"] += 1
        return flex(*args, **kwargs)

    monkeypatch.setattr(model_module, "flex_doc_attention", counted)


def test_flex_matches_dense_on_packed_rows():
    ensure_sample_data()
    tok_path = str(REPO / "assets" / "tokenizer" / "tokenizer.json")
    recipe = load_recipe(str(REPO / "train_configs" / "data" / "sample_mix.toml"))
    loader = ZephonLoader(recipe, tok_path, 128, 8, 8, 0, 1, num_workers=0)
    try:
        mb = loader.next_batch().micro_batches(8)[0]
    finally:
        loader.close()
    torch.manual_seed(0)
    model = Transformer(get_model_args("debugmodel", vocab_size=8192))
    model.init_weights(torch.Generator().manual_seed(0))
    tokens, positions, labels = mb.input_ids, mb.positions, mb.labels
    assert int((positions == 0).sum()) > positions.shape[0]  # several documents per row
    dense = loss_of(model, "dense", tokens, positions, labels)
    flex = loss_of(model, "flex", tokens, positions, labels)
    assert abs(dense - flex) <= TOL, (dense, flex)

    # A row continuing a document (no 0 at its start), one ending in padding (-1).
    s = 128
    positions = torch.stack(
        [
            torch.cat([torch.arange(50, 90), torch.arange(88)]),
            torch.cat([torch.arange(70), torch.arange(40), torch.full((18,), -1)]),
        ]
    )
    tokens = torch.randint(0, 8192, (2, s))
    labels = torch.where(positions >= 0, torch.randint(0, 8192, (2, s)), -100)
    dense = loss_of(model, "dense", tokens, positions, labels)
    flex = loss_of(model, "flex", tokens, positions, labels)
    assert abs(dense - flex) <= TOL, (dense, flex)


def test_document_ids_restart_at_every_zero():
    positions = torch.tensor([[3, 4, 0, 1, 0, -1, -1], [0, 1, 2, 0, 1, 2, 3]])
    assert document_ids(positions).tolist() == [[0, 0, 1, 1, 2, 2, 2], [1, 1, 1, 2, 2, 2, 2]]
