"""How the Llama 3 model is parallelised: tensor parallelism over the TP mesh,
activation checkpointing and per-block compile, then the model-agnostic FSDP2 /
HSDP wrapping over the data-parallel mesh (`torchtitan/distributed/fsdp.py`);
and the shape checks a tensor-parallel degree must pass before anything is built.

The tensor-parallel plan, with sequence parallelism for the norms: between
blocks the residual stream is sharded along the sequence (Shard(1)): norms run
on their slice of tokens, attention and the feed-forward gather the full
sequence, compute on their slice of heads / hidden units (column-wise input
projections, row-wise output projections) and reduce-scatter back to sequence
shards. The output projection gathers the full logits, so the loss and
everything after it are the same as without tensor parallelism.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchtitan.config.job_config import ConfigError, Training
from torchtitan.distributed.fsdp import apply_fsdp
from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
from torchtitan.models.llama3.args import ModelArgs
from torchtitan.models.llama3.model import Transformer


def parallelize_llama(
    model: Transformer,
    mesh: ParallelMesh,
    training: Training,
    stages: Sequence[nn.Module] | None = None,
) -> Transformer:
    """Tensor-parallel plan over the TP mesh (if any), activation checkpointing,
    compile, then FSDP over the data-parallel mesh: each transformer block, then
    the root (embeddings, norm, output). Works on a meta model. Under pipeline
    parallelism `model` holds this process's stages only and each of `stages` is
    a root (the schedule calls them, not the model)."""
    if mesh.tp is not None:
        apply_tensor_parallel(model, mesh.tp)
    if training.activation_checkpoint == "full":
        apply_activation_checkpointing(model)
    if training.compile:
        # Per block and in place (Module.compile), so parameter names and
        # checkpoint keys are the same with or without compile.
        for block in model.layers.values():
            block.compile()
    apply_fsdp(
        list(stages) if stages is not None else [model],
        list(model.layers.values()),
        mesh.fsdp,
        training.mixed_precision_param,
        training.mixed_precision_reduce,
    )
    return model


def check_parallelism(args: ModelArgs, dims: ParallelDims, seq_len: int) -> None:
    """Tensor-parallel constraints of the model shape; every problem in one error."""
    if dims.tp == 1:
        return
    tp = dims.tp
    problems = []
    if args.n_heads % tp:
        problems.append(f"the model's n_heads {args.n_heads} is not divisible by it")
    if args.kv_heads % tp:
        problems.append(f"the model's n_kv_heads {args.kv_heads} is not divisible by it")
    if args.ffn_hidden_dim % tp:
        problems.append(f"the model's FFN width {args.ffn_hidden_dim} is not divisible by it")
    if seq_len % tp:
        problems.append(
            f"training.seq_len {seq_len} is not divisible by it (sequence parallelism "
            "splits each row's tokens between the peers)"
        )
    if args.tie_embeddings:
        problems.append(
            "the model ties its output projection to the embeddings, which the tensor "
            "parallel plan does not support"
        )
    if problems:
        raise ConfigError(f"parallelism.tensor_parallel_degree = {tp}: " + "; ".join(problems))


def apply_activation_checkpointing(model: Transformer) -> None:
    """Recompute each block's activations in backward (non-reentrant
    ``torch.utils.checkpoint``), trading compute for memory. Apply before
    ``fully_shard``; parameter names do not change."""
    for block in model.layers.values():
        block.checkpoint_activations = True


# Between blocks the residual stream is sharded along the sequence.
SEQUENCE_SHARDED: Placement = Shard(1)


def apply_tensor_parallel(
    model: Transformer, tp_mesh: DeviceMesh, embeddings_layout: Placement = SEQUENCE_SHARDED
) -> None:
    """Shard `model` (meta or real) in place over `tp_mesh`. Attention reads its
    head counts from the projected shapes, so it runs unchanged on n_heads / tp heads.
    `embeddings_layout` Replicate(): the token embeddings come out whole, for a model
    that edits them before the blocks (and then cuts this rank's sequence shard)."""
    root_plan = {
        "tok_embeddings": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=embeddings_layout
        ),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True
        ),
    }
    # A pipeline stage's model lacks the modules of the other stages.
    present = {k: v for k, v in root_plan.items() if getattr(model, k) is not None}
    if present:
        parallelize_module(model, tp_mesh, present)
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                # (x, rope, mask): x is gathered from sequence shards; rope and the
                # mask (built from the full positions) are plain tensors, left alone.
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None),
                    desired_input_layouts=(Replicate(), None, None),
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            },
        )
