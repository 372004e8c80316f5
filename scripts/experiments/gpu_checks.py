"""The checks only a GPU reaches, in one run of a few minutes on one GPU.

    .venv/bin/python scripts/experiments/gpu_checks.py [--out docs/results] [--skip-bench]
    .venv/bin/python scripts/experiments/gpu_checks.py --render docs/results/gpu_checks.json

Every run goes through `run_train.sh`, as a user launches it, on every visible GPU:
1. bf16 + FlexAttention resume: the debug model (bf16 parameters, attention
   `auto` = FlexAttention on CUDA) for 20 steps with a checkpoint at step 10, then
   resumed from it: the same digests and losses at steps 11-20.
2. A GPU checkpoint resumed on the CPU: step 10 of that run on 2 CPU processes
   (`TORCHTITAN_DEVICE=cpu`, dense attention: FlexAttention has no backward on
   CPU): the same digests; losses close (another device and kernels).
3. Compiled blocks with an asynchronous save: the debug model with
   `training.compile = true` and `checkpoint.async_mode = async`; every step
   folder it wrote verifies (manifest, sizes and checksums).
4. The 1B benchmark, `benchmarks/bench_gpu.py` (its own JSON and page).
Writes `gpu_checks.{json,md}` under `--out`. Without CUDA it stops with one line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from harness.train import REPO, compare, copy_checkpoint, read_metrics, render_results

DEBUG = REPO / "train_configs" / "llama3_debugmodel.toml"
STEPS, K = 20, 10
COMMON = [
    "--training.steps", str(STEPS), "--checkpoint.interval", str(K),
    "--metrics.log_freq", "1", "--metrics.enable_tensorboard", "false",
    "--training.mixed_precision_param", "bfloat16",
]  # fmt: skip
CPU_LOSS_RTOL = 2e-2  # bf16 on another device with other attention kernels


def launch(dump: Path, args: list[str], nproc: int, env: dict[str, str]) -> float:
    """`NGPU=nproc ./run_train.sh` on the debug config; its log in dump/train.log;
    returns its wall seconds; exits with the output's tail if it failed."""
    full = {**os.environ, "NGPU": str(nproc), "CONFIG_FILE": str(DEBUG), **env}
    started = time.perf_counter()
    cmd = ["bash", str(REPO / "run_train.sh"), *args, "--job.dump_folder", str(dump)]
    proc = subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True)
    dump.mkdir(parents=True, exist_ok=True)
    (dump / "train.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode:
        sys.exit(f"{dump.name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def resume_checks(tmp: Path, gpus: int) -> list[dict[str, Any]]:
    gpu = {"OMP_NUM_THREADS": "4"}
    full = tmp / "bf16_flex"
    seconds = launch(full, COMMON, gpus, gpu)
    ref = read_metrics(full)
    out = []
    resumed = tmp / "bf16_flex_resumed"
    copy_checkpoint(full, K, resumed)
    launch(resumed, COMMON, gpus, gpu)
    row = compare(f"bf16 + FlexAttention, resumed at step {K} on the GPU", read_metrics(resumed),
                  ref, range(K + 1, STEPS + 1))  # fmt: skip
    out.append({**row, "seconds": round(seconds, 1), "loss_rtol": 0.0})
    on_cpu = tmp / "gpu_to_cpu"
    copy_checkpoint(full, K, on_cpu)
    cpu = {"TORCHTITAN_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "4"}
    launch(on_cpu, [*COMMON, "--model.attention_impl", "dense"], 2, cpu)
    row = compare(f"step {K} of the GPU run resumed on 2 CPU processes", read_metrics(on_cpu),
                  ref, range(K + 1, STEPS + 1))  # fmt: skip
    out.append({**row, "loss_rtol": CPU_LOSS_RTOL})
    return out


def compiled_async_check(tmp: Path, gpus: int) -> dict[str, Any]:
    from torchtitan.components.checkpoint.manifest import verify_step_dir

    dump = tmp / "compiled_async"
    args = [*COMMON, "--training.steps", "12", "--checkpoint.interval", "4",
            "--training.compile", "true", "--checkpoint.async_mode", "async"]  # fmt: skip
    seconds = launch(dump, args, gpus, {"OMP_NUM_THREADS": "4"})
    steps = sorted(int(p.name.split("-")[1]) for p in (dump / "checkpoint").glob("step-*"))
    verified = []
    for step in steps:
        try:
            verify_step_dir(str(dump / "checkpoint" / f"step-{step}"))
            verified.append(step)
        except Exception as exc:  # noqa: BLE001 (reported, not raised: the page says which)
            print(f"step-{step} does not verify: {exc}", file=sys.stderr)
    return {
        "run": "compiled blocks, asynchronous saves every 4 steps",
        "steps_logged": len(read_metrics(dump)),
        "saved_steps": steps,
        "verified_steps": verified,
        "ok": steps == [4, 8, 12] and verified == steps,
        "seconds": round(seconds, 1),
    }


def page(doc: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {r['run']} | {r['steps']} | {'yes' if r['digests_equal'] else '**no**'} | "
        f"{r['max_rel_dloss']:.2e} | {'yes' if r['max_rel_dloss'] <= r['loss_rtol'] else '**no**'}"
        f" (<= {r['loss_rtol']:g}) |"
        for r in doc["resumes"]
    )
    c = doc["compiled_async"]
    return (
        f"# GPU checks ({doc['machine']})\n\n"
        f"Written by `scripts/experiments/gpu_checks.py` from `gpu_checks.json` on "
        f"{doc['date']} (torch {doc['torch']}), {doc['seconds']:.0f} s in all. The debug "
        f"model, bf16 parameters, {STEPS} steps, checkpoint at step {K}, launched by "
        "`run_train.sh`.\n\n"
        "| resume | steps compared | digests equal | largest relative loss difference "
        "| within tolerance |\n|---|---|---|---|---|\n"
        f"{rows}\n\n"
        f"{c['run']}: {c['steps_logged']} steps logged, step folders {c['saved_steps']}, "
        f"verified {c['verified_steps']}: {'all right' if c['ok'] else '**not all right**'}.\n\n"
        "The 1B figures: [bench_gpu](bench_gpu.md).\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    p.add_argument("--render", type=Path, help="no runs: results JSON -> .md")
    p.add_argument("--skip-bench", action="store_true", help="leave out the 1B benchmark")
    p.add_argument("--keep", type=Path, help="keep the runs' folders here")
    a = p.parse_args()
    if a.render:
        return render_results(a.render, page)
    if not torch.cuda.is_available():
        print("error: no CUDA device: these checks need a GPU", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count()
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gpu_checks-")) if a.keep is None else a.keep
    try:
        resumes = resume_checks(tmp, gpus)
        compiled = compiled_async_check(tmp, gpus)
        doc = {
            "machine": f"{gpus} x {torch.cuda.get_device_name(0)}",
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "resumes": resumes,
            "compiled_async": compiled,
            "seconds": round(time.perf_counter() - started, 1),
        }
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / "gpu_checks.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        render_results(path, page)
        if not a.skip_bench:
            bench = [sys.executable, str(REPO / "benchmarks" / "bench_gpu.py")]
            subprocess.run([*bench, "--out", str(a.out / "bench_gpu.json")], check=True)
    finally:
        if a.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"gpu checks: {time.perf_counter() - started:.0f} s")
    ok = all(r["digests_equal"] and r["max_rel_dloss"] <= r["loss_rtol"] for r in resumes)
    return 0 if ok and compiled["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
