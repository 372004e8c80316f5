"""Loader CPU per trained token on one node: TP 1 against TP 2 and PP 2, 2 processes each.

    .venv/bin/python benchmarks/bench_loader_cpu.py [--steps 30]
    .venv/bin/python benchmarks/bench_loader_cpu.py --render   # .md from the committed JSON

Three trainer runs of the debug model (`train_configs/llama3_debugmodel.toml`,
CPU, gloo) on the same global batches:

- `tp1`: FSDP 2. Two loaders, each loading half of every global batch.
- `tp2`: TP 2. One loader (TP rank 0) broadcasts each batch to its peer.
- `pp2`: pipeline parallel 2 (1F1B). One loader (stage 0) broadcasts each batch
  to the other stage.
- `tp2_every_peer`: TP 2 as it was before one loader per coordinate: both peers
  run a loader of the whole batch (patched in here, not a product setting).

Each process's Zephon loader runs with its stage profile on
(`ZephonLoader(profile=True)`), with the tokenizer in its calling thread
(`TOKENIZERS_PARALLELISM=false`), so all of the loader's CPU is the thread CPU
of its own Python threads: read, parse, tokenize, pack, assemble, waits. Its
sum over the node's processes, divided by the tokens trained (steps x global
batch x seq_len), is the figure compared; tokens tokenized are counted beside
it. A count of work is exact; CPU time moves with a busy machine. (`native_cpu_s`
in the JSON is the CPU of the threads that never ran Python, which in a trainer
are mostly torch's and gloo's, not the loader's: it is left out of the figure.)

The broadcast's own cost is measured apart, without the trainer: two processes
broadcast a batch of a given shape 200 times between a `LoadingPeer` and a
`ReceivingPeer`; the CPU of both processes (their gloo threads included) per
token sent is set against the loader CPU per token that the receiver no longer
spends. In the trainer runs the loading peer's wall time in the broadcast is
recorded too (it includes waiting for the peer to arrive). Results:
docs/results/bench_loader_cpu.json and bench_loader_cpu.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
NAME = "bench_loader_cpu"
# name -> (TP, PP, one loader per coordinate)
MODES = {
    "tp1": (1, 1, True),
    "tp2": (2, 1, True),
    "pp2": (1, 2, True),
    "tp2_every_peer": (2, 1, False),
}
# Broadcast shapes (rows, seq_len): this benchmark's rank batch, and a long-context one.
SHAPES = [(32, 256), (8, 8192)]
REPEATS = 200
SEQ_LEN, GLOBAL_BATCH = 256, 32  # the debug config's


def train_args(steps: int) -> list[str]:
    return [
        "--job.config_file", str(REPO / "train_configs" / "llama3_debugmodel.toml"),
        "--training.steps", str(steps),
        "--checkpoint.enable", "false",
        "--metrics.log_freq", "10",
        "--data.recipe", str(REPO / "train_configs" / "data" / "sample_mix.toml"),
        "--data.tokenizer", str(REPO / "assets" / "tokenizer" / "tokenizer.json"),
    ]  # fmt: skip


# -- inside the torchrun processes --------------------------------------------------------


def train_worker(mode: str, out: str, argv: list[str]) -> None:
    """One trainer process, its loader profiled; writes its loader's figures at close."""
    import torch.distributed as dist

    import torchtitan.datasets.dataloader as glue
    import torchtitan.datasets.zephon_adapter as adapter
    from torchtitan import train
    from zephon import ZephonLoader

    adapter.ZephonLoader = functools.partial(ZephonLoader, profile=True)
    if not MODES[mode][2]:
        glue.one_loader_per_coordinate = lambda build, group, device: build()
    profiles: list[dict[str, Any]] = []
    close_adapter = adapter.ZephonAdapter.close

    def record_then_close(self: Any) -> None:
        profiles.append(self.loader.stats()["profile"])
        close_adapter(self)

    close_glue = glue.TrainDataLoader.close

    def write_then_close(self: Any) -> None:
        work = self.loader.work_done()
        close_glue(self)
        rank = dist.get_rank()
        doc = {"rank": rank, "work": work, "profiles": profiles}
        Path(out, f"rank{rank}.json").write_text(json.dumps(doc))

    adapter.ZephonAdapter.close = record_then_close
    glue.TrainDataLoader.close = write_then_close
    train.main(argv)


class RepeatLoader:
    """The same batch again and again (the broadcast measured alone)."""

    source_names = ("prose", "code")

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def next_batch(self) -> Any:
        return self.batch

    def work_done(self) -> dict[str, int]:
        return {}


