"""Export a trained step folder to a Hugging Face Llama folder that `transformers` loads.

    python scripts/tools/export_hf.py outputs/run/checkpoint/step-100 exported/ --flavor debugmodel
    python scripts/tools/export_hf.py outputs/run/checkpoint exported/ --hf-config base_model/

The step folder may have been saved by any number of ranks (DCP); it is read in
one process. STEP may also be a checkpoint folder (its latest complete step).
The shape comes from the named flavor (vocabulary size and tied embeddings
from the checkpoint itself) or from the config.json of the Hugging Face model
the run started from. Writes config.json and model.safetensors (sharded with
model.safetensors.index.json past --max-shard-mb).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from torchtitan.components.checkpoint import CheckpointError
from torchtitan.components.initial_load import read_step_model
from torchtitan.models.hf_folder import HFCheckpointError, write_hf_folder
from torchtitan.models.llama3.args import get_model_args
from torchtitan.models.llama3.model import Transformer
from torchtitan.models.llama3.state_dict_adapter import (
    config_from_model_args,
    model_args_from_config,
    to_hf_state,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def export(
    step: str,
    out: str,
    flavor: str = "",
    hf_config: str = "",
    dtype: str = "float32",
    max_shard_mb: int = 5120,
) -> list[str]:
    """Write `out`; returns the safetensors files written."""
    tensors = read_step_model(step)
    if hf_config:
        folder = os.path.dirname(hf_config) if hf_config.endswith(".json") else hf_config
        args = model_args_from_config(folder or ".")
    else:
        args = get_model_args(
            flavor,
            vocab_size=tensors["tok_embeddings.weight"].shape[0],
            tie_embeddings="output.weight" not in tensors,
        )
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Transformer(args).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if expected != got:
        diff = sorted(set(expected.items()) ^ set(got.items()))[:6]
        raise HFCheckpointError(
            f"{step}: the checkpoint does not have the shape of "
            f"{hf_config or 'flavor ' + repr(flavor)}; differing (name, shape): {diff}"
        )
    hf = {k: v.to(DTYPES[dtype]) for k, v in to_hf_state(tensors, args).items()}
    config = config_from_model_args(args, dtype=dtype)
    return write_hf_folder(out, hf, config, max_shard_bytes=max_shard_mb * 2**20)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("step", help="step folder (or checkpoint folder: its latest complete step)")
    p.add_argument("out", help="output folder")
    shape = p.add_mutually_exclusive_group(required=True)
    shape.add_argument("--flavor", help="llama3 flavor the run trained (debugmodel, 1B, 8B)")
    shape.add_argument(
        "--hf-config", help="config.json (or folder) of the model the run began from"
    )
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--max-shard-mb", type=int, default=5120)
    a = p.parse_args(argv)
    try:
        files = export(a.step, a.out, a.flavor or "", a.hf_config or "", a.dtype, a.max_shard_mb)
    except (CheckpointError, HFCheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: config.json, {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
