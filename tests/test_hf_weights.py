"""Hugging Face Llama weights in and out, checked against `transformers` itself.

A tiny random LlamaForCausalLM saved by transformers (sharded, with an index)
is loaded by the trainer's code on 1 and 2 FSDP2 processes and must give the
same logits; a trainer run started from it is exported back and transformers
must give the trainer's logits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from train_helpers import REPO, ensure_sample_data, ok, torchrun  # noqa: E402

from torchtitan.components.hf_folder import HFCheckpointError, write_hf_folder  # noqa: E402
from torchtitan.components.initial_load import initial_model_args, load_initial  # noqa: E402
from torchtitan.config.job_config import load_job_config  # noqa: E402
from torchtitan.models.llama3.model import Transformer  # noqa: E402
from torchtitan.models.llama3.state_dict_adapter import (  # noqa: E402
    config_from_model_args,
    load_hf_weights,
    model_args_from_config,
    to_hf_state,
)

TOL = 1e-4  # float32, logits of order 1
VOCAB = 8192  # the committed tokenizer's


def _hf_model(
    folder: Path, tie: bool, rope: dict | None = None, vocab: int = VOCAB
) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 5000.0},
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a wrong mapping cannot hide
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, max_shard_size="200KB")
    return model


def _logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(tokens)
    return out.logits if hasattr(out, "logits") else out


@pytest.fixture(scope="module")
def hf_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, Path]:
    root = tmp_path_factory.mktemp("hf")
    folder = root / "llama"
    model = _hf_model(folder, tie=False)
    assert (folder / "model.safetensors.index.json").is_file()  # sharded
    tokens = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
    torch.save(tokens, root / "tokens.pt")
    return folder, _logits(model, tokens), root / "tokens.pt"


def _harness(nproc: int, tokens: Path, out: Path, *args: str) -> torch.Tensor:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(nproc), str(REPO / "tests" / "hf_logits_harness.py"),
        str(tokens), str(out), "--model.attention", "causal", *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("tie", [False, True])
def test_in_process_load_and_export_round_trip(tmp_path: Path, tie: bool) -> None:
    """One process, no FSDP: tied embeddings and llama3 rope scaling too."""
    rope = {
        "rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
    }  # fmt: skip
    ref_model = _hf_model(tmp_path / "in", tie=tie, rope=rope if tie else None, vocab=300)
    args = model_args_from_config(str(tmp_path / "in"), attention="causal")
    assert args.tie_embeddings == tie and (args.rope_scaling is not None) == tie
    model = Transformer(args)
    model.init_weights()
    load_hf_weights(model, args, str(tmp_path / "in"))
    tokens = torch.randint(0, 300, (2, 100), generator=torch.Generator().manual_seed(2))
    ref = _logits(ref_model, tokens)
    assert (_logits(model, tokens) - ref).abs().max() < TOL

    state = {k: v for k, v in model.state_dict().items()}
    write_hf_folder(str(tmp_path / "out"), to_hf_state(state, args), config_from_model_args(args))
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert (_logits(back, tokens) - ref).abs().max() < TOL


def test_unsupported_settings_are_refused_by_name(tmp_path: Path) -> None:
    _hf_model(tmp_path, tie=False, vocab=300)
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


def test_fsdp_load_on_1_and_2_processes(hf_case, tmp_path: Path) -> None:
    folder, ref, tokens = hf_case
    args = ["--model.flavor", "hf", "--checkpoint.initial_load_path", str(folder)]
    read = {}
    for nproc in (1, 2):
        out = tmp_path / f"logits{nproc}.pt"
        got = _harness(nproc, tokens, out, *args)
        diff = float((got - ref).abs().max())
        read[nproc] = [int(Path(f"{out}.bytes{r}").read_text()) for r in range(nproc)]
        print(f"HF -> trainer, {nproc} process(es): max abs logit diff {diff:.2e}, "
              f"bytes read per rank {read[nproc]}")  # fmt: skip
        assert diff < TOL
    # Each of 2 ranks reads its half of every tensor, not the whole checkpoint.
    assert sum(read[2]) >= read[1][0] and max(read[2]) <= 0.51 * read[1][0]


def test_trainer_start_export_and_continue(hf_case, tmp_path: Path) -> None:
    """Train from the HF folder, export the step for transformers, start a new
    phase from the step folder, and let the run's own checkpoint win."""
    folder, _, tokens = hf_case
    ensure_sample_data()
    hf_args = ["--model.flavor", "hf", "--model.hf_config", str(folder)]
    first = ok(
        torchrun(2, tmp_path / "a", *hf_args, "--checkpoint.initial_load_path", str(folder),
                 "--training.steps", "2", "--checkpoint.interval", "2")
    )  # fmt: skip
    assert "initial weights from Hugging Face folder" in first.stdout
    step = tmp_path / "a" / "checkpoint" / "step-2"

    out = tmp_path / "exported"
    export = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "export_hf.py"), str(step), str(out),
         "--hf-config", str(folder)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    # The trainer's own step-folder load, in this process (no process group, no FSDP).
    cfg = load_job_config([*hf_args, "--checkpoint.initial_load_path", str(step)])
    args = initial_model_args(cfg, VOCAB)
    model = Transformer(replace(args, attention="causal"))
    model.init_weights()
    load_initial(cfg, model, None, args)
    trained = _logits(model, torch.load(tokens))
    back = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    diff = float((_logits(back, torch.load(tokens)) - trained).abs().max())
    print(f"trainer step-2 -> export -> transformers: max abs logit diff {diff:.2e}")
    assert diff < TOL

    # A new data phase from the step folder (optimizer too), then the run's own checkpoint wins.
    phase = [*hf_args, "--checkpoint.initial_load_path", str(tmp_path / "a" / "checkpoint"),
             "--checkpoint.initial_load_optimizer", "true", "--checkpoint.interval", "1"]  # fmt: skip
    second = ok(torchrun(1, tmp_path / "b", *phase, "--training.steps", "1"))
    assert "initial weights (model and optimizer) from step folder" in second.stdout
    assert "step      1" in second.stdout
    third = ok(torchrun(1, tmp_path / "b", *phase, "--training.steps", "2"))
    assert "this run's own checkpoint (step 1) wins" in third.stdout
    assert "initial weights" not in third.stdout


def test_config_errors_name_the_setting(tmp_path: Path) -> None:
    from torchtitan.components.checkpoint import CheckpointError
    from torchtitan.components.initial_load import resolve_step_folder
    from torchtitan.config.job_config import ConfigError

    _hf_model(tmp_path / "hf", tie=False, vocab=300)
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