def broadcast_worker(out: str) -> None:
    """Two processes: `REPEATS` broadcasts of a batch of each shape; the CPU of
    each process (all its threads) and the wall time, per shape."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from torchtitan.datasets.coordinate_loader import one_loader_per_coordinate
    from zephon import rows_to_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, cpu = dist.get_rank(), torch.device("cpu")
    results = []
    for rows, seq in SHAPES:
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, 2048, (rows, seq + 1), dtype=np.int32)
        positions = np.tile(np.arange(seq + 1, dtype=np.int32), (rows, 1))
        batch = rows_to_batch(0, tokens, positions, [bytes(32)] * 8)
        batch.source_tokens = np.array([rows * seq // 2, rows * seq // 2], dtype=np.int64)
        batch.source_docs = np.array([rows, rows], dtype=np.int64)
        repeat = functools.partial(RepeatLoader, batch)
        peer = one_loader_per_coordinate(repeat, dist.group.WORLD, cpu)
        peer.next_batch()  # warm-up
        dist.barrier()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(REPEATS):
            peer.next_batch()
        dist.barrier()
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
        results.append({"rows": rows, "seq_len": seq, "cpu_s": cpu_s, "wall_s": wall_s,
                        "bytes": peer.work_done().get("received_bytes", 0) // (REPEATS + 1)})  # fmt: skip
    Path(out, f"bcast{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    os._exit(0)  # no gloo teardown: it can abort a rank after collectives (exit_process)


# -- the driver ---------------------------------------------------------------------------


def torchrun(nproc: int, script_args: list[str], timeout: int = 1800) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", str(nproc), __file__, *script_args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(
            f"{cmd} exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def run_mode(mode: str, steps: int, tmp: Path) -> dict[str, Any]:
    out, dump = tmp / mode, tmp / f"{mode}_dump"
    out.mkdir()
    tp, pp, _ = MODES[mode]
    args = [*train_args(steps), "--parallelism.tensor_parallel_degree", str(tp),
            "--parallelism.pipeline_parallel_degree", str(pp),
            "--job.dump_folder", str(dump)]  # fmt: skip
    t0 = time.perf_counter()
    torchrun(2, ["--worker", mode, "--out", str(out), "--", *args])
    wall = time.perf_counter() - t0
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    records = [json.loads(line) for line in (dump / "metrics.jsonl").read_text().splitlines()]
    profiles = [p for r in ranks for p in r["profiles"]]
    thread_ns = sum(p["total_cpu_ns"] - p["native_tokenize_ns"] for p in profiles)
    work = [r["work"] for r in ranks]
    sender = next((w for w in work if "broadcast_bytes" in w), {})
    trained = steps * GLOBAL_BATCH * SEQ_LEN
    return {
        "tp": tp,
        "pp": pp,
        "processes": 2,
        "loaders": len(profiles),
        "steps": steps,
        "trained_tokens": trained,
        "tokens_tokenized": sum(w.get("tokens_tokenized", 0) for w in work),
        "loader_thread_cpu_s": thread_ns / 1e9,
        "loader_cpu_ns_per_token": thread_ns / trained,
        "native_cpu_s": sum(p["native_tokenize_ns"] for p in profiles) / 1e9,
        "broadcast_bytes_per_step": sender.get("broadcast_bytes", 0) // steps,
        "broadcast_wall_ms_per_step": sender.get("broadcast_us", 0) / 1e3 / steps,
        "digests": {str(r["step"]): r["digest"] for r in records if "digest" in r},
        "run_wall_s": wall,
    }


def run_broadcast(tmp: Path) -> list[dict[str, Any]]:
    out = tmp / "bcast"
    out.mkdir()
    torchrun(2, ["--broadcast-worker", "--out", str(out)])
    sender, receiver = (json.loads((out / f"bcast{r}.json").read_text()) for r in range(2))
    rows = []
    for s, r in zip(sender, receiver, strict=True):
        tokens = s["rows"] * s["seq_len"] * REPEATS
        rows.append({
            "rows": s["rows"], "seq_len": s["seq_len"], "bytes": r["bytes"],
            "sender_cpu_ns_per_token": s["cpu_s"] * 1e9 / tokens,
            "receiver_cpu_ns_per_token": r["cpu_s"] * 1e9 / tokens,
            "wall_us_per_batch": max(s["wall_s"], r["wall_s"]) * 1e6 / REPEATS,
        })  # fmt: skip
    return rows


def render(doc: dict[str, Any]) -> str:
    runs, b = doc["runs"], doc["broadcast"]
    lines = [
        f"Loader CPU per trained token on one node: the debug model, 2 CPU processes per "
        f"run, {doc['steps']} steps of {doc['global_batch']} x {doc['seq_len']} tokens "
        f"({doc['host']}).",
        "",
        "| run | loaders | tokens tokenized / trained | loader thread CPU (s) "
        "| loader CPU ns / trained token | broadcast per step |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        bcast = (
            f"{r['broadcast_bytes_per_step'] / 1024:.0f} KiB, "
            f"{r['broadcast_wall_ms_per_step']:.1f} ms wall"
            if r["broadcast_bytes_per_step"]
            else "-"
        )
        lines.append(
            f"| {name} (TP {r['tp']}, PP {r['pp']}) | {r['loaders']} | "
            f"{r['tokens_tokenized'] / r['trained_tokens']:.3f} | {r['loader_thread_cpu_s']:.2f} | "
            f"{r['loader_cpu_ns_per_token']:.0f} | {bcast} |"
        )
    lines += [
        "",
        "Loader thread CPU: the Python threads of every loader on the node (read, parse, "
        "tokenize in the calling thread, pack, assemble), summed. Broadcast per step: the "
        "bytes the loading peer sent, and its wall time in the broadcast, waiting for its "
        "peer to arrive included.",
    ]
    saved = (
        runs["tp2_every_peer"]["loader_cpu_ns_per_token"] - runs["tp2"]["loader_cpu_ns_per_token"]
    )
    lines += [
        "",
        f"The broadcast alone, {REPEATS} batches between two processes (CPU of each "
        "process, its gloo threads included):",
        "",
        "| rank batch (rows x seq_len) | bytes | sender CPU ns / token | receiver CPU ns / token "
        "| wall µs / batch |",
        "|---|---|---|---|---|",
    ]
    for x in b:
        lines.append(
            f"| {x['rows']} x {x['seq_len']} | {x['bytes']:,} | {x['sender_cpu_ns_per_token']:.1f} "
            f"| {x['receiver_cpu_ns_per_token']:.1f} | {x['wall_us_per_batch']:.0f} |"
        )
    cost = b[0]["sender_cpu_ns_per_token"] + b[0]["receiver_cpu_ns_per_token"]
    same = "the same" if doc["same_digests"] else "NOT the same"
    lines += [
        "",
        f"One loader per coordinate saves {saved:.0f} ns of loader CPU per trained token on "
        f"this node (tp2_every_peer against tp2); the broadcast costs {cost:.1f} ns per token "
        f"(sender and receiver, {b[0]['rows']} x {b[0]['seq_len']}). All runs logged {same} "
        "digests.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--worker", choices=list(MODES), help=argparse.SUPPRESS)
    p.add_argument("--broadcast-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--render", action="store_true", help="no runs: the JSON -> .md")
    p.add_argument("--results", type=Path, default=OUT, help="folder of the JSON and .md")
    args, rest = p.parse_known_args()
    if args.worker:
        train_worker(args.worker, args.out, rest[1:] if rest[:1] == ["--"] else rest)
        return
    if args.broadcast_worker:
        broadcast_worker(args.out)
        return
    json_path, md_path = args.results / f"{NAME}.json", args.results / f"{NAME}.md"
    if not args.render:
        with tempfile.TemporaryDirectory() as tmp:
            runs = {}
            for mode in MODES:
                runs[mode] = run_mode(mode, args.steps, Path(tmp))
                r = runs[mode]
                print(f"{mode}: {r['loaders']} loader(s), tokens tokenized {r['tokens_tokenized']:,} "
                      f"for {r['trained_tokens']:,} trained, loader thread CPU "
                      f"{r['loader_thread_cpu_s']:.2f} s = {r['loader_cpu_ns_per_token']:.0f} ns "
                      f"per trained token", flush=True)  # fmt: skip
            broadcast = run_broadcast(Path(tmp))
        digests = [r.pop("digests") for r in runs.values()]
        doc = {
            "steps": args.steps,
            "seq_len": SEQ_LEN,
            "global_batch": GLOBAL_BATCH,
            "host": f"{os.cpu_count()} CPUs, shared",
            "runs": runs,
            "broadcast": broadcast,
            "same_digests": all(d == digests[0] for d in digests),
        }
        args.results.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
    doc = json.loads(json_path.read_text())
    page = render(doc)
    md_path.write_text(page)
    print(page)


if __name__ == "__main__":
    main()
