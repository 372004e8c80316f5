"""The Llama 3 entry of the model registry: everything the trainer needs to build,
parallelise, check, load, export and count this model."""

from __future__ import annotations

from torchtitan.models.llama3.args import LLAMA3_FLAVORS, ModelArgs, get_model_args
from torchtitan.models.llama3.flops import flops_per_token
from torchtitan.models.llama3.model import Transformer
from torchtitan.models.llama3.parallelize import check_parallelism, parallelize_llama
from torchtitan.models.llama3.pipeline import layers_per_stage, split_for_pipeline
from torchtitan.models.llama3.state_dict_adapter import (
    Llama3StateDictAdapter,
    args_from_hf_config,
    config_from_model_args,
)
from torchtitan.models.spec import ModelSpec, PipelineSplit, text_inputs, text_pipeline_inputs


def _describe(args: ModelArgs) -> str:
    return f"attention {args.attention}"


SPEC = ModelSpec(
    name="llama3",
    flavors=LLAMA3_FLAVORS,
    model_args=get_model_args,
    build=Transformer,
    parallelize=parallelize_llama,
    check_parallelism=check_parallelism,
    args_from_hf_config=args_from_hf_config,
    hf_config=config_from_model_args,
    state_dict_adapter=Llama3StateDictAdapter,
    flops_per_token=flops_per_token,
    describe=_describe,
    inputs=text_inputs,
    pipeline=PipelineSplit(
        check=layers_per_stage, split=split_for_pipeline, inputs=text_pipeline_inputs
    ),
)
