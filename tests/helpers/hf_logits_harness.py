"""Test harness, run under torchrun: build the trainer's FSDP2 model, apply
`checkpoint.initial_load_path` exactly as the trainer does, and save the logits
of fixed tokens (rank 0).

    torchrun --nproc-per-node N tests/helpers/hf_logits_harness.py TOKENS.pt OUT.pt [--section.field V]...
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from torchtitan.components.initial_load import initial_model_args, load_initial
from torchtitan.config.job_config import load_job_config
from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
from torchtitan.distributed.utils import exit_process, init_distributed
from torchtitan.models.llama3.model import Transformer
from torchtitan.models.llama3.parallelize import parallelize_llama


def main() -> None:
    tokens_file, out_file, *argv = sys.argv[1:]
    cfg = load_job_config(argv)
    info = init_distributed()
    tokens = torch.load(tokens_file)
    args = initial_model_args(cfg, 0)
    with torch.device("meta"):
        model = Transformer(args)
    mesh = ParallelMesh(ParallelDims.from_config(cfg.parallelism, info.world_size), "cpu")
    parallelize_llama(model, mesh, replace(cfg.training, mixed_precision_param="float32"))
    model.to_empty(device="cpu")
    model.init_weights(torch.Generator().manual_seed(0))
    nbytes = load_initial(cfg, model, None, args)
    with open(f"{out_file}.bytes{info.rank}", "w") as f:  # what this rank read
        f.write(str(nbytes))
    with torch.no_grad():
        logits = model(tokens)
    if info.rank == 0:
        torch.save(logits, out_file)
    exit_process(0)  # barrier, then no gloo teardown after FSDP2 (it can crash a rank)


if __name__ == "__main__":
    main()
