"""Hugging Face Llama weights in and out across processes, checked against
`transformers` itself: a tiny random LlamaForCausalLM saved by transformers
(sharded, with an index) is loaded by the trainer's code on 1 and 2 FSDP2
processes and must give the same logits; a trainer run started from it is
exported back (scripts/tools/export_hf.py) and transformers must give the
trainer's logits. The in-process round trip and the refusals are
tests/unit/trainer/test_hf_weights.py."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import REPO  # noqa: E402
from helpers.hf_llama import TOL, VOCAB, hf_model, logits  # noqa: E402
from helpers.train import ensure_sample_data, ok, torchrun  # noqa: E402

from torchtitan.components.initial_load import initial_model_args, load_initial  # noqa: E402
from torchtitan.config.job_config import load_job_config  # noqa: E402
from torchtitan.models.llama3.model import Transformer  # noqa: E402


@pytest.fixture(scope="module")
def hf_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, Path]:
    root = tmp_path_factory.mktemp("hf")
    folder = root / "llama"
    model = hf_model(folder, tie=False)
    assert (folder / "model.safetensors.index.json").is_file()  # sharded
    tokens = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
    torch.save(tokens, root / "tokens.pt")
    return folder, logits(model, tokens), root / "tokens.pt"


def _harness(nproc: int, tokens: Path, out: Path, *args: str) -> torch.Tensor:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(nproc), str(REPO / "tests" / "helpers" / "hf_logits_harness.py"),
        str(tokens), str(out), "--model.attention", "causal", *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out)


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
        [sys.executable, str(REPO / "scripts" / "tools" / "export_hf.py"), str(step), str(out),
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
    trained = logits(model, torch.load(tokens))
    back = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    diff = float((logits(back, torch.load(tokens)) - trained).abs().max())
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
