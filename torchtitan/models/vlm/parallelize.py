"""How the vision-language model is parallelised: tensor parallelism for the
decoder only, activation checkpointing and per-block compile for both towers,
then FSDP2 / HSDP over both towers' blocks and the root.

- Tensor parallelism: Llama's plan on `decoder`, except that the token
  embeddings come out whole (the model places the image embeddings on the
  whole sequence, then cuts this rank's sequence shard). The vision tower and
  the projector are not split (no TP plan for them in this model): their
  parameters become replicated DTensors on the TP mesh, so that every
  parameter lives on the same (data-parallel x TP) mesh and the gradient-norm
  clipping spans them all; each TP peer computes the tower whole, on the same
  images, and gets its full gradient (model.py).
- FSDP2: each vision block, each decoder block, then the root (patch
  embedding, the tower's final norm, projector, token embeddings, final norm,
  output). The vision blocks come first, in the order forward runs them.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from torchtitan.config.job_config import Training
from torchtitan.distributed.fsdp import apply_fsdp
from torchtitan.distributed.mesh import ParallelMesh
from torchtitan.models.llama3.parallelize import apply_tensor_parallel as llama_tensor_parallel
from torchtitan.models.vlm.model import VisionLanguageModel

# Submodules that tensor parallelism leaves whole (replicated on the TP peers).
NOT_TENSOR_PARALLEL = ("vision", "projector")


def parallelize_vlm(
    model: VisionLanguageModel, mesh: ParallelMesh, training: Training
) -> VisionLanguageModel:
    """Tensor parallelism (decoder), activation checkpointing, compile, then FSDP
    over the data-parallel mesh. Works on a meta model."""
    if mesh.tp is not None:
        apply_tensor_parallel(model, mesh.tp)
    blocks = [*model.vision.layers.values(), *model.decoder.layers.values()]
    if training.activation_checkpoint == "full":
        for block in blocks:
            block.checkpoint_activations = True
    if training.compile:
        # In place (Module.compile): the same parameter names with or without compile.
        for block in blocks:
            block.compile()
    apply_fsdp(
        [model], blocks, mesh.fsdp, training.mixed_precision_param, training.mixed_precision_reduce
    )
    return model


def apply_tensor_parallel(model: VisionLanguageModel, tp_mesh: DeviceMesh) -> None:
    """Llama's plan on the decoder (embeddings whole); `NOT_TENSOR_PARALLEL`
    replicated on `tp_mesh`."""
    llama_tensor_parallel(model.decoder, tp_mesh, embeddings_layout=Replicate())
    for name in NOT_TENSOR_PARALLEL:
        replicate_parameters(getattr(model, name), tp_mesh)
    model.tp_mesh = tp_mesh


def replicate_parameters(module: nn.Module, mesh: DeviceMesh) -> None:
    """Make every parameter of `module` a replicated DTensor on `mesh` (no
    communication: every peer already holds the same values, or none yet on meta)."""
    for sub in module.modules():
        for name, param in list(sub.named_parameters(recurse=False)):
            if isinstance(param, DTensor):
                raise ValueError(f"{name} of {type(sub).__name__} is already distributed")
            replicated = DTensor.from_local(param.data, mesh, [Replicate()], run_check=False)
            sub.register_parameter(name, nn.Parameter(replicated, param.requires_grad))
