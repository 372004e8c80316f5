"""What the trainer needs from a model, written down as data: the model spec.

The trainer, the initial-weights loader and the step-folder tools look a model
up by `[model] name` (see `torchtitan/models/__init__.py`) and use only these
entries, so nothing model-specific sits in `train.py`, `distributed/` or
`components/`, and a second model is one new folder plus one registry line.
Model arguments are the model's own frozen dataclass; the trainer reads only
`vocab_size` and `max_seq_len` from them and replaces `attention_impl`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from torchtitan.distributed.mesh import ParallelDims


class StateDictAdapter(Protocol):
    """A model's parameters <-> a Hugging Face checkpoint's tensors, without files.

    The generic safetensors reader (`torchtitan/models/hf_folder.py`) asks it
    where each of this rank's rows lives; the exporter converts full tensors."""

    def hf_name(self, name: str) -> str:
        """The checkpoint tensor that holds this model's parameter `name`."""
        ...

    def hf_rows(self, name: str, rows: torch.Tensor) -> torch.Tensor | None:
        """The checkpoint rows holding rows `rows` of parameter `name`; None when
        they are the same rows (no layout change)."""
        ...

    def to_hf(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full (unsharded) parameters -> checkpoint names and layout."""
        ...

    def from_hf(self, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Checkpoint tensors -> this model's names and layout (inverse of `to_hf`)."""
        ...


@dataclass(frozen=True)
class PipelineSplit:
    """How a model splits into pipeline stages (its folder's `pipeline.py`)."""

    check: Callable[[Any, int], list[int]]
    """(args, number of stages) -> blocks per stage; one ConfigError naming every
    reason the model cannot split so."""
    split: Callable[[torch.nn.Module, Sequence[int], int], list[torch.nn.Module]]
    """(model, this process's stage indices, number of stages) -> one module per
    index, called as `stage(x, **keywords)`; prunes the model to those stages'
    modules, keeping their names (checkpoints load across pipeline degrees)."""
    inputs: Callable[[Any, torch.device], tuple[torch.Tensor, dict[str, Any]]]
    """(batch, device) -> (the first stage's input, the keyword inputs every stage
    reads), split into micro-batches along the rows by the schedule."""


class TrainingHooks(Protocol):
    """A model's own work around each optimizer step, beyond its forward and backward
    passes (a mixture of experts: its routing balance, moe/balance.py). The trainer
    calls them in this order every step."""

    def begin_step(self, tokens: int, micro_batches: int, count_pass: Callable[[], None]) -> None:
        """Before the step's micro-batches: `tokens`, the global batch's tokens with a
        target; `count_pass`, a forward pass over this rank's batch without gradients."""
        ...

    def extra_loss(self) -> torch.Tensor | None:
        """After each micro-batch's forward: loss terms to add to it, already in the
        trainer's units (this rank's summed loss scaled by dp / valid tokens)."""
        ...

    def end_backward(self) -> dict[str, float]:
        """After the backward passes, before clipping (collective): figures to log."""
        ...

    def end_step(self, applied: bool) -> None:
        """After the step: whether its update was applied."""
        ...


# (model, job config, mesh, a function summing a tensor over the global batch's ranks
# in place) -> the model's hooks
MakeHooks = Callable[..., TrainingHooks]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    flavors: Mapping[str, Any]
    """The named shapes `[model] flavor` selects (args objects)."""
    model_args: Callable[..., Any]
    """(flavor, **overrides) -> args; ValueError naming the known flavors."""
    build: Callable[[Any], torch.nn.Module]
    """args -> the model on the current default device (the trainer builds on meta).
    The model has `init_weights(generator)`, which draws every parameter in full
    so the weights do not depend on the sharding."""
    parallelize: Callable[..., torch.nn.Module]
    """(model, mesh, training, stages=None): tensor parallelism, activation
    checkpointing, compile, then FSDP2/HSDP; under pipeline parallelism `stages`
    (from `pipeline.split`) are sharded as the roots instead of the model."""
    check_parallelism: Callable[[Any, ParallelDims, int], None]
    """(args, dims, seq_len): one ConfigError naming every shape the mesh cannot split."""
    args_from_hf_config: Callable[..., Any]
    """(config.json document, its path, **overrides) -> args; HFCheckpointError
    naming the key for a setting the model lacks."""
    hf_config: Callable[..., dict[str, Any]]
    """(args, dtype) -> the config.json document `transformers` loads."""
    state_dict_adapter: Callable[[Any], StateDictAdapter] | None
    """args -> the adapter between parameters and Hugging Face tensors; None for a
    model without Hugging Face import or export."""
    flops_per_token: Callable[[Any, int], float]
    """(args, seq_len) -> training FLOPs per token, for MFU."""
    describe: Callable[[Any], str]
    """args -> a few words for the start-up log line (e.g. the attention mode)."""
    inputs: Callable[[Any, torch.device], dict[str, Any]]
    """(micro-batch, device) -> the model's keyword arguments, on `device`: what the
    model reads of a `zephon.batch.Batch` (`text_inputs`, or more, e.g. images), so
    the training loop calls every model the same way."""
    pipeline: PipelineSplit | None = None
    """How the model splits into pipeline stages; None: it cannot (PP refused)."""
    training_hooks: MakeHooks | None = None
    """The model's work around each step (`TrainingHooks`); None: nothing beyond its
    passes. A model with hooks is a mixture of experts: `[moe]` settings apply."""


def text_inputs(mb: Any, device: torch.device) -> dict[str, Any]:
    """A text model's inputs: `tokens` and per-document `positions`."""
    from torchtitan.distributed.device_io import to_device  # torch only when called

    return {"tokens": to_device(mb.input_ids, device), "positions": to_device(mb.positions, device)}


def text_pipeline_inputs(mb: Any, device: torch.device) -> tuple[torch.Tensor, dict[str, Any]]:
    """A text model's pipeline inputs: `tokens` to the first stage, `positions` to all."""
    inputs = text_inputs(mb, device)
    return inputs["tokens"], {"positions": inputs["positions"]}


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (global sizes, also for sharded or meta models)."""
    return sum(p.numel() for p in model.parameters())
