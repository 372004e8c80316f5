"""Model FLOPs per token agree with the parameters the model actually has."""

from __future__ import annotations

import pytest
import torch

from torchtitan.components.flops import model_flops_utilisation
from torchtitan.models.llama3.args import get_model_args
from torchtitan.models.llama3.flops import flops_per_token
from torchtitan.models.llama3.model import RMSNorm, Transformer


@pytest.mark.parametrize("flavor", ["debugmodel", "1B", "8B"])
def test_flops_per_token_counts_every_matmul_parameter(flavor):
    args = get_model_args(flavor)
    with torch.device("meta"):
        model = Transformer(args)
    norms = sum(m.weight.numel() for m in model.modules() if isinstance(m, RMSNorm))
    # Every parameter but the embedding lookup and the norms is a matmul weight;
    # a tied model still multiplies by the embedding matrix once, in the output.
    matmul = sum(p.numel() for p in model.parameters()) - norms - args.vocab_size * args.dim
    if args.tie_embeddings:
        matmul += args.vocab_size * args.dim
    seq = 2048
    assert flops_per_token(args, seq) == 6 * matmul + 12 * args.n_layers * args.dim * seq


def test_mfu_is_only_reported_on_gpus():
    flops = flops_per_token(get_model_args("debugmodel"), 256)
    assert model_flops_utilisation(flops, 8192, 0.5, 2, torch.device("cpu")) is None
