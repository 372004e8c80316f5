"""The Llama 3 tensor-parallel plan, with sequence parallelism for the norms.

Between blocks the residual stream is sharded along the sequence (Shard(1)):
norms run on their slice of tokens, attention and the feed-forward gather the
full sequence, compute on their slice of heads / hidden units (column-wise
input projections, row-wise output projections) and reduce-scatter back to
sequence shards. The output projection gathers the full logits, so the loss
and everything after it are the same as without tensor parallelism.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchtitan.models.llama3.model import Transformer


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh) -> None:
    """Shard `model` (meta or real) in place over `tp_mesh`. Attention reads its
    head counts from the projected shapes, so it runs unchanged on n_heads / tp heads."""
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(
                input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True
            ),
        },
    )
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
