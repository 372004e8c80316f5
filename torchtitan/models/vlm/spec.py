"""The vision-language entry of the model registry (`[model] name = "vlm"`).

- Inputs: tokens, positions and the micro-batch's images (`Batch.images`,
  patches joined into one tensor on the device, each image copied once; grids, rows and starts stay where they are: the
  model reads them on the host to lay out the patches and placeholders).
- FLOPs per token: the decoder's, as Llama counts them (its vocabulary with the
  image tokens). The vision tower is not counted: its cost is per image token,
  and a token count alone does not say how many of a step's tokens are images,
  so MFU under-reports image-heavy steps by the tower's share.
- No Hugging Face import or export: no state-dict adapter, and `model.flavor =
  "hf"` is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchtitan.models.hf_folder import HFCheckpointError
from torchtitan.models.llama3.flops import flops_per_token
from torchtitan.models.llama3.parallelize import check_parallelism
from torchtitan.models.spec import ModelSpec, text_inputs
from torchtitan.models.vlm.args import VLM_FLAVORS, VLMArgs, get_model_args
from torchtitan.models.vlm.model import VisionLanguageModel
from torchtitan.models.vlm.parallelize import parallelize_vlm

NO_HF = "the vlm model has no Hugging Face import or export; use a named flavor"


def vlm_inputs(mb: Any, device: torch.device) -> dict[str, Any]:
    """`text_inputs` and `images`: the micro-batch's ImageBatch (None: text only)."""
    images = mb.images
    if images is not None:
        images = dataclasses.replace(images, parts=(images.patches_on(device),))
    return {**text_inputs(mb, device), "images": images}


def _no_hf_args(cfg: dict[str, Any], file: str, **overrides: Any) -> VLMArgs:
    raise HFCheckpointError(f"{file}: {NO_HF}")


def _no_hf_config(args: VLMArgs, dtype: str = "float32") -> dict[str, Any]:
    raise HFCheckpointError(NO_HF)


def _describe(args: VLMArgs) -> str:
    v = args.vision
    return (
        f"attention {args.attention}; vision tower {v.n_layers} x {v.dim}, patch {v.patch_size},"
        f" merge {v.merge}x{v.merge} (not tensor-parallel)"
    )


SPEC = ModelSpec(
    name="vlm",
    flavors=VLM_FLAVORS,
    model_args=get_model_args,
    build=VisionLanguageModel,
    parallelize=parallelize_vlm,
    check_parallelism=check_parallelism,
    args_from_hf_config=_no_hf_args,
    hf_config=_no_hf_config,
    state_dict_adapter=None,
    flops_per_token=flops_per_token,
    describe=_describe,
    inputs=vlm_inputs,
)
