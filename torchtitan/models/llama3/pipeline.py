"""How the Llama 3 model splits into pipeline stages.

Stage `s` of `n` holds a contiguous run of the blocks; the first also holds the
token embeddings, the last the final norm and the output projection. A layer
count that does not divide evenly gives the first stages one block more (the
last stage already pays for the output projection).

A process keeps one `Transformer` holding only its stages' modules, under their
own names (`layers.5`, not `layers.0` of a stage): its state dict, optimizer and
checkpoint keys are the whole model's, restricted to what this process holds,
so a checkpoint written at one pipeline degree loads at any other. Each of its
stages is a `TransformerStage`, a view over those same modules that runs one
stage's computation; the pipeline schedule calls the stages, never the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from torchtitan.config.job_config import ConfigError
from torchtitan.models.llama3.args import ModelArgs
from torchtitan.models.llama3.model import Transformer


def layers_per_stage(args: ModelArgs, n_stages: int) -> list[int]:
    """How many blocks each stage holds; a ConfigError when the model cannot split."""
    problems = []
    if args.n_layers < n_stages:
        problems.append(
            f"the model's {args.n_layers} layers cannot give each of the {n_stages} stages "
            "one; use fewer stages (degree or stages per rank) or a deeper flavor"
        )
    if args.tie_embeddings:
        problems.append(
            "the model ties its output projection to the embeddings, which the first and "
            "the last stage would both need"
        )
    if problems:
        raise ConfigError(f"parallelism: {n_stages} pipeline stages: " + "; ".join(problems))
    base, extra = divmod(args.n_layers, n_stages)
    return [base + (s < extra) for s in range(n_stages)]


class TransformerStage(nn.Module):
    """One stage's computation over modules the process's model owns.

    The first stage reads token ids, the others the hidden state the previous
    stage sent; every stage reads the micro-batch's `positions` (each stage gets
    them from the schedule, so only the hidden state travels between stages).
    The last stage returns logits, the others the hidden state."""

    def __init__(self, model: Transformer, layer_ids: Sequence[int], first: bool, last: bool):
        super().__init__()
        # The model is not registered as a child: its parameters belong to it, and
        # this stage registers only the modules it runs.
        self._model = (model,)
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in layer_ids})
        self.norm = model.norm if last else None
        self.output = model.output if last else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        model = self._model[0]
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        # The whole positions (a TP rank's hidden state holds a sequence shard).
        rope, mask = model.rope_and_mask(positions.shape[1], positions)
        for block in self.layers.values():
            h = block(h, rope, mask)
        return model.project(h) if self.norm is not None else h


def split_for_pipeline(
    model: Transformer, stage_ids: Sequence[int], n_stages: int
) -> list[TransformerStage]:
    """Prune `model` (meta or real, before parallelisation) to the modules of
    `stage_ids`, and return one `TransformerStage` per id, in that order."""
    counts = layers_per_stage(model.args, n_stages)
    starts = [sum(counts[:s]) for s in range(n_stages + 1)]
    kept: set[int] = set()
    for s in stage_ids:
        kept.update(range(starts[s], starts[s + 1]))
    for i in range(model.args.n_layers):
        if i not in kept:
            del model.layers[str(i)]
    if 0 not in stage_ids:
        model.tok_embeddings = None
    if n_stages - 1 not in stage_ids:
        model.norm = None
        model.output = None
    return [
        TransformerStage(model, range(starts[s], starts[s + 1]), s == 0, s == n_stages - 1)
        for s in stage_ids
    ]
