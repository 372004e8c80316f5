"""Hugging Face Llama weights in and out in one process, checked against
`transformers` itself: a tiny random LlamaForCausalLM loaded by the trainer's code
and exported back gives the same logits; unsupported settings and config errors
are refused by name. The FSDP2 loads on 1 and 2 processes and a trainer run started
from the weights are tests/integration/test_train_hf_weights.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers.hf_llama import TOL, VOCAB, hf_model, logits  # noqa: E402

from torchtitan.components.initial_load import initial_model_args  # noqa: E402
from torchtitan.config.job_config import load_job_config  # noqa: E402
from torchtitan.models.hf_folder import HFCheckpointError, write_hf_folder  # noqa: E402
from torchtitan.models.llama3.model import Transformer  # noqa: E402
from torchtitan.models.llama3.state_dict_adapter import (  # noqa: E402
    config_from_model_args,
    load_hf_weights,
    model_args_from_config,
    to_hf_state,
)


@pytest.mark.parametrize("tie", [False, True])
def test_in_process_load_and_export_round_trip(tmp_path: Path, tie: bool) -> None:
    """One process, no FSDP: tied embeddings and llama3 rope scaling too."""
    rope = {
        "rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
    }  # fmt: skip
    ref_model = hf_model(tmp_path / "in", tie=tie, rope=rope if tie else None, vocab=300)
    args = model_args_from_config(str(tmp_path / "in"), attention="causal")
    assert args.tie_embeddings == tie and (args.rope_scaling is not None) == tie
    model = Transformer(args)
    model.init_weights()
    load_hf_weights(model, args, str(tmp_path / "in"))
    tokens = torch.randint(0, 300, (2, 100), generator=torch.Generator().manual_seed(2))
    ref = logits(ref_model, tokens)
    assert (logits(model, tokens) - ref).abs().max() < TOL

    state = {k: v for k, v in model.state_dict().items()}
    write_hf_folder(str(tmp_path / "out"), to_hf_state(state, args), config_from_model_args(args))
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert (logits(back, tokens) - ref).abs().max() < TOL


def test_unsupported_settings_are_refused_by_name(tmp_path: Path) -> None:
    hf_model(tmp_path, tie=False, vocab=300)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFCheckpointError, match=r"config.json: rope scaling type 'yarn'"):
        model_args_from_config(str(tmp_path))
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000.0}
    cfg["attention_bias"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFCheckpointError, match=r"attention_bias = True is not supported"):
        model_args_from_config(str(tmp_path))


def test_config_errors_name_the_setting(tmp_path: Path) -> None:
    from torchtitan.components.checkpoint import CheckpointError
    from torchtitan.components.initial_load import resolve_step_folder
    from torchtitan.config.job_config import ConfigError

    hf_model(tmp_path / "hf", tie=False, vocab=300)
    cases = {
        ("--model.flavor", "hf"): "set model.hf_config",
        ("--checkpoint.initial_load_path", str(tmp_path / "hf")): 'set model.flavor = "hf"',
        ("--model.flavor", "hf", "--model.hf_config", str(tmp_path / "hf")): "more than the model",
    }
    for argv, expected in cases.items():
        with pytest.raises(ConfigError, match=expected):
            initial_model_args(load_job_config(list(argv)), VOCAB)
    with pytest.raises(CheckpointError, match="neither a Hugging Face folder"):
        resolve_step_folder(str(tmp_path))
