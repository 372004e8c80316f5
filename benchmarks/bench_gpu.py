"""GPU readiness: tokens/s, model FLOPs utilisation, peak memory and data-wait
share of a few training steps.

    .venv/bin/python benchmarks/bench_gpu.py [--steps 8] [--warmup 3] [-- trainer overrides]

On a CUDA machine: the Llama 3 1B config on every visible GPU (bf16, FSDP;
FlexAttention document masking via model.attention_impl = auto), global batch
`--rows-per-gpu` x GPUs rows of 2048 tokens. Without CUDA: the debug model on 2
CPU processes, and it says so (no MFU or device memory there). Medians over the
steps after `--warmup` (compile and allocator warm-up), from metrics.jsonl.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

# `python benchmarks/bench_gpu.py` puts benchmarks/ first on sys.path.
from bench_trainer import read_metrics, run_train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3, help="first steps left out")
    p.add_argument("--rows-per-gpu", type=int, default=16)
    p.add_argument("extra", nargs="*", help="trainer overrides, after --")
    a = p.parse_args()
    gpus = torch.cuda.device_count()
    if gpus:
        nproc, config = gpus, "llama3_1b.toml"
        rows = a.rows_per_gpu * gpus
        # 8 lanes in the sample recipe: the global batch must be a multiple of 8.
        rows = max(8, rows - rows % 8)
        shape = ["--training.global_batch_size", str(rows), "--training.local_batch_size", "8"]
        print(f"CUDA: {gpus} x {torch.cuda.get_device_name(0)}, Llama 3 1B, {rows} x 2048 tokens")
    else:
        nproc, config, shape = 2, "llama3_debugmodel.toml", []
        print("no CUDA device: running the debug model on 2 CPU processes (no MFU, no GPU memory)")
    args = [
        "--training.steps", str(a.steps), "--checkpoint.enable", "false",
        "--metrics.log_freq", "1", "--metrics.enable_tensorboard", "false", *shape, *a.extra,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        # run_train hides GPUs by default (CPU runs); give them back here.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(gpus)))
        env = {"CUDA_VISIBLE_DEVICES": visible, "OMP_NUM_THREADS": "4"} if gpus else None
        proc = run_train(nproc, Path(tmp), config, args, env=env)
        if proc.returncode:
            sys.exit(f"training failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        recs = [r for s, r in sorted(read_metrics(Path(tmp)).items()) if s > a.warmup]
    if not recs:
        sys.exit(f"no steps after the {a.warmup} warm-up steps; raise --steps")
    step_s = statistics.median(r["step_time_s"] for r in recs)
    tps = statistics.median(r["tokens_per_s"] for r in recs)
    wait = statistics.median(r["data_wait_s"] for r in recs)
    print(f"steps measured     {len(recs)} (after {a.warmup} warm-up)")
    print(f"tokens/s           {tps:,.0f} ({tps / nproc:,.0f} per device)")
    print(f"step time          {step_s:.3f} s")
    print(f"data-wait share    {100 * wait / step_s:.2f} %")
    mfu = [r["mfu"] for r in recs if r.get("mfu") is not None]
    mem = [r["memory_gib"] for r in recs if r.get("memory_gib") is not None]
    print(f"MFU                {100 * statistics.median(mfu):.1f} %" if mfu else "MFU  n/a")
    print(f"peak memory        {max(mem):.2f} GiB (rank 0)" if mem else "peak memory  n/a")


if __name__ == "__main__":
    main()
