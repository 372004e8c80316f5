"""GPU figures: tokens/s, MFU, data-wait share and peak memory of training steps,
the Zephon loader beside the `hf` baseline loader, eager beside compiled.

    .venv/bin/python benchmarks/bench_gpu.py [--cases zephon,hf,compiled] [--steps 14]
        [--warmup 4] [--out docs/results/bench_gpu.json] [-- trainer overrides]
    .venv/bin/python benchmarks/bench_gpu.py --render docs/results/bench_gpu.json

On a CUDA machine: the Llama 3 1B config (`train_configs/llama3_1b.toml`: bf16,
FSDP2 over every visible GPU, FlexAttention document masking) with `--rows-per-gpu`
rows a GPU of each case's seq_len. Cases (`--cases`, in this order):
  zephon       Zephon loader, eager
  hf           the `hf` baseline loader (per-rank split and packing), eager
  compiled     Zephon loader, `training.compile = true`
  compiled-8k  Zephon, compiled, seq_len 8192: a quarter of the rows (8 at least, one a
               lane) and of the micro-batch
Without CUDA (or with `--cpu`): the debug model on 2 CPU processes, a smoke run of
this script (no MFU, no device memory), never written over the committed JSON.

Figures are medians over the steps after `--warmup` (compile and allocator
warm-up), from each run's metrics.jsonl. Tokens/s is the headline. MFU is given
by two stated formulas, against the GPU's dense bf16 peak:
  matmul MFU    6 x the matmul parameters per token: no attention FLOPs, so it
                does not depend on seq_len or on the document mask;
  upstream MFU  6N + 12 x layers x dim x seq_len (TorchTitan's, which the trainer
                logs): every S x S attention score counted, although the causal
                document mask skips most of them, so it overstates long rows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

# `python benchmarks/bench_gpu.py` puts benchmarks/ first on sys.path.
from bench_trainer import REPO, read_metrics, run_train

from torchtitan.components.flops import peak_flops
from torchtitan.models import get_model_spec
from zephon import load_tokenizer

RESULTS = REPO / "docs" / "results" / "bench_gpu.json"
TOKENIZER = REPO / "assets" / "tokenizer" / "tokenizer.json"


def case_args(name: str, rows: int, seq_len: int, micro: int) -> tuple[list[str], int, int, int]:
    """(trainer overrides, rows, seq_len, micro-batch) of case `name`, from the
    shape of the eager case."""
    if name == "zephon":
        return [], rows, seq_len, micro
    if name == "hf":
        return ["--data.loader", "hf"], rows, seq_len, micro
    if name == "compiled":
        return ["--training.compile", "true"], rows, seq_len, micro
    if name == "compiled-8k":  # 4x the row length, a quarter of the rows (8 at least)
        return ["--training.compile", "true"], max(rows // 4, 8), 8192, max(micro // 4, 1)
    raise SystemExit(f"--cases: unknown case {name!r}; expected zephon, hf, compiled, compiled-8k")


def flops_split(config: str, seq_len: int) -> tuple[float, float]:
    """(matmul FLOPs, attention FLOPs) per token of the config's model at seq_len,
    by the spec's formula (6N at seq_len 0; the rest is attention)."""
    import tomllib

    with open(REPO / "train_configs" / config, "rb") as f:
        model = tomllib.load(f)["model"]
    spec = get_model_spec(model["name"])
    vocab = load_tokenizer(str(TOKENIZER)).vocab_size
    args = spec.model_args(model["flavor"], vocab_size=vocab, attention=model["attention"])
    matmul = spec.flops_per_token(args, 0)
    return matmul, spec.flops_per_token(args, seq_len) - matmul


