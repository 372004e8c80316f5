"""The mixture-of-experts entry of the model registry (docs/moe.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchtitan.distributed.device_io import to_device
from torchtitan.models.hf_folder import HFCheckpointError
from torchtitan.models.moe.args import MOE_FLAVORS, MoEArgs, get_model_args
from torchtitan.models.moe.balance import RoutingBalance
from torchtitan.models.moe.model import MoETransformer, flops_per_token
from torchtitan.models.moe.parallelize import check_parallelism, parallelize_moe
from torchtitan.models.spec import ModelSpec, text_inputs

IGNORE_INDEX = -100
NO_HF = "the moe model has no Hugging Face import or export yet"


def moe_inputs(mb: Any, device: torch.device) -> dict[str, Any]:
    """Tokens and positions, and which tokens the routing balance counts: those with
    a target (the data decides them, not the padding a rank adds)."""
    return {**text_inputs(mb, device), "valid": to_device(mb.labels != IGNORE_INDEX, device)}


def routing_balance(
    model: MoETransformer, cfg: Any, mesh: Any, reduce: Callable[[torch.Tensor], None]
) -> RoutingBalance:
    return RoutingBalance(model.moe_layers(), cfg.moe, mesh.dp_size, reduce, model.expert_params)


def _no_hf_args(cfg: dict[str, Any], file: str, **overrides: Any) -> MoEArgs:
    raise HFCheckpointError(f"{file}: {NO_HF}")


def _no_hf_config(args: MoEArgs, dtype: str = "float32") -> dict[str, Any]:
    raise HFCheckpointError(NO_HF)


def _describe(args: MoEArgs) -> str:
    return (
        f"attention {args.attention}; {args.n_experts} experts, top {args.top_k} "
        f"({args.score_func}), {args.n_shared_experts} shared, first {args.n_dense_layers} "
        "layer(s) dense"
    )


SPEC = ModelSpec(
    name="moe",
    flavors=MOE_FLAVORS,
    model_args=get_model_args,
    build=MoETransformer,
    parallelize=parallelize_moe,
    check_parallelism=check_parallelism,
    args_from_hf_config=_no_hf_args,
    hf_config=_no_hf_config,
    state_dict_adapter=None,
    flops_per_token=flops_per_token,
    describe=_describe,
    inputs=moe_inputs,
    training_hooks=routing_balance,
)
