"""`checkpoint.initial_load_path`: start a run from weights made elsewhere.

Two kinds of source:
- a Hugging Face folder of the `[model]` (config.json + model.safetensors, or
  shards with model.safetensors.index.json): every rank reads only its
  parameter shards, named and laid out by the model's state-dict adapter;
- a step folder of this trainer (DCP; any saved world size): model weights,
  and the optimizer state with `checkpoint.initial_load_optimizer`, so a new
  data phase (another recipe, an annealing mix) continues a trained model.

An initial load starts at step 0 with a fresh LR schedule and a fresh loader.
When the run's own dump folder has a checkpoint, that checkpoint wins.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from torchtitan.components.checkpoint import COMPLETE_FILE, CheckpointError
from torchtitan.components.checkpoint.manager import complete_steps
from torchtitan.config.job_config import ConfigError, JobConfig
from torchtitan.models import get_model_spec
from torchtitan.models.hf_folder import (
    CONFIG_FILE,
    HFCheckpointError,
    is_hf_folder,
    load_hf_folder,
    read_config,
)

logger = logging.getLogger("torchtitan")

MODEL_PREFIX = "train.model."  # DCP keys of the model inside a step folder


def _hf_config_folder(cfg: JobConfig) -> str:
    path = cfg.model.hf_config or cfg.checkpoint.initial_load_path
    if not path:
        raise ConfigError(
            'model.flavor = "hf" takes the model shape from a Hugging Face config.json: '
            "set model.hf_config, or checkpoint.initial_load_path to a Hugging Face folder"
        )
    folder = os.path.dirname(path) if path.endswith(".json") else path
    if not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        field = "model.hf_config" if cfg.model.hf_config else "checkpoint.initial_load_path"
        raise ConfigError(f'{field} = {path!r}: no {CONFIG_FILE} there (model.flavor = "hf")')
    return folder


def initial_model_args(cfg: JobConfig, tokenizer_vocab: int) -> Any:
    """The `[model]` args: a named flavor sized to the tokenizer, or a Hugging Face config."""
    spec = get_model_spec(cfg.model.name)
    path = cfg.checkpoint.initial_load_path
    if cfg.model.flavor != "hf":
        if path and is_hf_folder(path):
            raise ConfigError(
                f"checkpoint.initial_load_path {path} is a Hugging Face folder: set "
                'model.flavor = "hf" to take the model shape from its config.json'
            )
        overrides: dict[str, Any] = {}
        if cfg.moe.top_k:  # (set only for a mixture of experts: check_model_name)
            overrides["top_k"] = cfg.moe.top_k
        try:
            return spec.model_args(
                cfg.model.flavor, vocab_size=tokenizer_vocab, attention=cfg.model.attention,
                **overrides,
            )  # fmt: skip
        except ValueError as exc:
            if overrides and str(exc).startswith("top_k"):
                raise ConfigError(f"moe.top_k = {cfg.moe.top_k}: {exc}") from None
            raise ConfigError(f"model.flavor: {exc}, or 'hf' (shape from a config.json)") from None
    folder = _hf_config_folder(cfg)
    try:
        file = os.path.join(folder, CONFIG_FILE)
        args = spec.args_from_hf_config(read_config(folder), file, attention=cfg.model.attention)
    except HFCheckpointError as exc:
        raise ConfigError(str(exc)) from None
    if tokenizer_vocab > args.vocab_size:
        raise ConfigError(
            f"the tokenizer {cfg.data.tokenizer} has {tokenizer_vocab} tokens, more than the "
            f"model's vocab_size {args.vocab_size} ({os.path.join(folder, CONFIG_FILE)})"
        )
    return args


def resolve_step_folder(path: str) -> str:
    """`path` itself if it is a complete step folder; the latest complete step of a
    checkpoint folder otherwise."""
    if os.path.isfile(os.path.join(path, ".metadata")):
        if not os.path.isfile(os.path.join(path, COMPLETE_FILE)):
            raise CheckpointError(
                f"checkpoint.initial_load_path {path}: the save of this step never finished "
                f"(no {COMPLETE_FILE}); use a complete step folder"
            )
        return path
    steps = complete_steps(path)
    if steps:
        return os.path.join(path, f"step-{steps[-1]}")
    raise CheckpointError(
        f"checkpoint.initial_load_path {path}: neither a Hugging Face folder ({CONFIG_FILE} + "
        "model.safetensors or model.safetensors.index.json) nor a complete step folder of this "
        "trainer (DCP .metadata + COMPLETE.json) nor a folder of step folders"
    )


def load_initial(cfg: JobConfig, model: torch.nn.Module, optimizer: Any, args: Any) -> int | None:
    """Load `checkpoint.initial_load_path` into the (sharded) model, and optionally
    the optimizer. Collective when distributed: every rank calls it."""
    path = cfg.checkpoint.initial_load_path
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint.initial_load_path {path}: not found")
    if is_hf_folder(path):
        if cfg.checkpoint.initial_load_optimizer:
            raise ConfigError(
                "checkpoint.initial_load_optimizer: a Hugging Face folder has no optimizer "
                "state; it needs a step folder of this trainer"
            )
        make_adapter = get_model_spec(cfg.model.name).state_dict_adapter
        if make_adapter is None:
            raise ConfigError(
                f"checkpoint.initial_load_path {path} is a Hugging Face folder, but model "
                f"{cfg.model.name!r} has no Hugging Face import"
            )
        try:
            adapter = make_adapter(args)
            nbytes = load_hf_folder(model, adapter, path)
        except HFCheckpointError as exc:
            raise CheckpointError(str(exc)) from None
        logger.info(
            f"initial weights from Hugging Face folder {path} "
            f"(this rank read {nbytes / 2**20:.2f} MiB of tensors)"
        )
        return nbytes
    step = resolve_step_folder(path)
    with_optim = cfg.checkpoint.initial_load_optimizer
    if with_optim:
        # The schedule restarts: keep this run's learning rates, not the saved ones.
        lrs = [{k: g[k] for k in ("lr", "initial_lr") if k in g} for g in optimizer.param_groups]
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"train": {"model": model_sd, "optimizer": optim_sd}}
    else:
        state = {"train": {"model": get_model_state_dict(model)}}
    try:
        dcp.load(state, checkpoint_id=step, no_dist=not dist.is_initialized())
    except Exception as exc:  # DCP wraps per-rank failures in its own exception types
        raise CheckpointError(
            f"checkpoint.initial_load_path {step}: cannot load into this model "
            f"(model.flavor {cfg.model.flavor!r}): {str(exc).strip()[:500]}"
        ) from None
    if with_optim:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["train"]["model"],
            optim_state_dict=state["train"]["optimizer"],
        )
        for group, saved in zip(optimizer.param_groups, lrs, strict=True):
            group.update(saved)
    else:
        set_model_state_dict(model, state["train"]["model"])
    what = "model and optimizer" if with_optim else "model"
    logger.info(f"initial weights ({what}) from step folder {step}; starting at step 0")
    return None


def read_step_model(step: str) -> dict[str, torch.Tensor]:
    """Full model tensors of a step folder, in one process (any saved world size)."""
    step = resolve_step_folder(step)
    meta = dcp.FileSystemReader(step).read_metadata().state_dict_metadata
    tensors = {
        key[len(MODEL_PREFIX) :]: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for key, m in meta.items()
        if key.startswith(MODEL_PREFIX) and hasattr(m, "size")
    }
    if not tensors:
        raise CheckpointError(f"{step}: no model tensors ({MODEL_PREFIX}*) in this checkpoint")
    dcp.load({"train": {"model": tensors}}, checkpoint_id=step, no_dist=True)
    return tensors