def measure(
    name: str, nproc: int, config: str, rows: int, seq_len: int, micro: int, a: Any, gpus: int
) -> dict[str, Any]:
    extra, rows, seq_len, micro = case_args(name, rows, seq_len, micro)
    micro = min(micro, rows // max(nproc, 1))
    args = [
        "--training.steps", str(a.steps), "--checkpoint.enable", "false",
        "--metrics.log_freq", "1", "--metrics.enable_tensorboard", "false",
        "--training.global_batch_size", str(rows), "--training.local_batch_size", str(micro),
        "--training.seq_len", str(seq_len), *extra, *a.extra,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        env = {"OMP_NUM_THREADS": "4"}
        if gpus:  # run_train hides GPUs by default (CPU runs); give them back here
            visible = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(gpus)))
            env["CUDA_VISIBLE_DEVICES"] = visible
        print(f"{name}: {rows} x {seq_len} tokens a step, micro-batch {micro} ...", flush=True)
        proc = run_train(nproc, Path(tmp), config, args, env=env)
        if proc.returncode:
            sys.exit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        recs = [r for s, r in sorted(read_metrics(Path(tmp)).items()) if s > a.warmup]
    # The shape the trainer ran (overrides after `--` may have changed it).
    ran = re.search(r"global batch (\d+) x (\d+) tokens, micro-batch (\d+)", proc.stdout)
    if ran:
        rows, seq_len, micro = map(int, ran.groups())
    if not recs:
        sys.exit(f"{name}: no steps after the {a.warmup} warm-up steps; raise --steps")
    step_s = statistics.median(r["step_time_s"] for r in recs)
    tps = statistics.median(r["tokens_per_s"] for r in recs)
    wait = statistics.median(r["data_wait_s"] for r in recs)
    mem = [r["memory_gib"] for r in recs if r.get("memory_gib") is not None]
    matmul, attention = flops_split(config, seq_len)
    peak = peak_flops(torch.device("cuda", 0)) if gpus else None
    per_gpu = tps / max(nproc, 1)
    return {
        "case": name,
        "rows": rows,
        "seq_len": seq_len,
        "micro_batch": micro,
        "steps_measured": len(recs),
        "tokens_per_s": round(tps),
        "tokens_per_s_per_gpu": round(per_gpu),
        "step_time_s": round(step_s, 4),
        "data_wait_share": round(wait / step_s, 5),
        "matmul_mfu": round(per_gpu * matmul / peak, 4) if peak else None,
        "upstream_mfu": round(per_gpu * (matmul + attention) / peak, 4) if peak else None,
        "peak_memory_gib": round(max(mem), 1) if mem else None,
    }


def _pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def table(doc: dict[str, Any]) -> str:
    """The cases as a markdown table, tokens/s first."""
    head = (
        "| case | rows x seq_len | tokens/s | per device | data-wait | matmul MFU | upstream MFU "
        "| peak memory |\n|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {c['case']} | {c['rows']} x {c['seq_len']} | {c['tokens_per_s']:,} | "
        f"{c['tokens_per_s_per_gpu']:,} | {_pct(c['data_wait_share'], 2)} | "
        f"{_pct(c['matmul_mfu'])} | {_pct(c['upstream_mfu'])} | "
        + (f"{c['peak_memory_gib']} GiB |" if c["peak_memory_gib"] is not None else "n/a |")
        for c in doc["cases"]
    ]
    return head + "\n".join(rows) + "\n"


def page(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    return (
        f"# GPU figures ({doc['model']}, {m['devices']})\n\n"
        f"Written by `benchmarks/bench_gpu.py` from `bench_gpu.json` on {doc['date']}: "
        f"torch {m['torch']}, {m['gpus']} process(es), medians of {doc['steps']} steps "
        f"after {doc['warmup']} warm-up steps.\n\n"
        + table(doc)
        + "\nmatmul MFU: 6 x matmul parameters per token, no attention FLOPs. upstream MFU: "
        "6N + 12 x layers x dim x seq_len (TorchTitan's formula, logged by the trainer): "
        "it counts every attention score of a full S x S matrix, although the document "
        "mask skips most of them, so it overstates long rows. Data-wait: the median "
        "share of a step spent waiting for the batch.\n"
    )


def render(path: Path) -> int:
    doc = json.loads(path.read_text())
    path.with_suffix(".md").write_text(page(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="zephon,hf,compiled")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--warmup", type=int, default=4, help="first steps left out")
    p.add_argument("--rows-per-gpu", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--cpu", action="store_true", help="the debug model on 2 CPU processes")
    p.add_argument("--out", type=Path, help=f"JSON to write (CUDA default: {RESULTS})")
    p.add_argument("--render", type=Path, help="write the page of this JSON and stop")
    p.add_argument("extra", nargs="*", help="trainer overrides, after --")
    a = p.parse_args(argv)
    if a.render:
        return render(a.render)
    gpus = 0 if a.cpu else torch.cuda.device_count()
    if gpus:
        nproc, config, seq_len = gpus, "llama3_1b.toml", 2048
        devices = f"{gpus} x {torch.cuda.get_device_name(0)}"
        out = a.out or RESULTS
    else:
        nproc, config, seq_len = 2, "llama3_debugmodel.toml", 256
        devices = "2 CPU processes"
        out = a.out
        print("no CUDA device: the debug model on 2 CPU processes (no MFU, no GPU memory)")
    rows = max(8, a.rows_per_gpu * nproc - a.rows_per_gpu * nproc % 8)  # 8 lanes
    cases = [
        measure(name, nproc, config, rows, seq_len, a.micro_batch, a, gpus)
        for name in a.cases.split(",")
    ]
    doc = {
        "model": config.removesuffix(".toml"),
        "date": datetime.date.today().isoformat(),
        "steps": a.steps - a.warmup,
        "warmup": a.warmup,
        "machine": {
            "devices": devices,
            "gpus": nproc,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "cases": cases,
    }
    print(table(doc))
    if out is not None:
        out.write_text(json.dumps(doc, indent=1) + "\n")
        render(out)
        print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
