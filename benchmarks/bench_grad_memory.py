"""Per-rank gradient memory under gradient accumulation: reduce-scatter every
micro-batch (the default) versus `parallelism.defer_grad_sync = true`.

    .venv/bin/python benchmarks/bench_grad_memory.py [--micro-batches 4]
    .venv/bin/python benchmarks/bench_grad_memory.py --render   # .md from the committed JSON

Two CPU processes (gloo) shard a scaled-down Llama 3 shape with the trainer's
own `parallelize_llama`, then accumulate gradients over micro-batches exactly
as the trainer does. After every backward each rank counts the bytes of the
gradients it holds: its sharded `.grad` shards plus FSDP's unsharded gradient
buffers (`unsharded_accumulated_grad` and the unsharded parameters' `.grad`),
which is what gradient memory is made of and, unlike an RSS figure, is exact.
The process's peak RSS is recorded as well. Results: docs/results/grad_memory.json
and grad_memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
# The 1B layout (GQA 4:1, SwiGLU x1.5) at 1/4 width and depth; 1B itself on two
# CPU ranks does not fit this machine's memory.
SHAPE = dict(
    dim=512, n_layers=4, n_heads=8, n_kv_heads=2, vocab_size=32768,
    ffn_dim_multiplier=1.5, multiple_of=256, max_seq_len=256,
)  # fmt: skip
MODES = {"per_micro_batch": False, "defer_grad_sync": True}


def grad_bytes(model) -> tuple[int, int]:
    """(sharded gradient bytes, unsharded gradient bytes) held by this rank."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    sharded = 0
    for p in model.parameters():
        if p.grad is not None:
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            sharded += g.numel() * g.element_size()
    unsharded = 0
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        for fp in group.fsdp_params if group is not None else ():
            acc = fp.unsharded_accumulated_grad  # reduce-dtype accumulator (deferred sync)
            if acc is not None:
                unsharded += acc.numel() * acc.element_size()
            param = getattr(fp, "_unsharded_param", None)
            if param is not None and param.grad is not None:
                unsharded += param.grad.numel() * param.grad.element_size()
    return sharded, unsharded


def worker(mode: str, micro_batches: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from torchtitan.components.loss import cross_entropy_sum
    from torchtitan.config.job_config import Parallelism, Training
    from torchtitan.distributed.mesh import ParallelDims, ParallelMesh
    from torchtitan.models.llama3.args import ModelArgs
    from torchtitan.models.llama3.model import Transformer
    from torchtitan.models.llama3.parallelize import parallelize_llama
    from torchtitan.models.spec import count_parameters

    dist.init_process_group("gloo")
    mesh = ParallelMesh(ParallelDims.from_config(Parallelism(), dist.get_world_size()), "cpu")
    with torch.device("meta"):
        model = Transformer(ModelArgs(**SHAPE))
    parallelize_llama(model, mesh, Training(mixed_precision_param="float32"))
    model.to_empty(device="cpu")
    model.init_weights(torch.Generator().manual_seed(0))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    g = torch.Generator().manual_seed(dist.get_rank())
    per_mb = []
    for i in range(micro_batches):
        if MODES[mode]:
            model.set_requires_gradient_sync(i == micro_batches - 1)
        tokens = torch.randint(0, SHAPE["vocab_size"], (2, 129), generator=g)
        loss, _ = cross_entropy_sum(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        per_mb.append(grad_bytes(model))
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if dist.get_rank() == 0:
        result = {
            "mode": mode,
            "ranks": dist.get_world_size(),
            "parameters": count_parameters(model),
            "micro_batches": micro_batches,
            "per_micro_batch_bytes": [{"sharded": s, "unsharded": u} for s, u in per_mb],
            "peak_grad_bytes": max(s + u for s, u in per_mb),
            "peak_rss_growth_kib": rss_peak - rss_before,
        }
        Path(out).write_text(json.dumps(result))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # skip gloo teardown after FSDP work (see distributed.utils.exit_process)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--worker", choices=list(MODES), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--render", action="store_true", help="no runs: grad_memory.json -> .md")
    a = p.parse_args()
    if a.render:
        render()
        return
    if a.worker:
        worker(a.worker, a.micro_batches, a.out)
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            out = Path(tmp) / f"{mode}.json"
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", __file__, "--worker", mode,
                "--micro-batches", str(a.micro_batches), "--out", str(out),
            ]  # fmt: skip
            env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
            subprocess.run(cmd, check=True, cwd=REPO, env=env)
            results.append(json.loads(out.read_text()))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "grad_memory.json").write_text(json.dumps({"shape": SHAPE, "runs": results}, indent=1))
    render()


def page(doc: dict[str, Any]) -> str:
    """The results page, from the raw results (grad_memory.json)."""
    mib, runs = 2**20, doc["runs"]
    lines = [
        f"Gradient memory per rank, {runs[0]['parameters']:,}-parameter model, "
        f"{runs[0]['ranks']} CPU ranks, {len(runs[0]['per_micro_batch_bytes'])} micro-batches, "
        "fp32 gradients.",
        "",
        "| mode | grads held after each micro-batch (MiB: sharded + unsharded) | peak grads MiB |",
        "|---|---|---|",
    ]
    for r in runs:
        steps = ", ".join(
            f"{b['sharded'] / mib:.0f}+{b['unsharded'] / mib:.0f}"
            for b in r["per_micro_batch_bytes"]
        )
        lines.append(f"| {r['mode']} | {steps} | {r['peak_grad_bytes'] / mib:.0f} |")
    lines += [
        "",
        "Peak RSS growth during the micro-batches (in the JSON) is "
        + ", ".join(f"{r['mode']} {r['peak_rss_growth_kib'] / 1024:.0f} MiB" for r in runs)
        + "; it is dominated by activations and allocator caching, not by gradients.",
    ]
    return "\n".join(lines) + "\n"


def render() -> None:
    text = page(json.loads((OUT / "grad_memory.json").read_text()))
    (OUT / "grad_memory.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
