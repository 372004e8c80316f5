"""The Llama 3 model split into pipeline stages, in one process: each process's
model keeps the whole model's parameter names and initial values, and the stages
run in a row compute the whole model's logits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torchtitan.config.job_config import ConfigError
from torchtitan.models.llama3.args import get_model_args
from torchtitan.models.llama3.model import Transformer
from torchtitan.models.llama3.pipeline import layers_per_stage, split_for_pipeline

ARGS = replace(get_model_args("debugmodel", vocab_size=256), n_layers=5, attention="doc_causal")


def whole() -> Transformer:
    model = Transformer(ARGS)
    model.init_weights(torch.Generator().manual_seed(7))
    return model


def pruned(ids: list[int], n_stages: int) -> tuple[Transformer, list[torch.nn.Module]]:
    model = Transformer(ARGS)
    stages = split_for_pipeline(model, ids, n_stages)
    model.init_weights(torch.Generator().manual_seed(7))
    return model, stages


def test_an_uneven_split_gives_the_first_stages_one_block_more():
    assert layers_per_stage(ARGS, 2) == [3, 2]
    assert layers_per_stage(ARGS, 3) == [2, 2, 1]
    assert layers_per_stage(ARGS, 5) == [1] * 5


def test_a_model_that_cannot_split_is_refused_with_every_reason():
    with pytest.raises(ConfigError) as exc:
        layers_per_stage(replace(ARGS, tie_embeddings=True), 6)
    msg = str(exc.value)
    assert "6 pipeline stages" in msg and "5 layers cannot give each of the 6 stages" in msg
    assert "ties its output projection" in msg


@pytest.mark.parametrize(("ids", "n_stages"), [([0], 2), ([1], 2), ([1, 3], 4), ([0, 2], 4)])
def test_each_process_keeps_its_stages_under_the_whole_models_names_and_values(ids, n_stages):
    reference = dict(whole().named_parameters())
    model, stages = pruned(ids, n_stages)
    mine = dict(model.named_parameters())
    counts = layers_per_stage(ARGS, n_stages)
    starts = [sum(counts[:s]) for s in range(n_stages + 1)]
    layers = {i for s in ids for i in range(starts[s], starts[s + 1])}
    expected = {
        name for name in reference
        if (name.startswith("layers.") and int(name.split(".")[1]) in layers)
        or (name.startswith("tok_embeddings") and 0 in ids)
        or (name.split(".")[0] in ("norm", "output") and n_stages - 1 in ids)
    }  # fmt: skip
    assert set(mine) == expected
    for name, p in mine.items():  # the same draws whatever the split
        assert torch.equal(p, reference[name]), name
    assert len(stages) == len(ids)


def test_the_stages_in_a_row_compute_the_whole_models_logits():
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, ARGS.vocab_size, (2, 24), generator=g)
    positions = torch.cat([torch.arange(10), torch.arange(14)]).repeat(2, 1)  # two documents
    expected = whole()(tokens, positions)
    chain = [pruned([s], 3)[1][0] for s in range(3)]
    h = tokens
    for stage in chain:
        h = stage(h, positions=positions)
    assert torch.allclose(h, expected, atol=1e-6, rtol=1e-5)
