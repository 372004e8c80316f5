"""First-run cost of Zephon's source index: JSONL line index and gzip seek points.

For each size (GB of JSONL text) the script generates a web-like corpus
(log-normal document lengths, mean about 7.6 KB, plus a 1% tail of 100-500 KB
documents) as 8 plain `.jsonl` files and, optionally, the same files gzipped
(level 1). Then, each measurement in a fresh subprocess so that peak RSS is
its own:

- `plain_first`: build the index of every file (empty cache): wall and CPU
  seconds, peak RSS, throughput.
- `plain_cached`: the same with the index cached (what every later run and
  every other rank pays): memory-mapped, no scan.
- `plain_concurrent`: 4 processes started together on an empty cache, as 4
  ranks of a node would be: how many builds ran (must be 1 per file; the
  processes index different files in parallel) and the time until the last
  process has every index.
- `gzip_first`, `gzip_cached`, `gzip_concurrent`: the same for the gzip
  files, plus the cache size (seek points) next to the compressed and
  decompressed sizes. Cached runs also time 200 random reads of 64 documents.

The figures are linear in the data (one sequential pass), so the JSON also
holds an extrapolation to 100 GB from the largest size measured. Results go
to docs/results/bench_index.json and bench_index.md.

    python benchmarks/bench_index.py --sizes 1 --work /tmp/zephon-bench-index
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FILES = 8
MEAN_BYTES = 7600
# The measured child: build readers for a recipe and report what it cost.
CHILD = r"""
import json, os, sys, time
import numpy as np
from zephon import load_recipe
from zephon.sources import SourceReader
from zephon.sources import jsonl

recipe_path, cache, reads, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
original = jsonl._Index._build
def counted(self):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    original(self)
jsonl._Index._build = counted
t0, c0 = time.perf_counter(), time.process_time()
spec = load_recipe(recipe_path).sources[0]
reader = SourceReader(spec, cache)
out = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
       "docs": reader.num_docs}
if reads:
    rng = np.random.default_rng(0)
    t1 = time.perf_counter()
    for a in rng.integers(0, reader.num_docs - 64, reads):
        reader.read_range(int(a), int(a) + 64)
    out["random_reads_s"] = time.perf_counter() - t1
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across exec
with open("/proc/self/status") as f:
    hwm = next(line for line in f if line.startswith("VmHWM"))
out["peak_rss_mb"] = int(hwm.split()[1]) / 1024
print(json.dumps(out))
"""


def generate(folder: Path, gbytes: float, gz: bool, seed: int = 0) -> dict[str, Any]:
    """Write FILES JSONL files holding about `gbytes` GB of documents."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # A pool of word-like text to cut documents from (fast to generate, no escaping).
    letters = np.frombuffer(b"etaoinshrdlucmfwypvbgkqjxz", dtype=np.uint8)
    pool = letters[rng.integers(0, len(letters), 64 << 20)]
    pool[rng.random(len(pool)) < 0.17] = ord(" ")
    pool = pool.tobytes()
    target = int(gbytes * (1 << 30))
    per_file = target // FILES
    docs = 0
    sigma = 1.0
    mu = np.log(MEAN_BYTES) - sigma**2 / 2
    for k in range(FILES):
        path = folder / f"part-{k:03d}.jsonl"
        written = 0
        with open(path, "wb") as f:
            while written < per_file:
                n = rng.lognormal(mu, sigma, 256).astype(np.int64) + 20
                tail = rng.random(256) < 0.01
                n[tail] = rng.integers(100_000, 500_000, int(tail.sum()))
                n = np.minimum(n, len(pool) - 1)
                starts = rng.integers(0, len(pool) - n)
                lines = [
                    b'{"id": %d, "text": "%s"}\n' % (docs + i, pool[s : s + m])
                    for i, (s, m) in enumerate(zip(starts, n, strict=True))
                ]
                blob = b"".join(lines)
                f.write(blob)
                written += len(blob)
                docs += len(lines)
        if gz:
            with open(path, "rb") as src, gzip.open(f"{path}.gz", "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 16 << 20)
    plain = sum(p.stat().st_size for p in folder.glob("*.jsonl"))
    packed = sum(p.stat().st_size for p in folder.glob("*.jsonl.gz"))
    return {"docs": docs, "plain_bytes": plain, "gzip_bytes": packed}


def recipe(folder: Path, pattern: str) -> Path:
    path = folder / f"recipe-{pattern.replace('*', 'x')}.toml"
    path.write_text(
        f'[recipe]\nlanes = 8\n[[source]]\nname = "web"\npath = "{pattern}"\nformat = "jsonl"\n'
    )
    return path


def child(recipe_path: Path, cache: Path, log: Path, reads: int = 0) -> subprocess.Popen:
    cmd = [sys.executable, "-c", CHILD, str(recipe_path), str(cache), str(reads), str(log)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)


def measure(recipe_path: Path, cache: Path, reads: int = 0, procs: int = 1) -> dict[str, Any]:
    log = cache.parent / f"{cache.name}.builds"
    log.unlink(missing_ok=True)
    t0 = time.perf_counter()
    running = [child(recipe_path, cache, log, reads) for _ in range(procs)]
    outs = []
    for p in running:
        stdout, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"indexing child failed ({p.returncode})")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    wall = time.perf_counter() - t0
    builds = len(log.read_text().split()) if log.exists() else 0
    res = dict(outs[0]) if procs == 1 else {"per_process": outs}
    res.update({"builds": builds, "wall_all_s": wall})
    return res


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_size(work: Path, gbytes: float, gz: bool) -> dict[str, Any]:
    data = work / f"corpus-{gbytes:g}GB"
    t0 = time.perf_counter()
    info = generate(data, gbytes, gz) if not (data / "meta.json").exists() else None
    if info is None:
        info = json.loads((data / "meta.json").read_text())
    else:
        (data / "meta.json").write_text(json.dumps(info))
    print(f"# {gbytes:g} GB corpus ready in {time.perf_counter() - t0:.0f} s: {info}", flush=True)
    out: dict[str, Any] = {"size_gb": gbytes, **info}
    for kind, pattern in (("plain", "*.jsonl"), ("gzip", "*.jsonl.gz")):
        if kind == "gzip" and not gz:
            continue
        r = recipe(data, pattern)
        cache = work / f"cache-{gbytes:g}-{kind}"
        shutil.rmtree(cache, ignore_errors=True)
        first = measure(r, cache)
        cached = measure(r, cache, reads=200)
        out[f"{kind}_first"], out[f"{kind}_cached"] = first, cached
        out[f"{kind}_cache_bytes"] = dir_bytes(cache)
        print(f"{kind} {gbytes:g} GB first {first}\n    cached {cached}", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
        out[f"{kind}_concurrent"] = measure(r, cache, procs=4)
        print(f"{kind} concurrent {out[f'{kind}_concurrent']}", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
    return out


def extrapolate(row: dict[str, Any]) -> dict[str, Any]:
    scale = 100 / row["size_gb"]
    out = {"from_size_gb": row["size_gb"]}
    for kind in ("plain", "gzip"):
        if f"{kind}_first" in row:
            out[f"{kind}_first_wall_s"] = row[f"{kind}_first"]["wall_s"] * scale
            out[f"{kind}_cache_bytes"] = row[f"{kind}_cache_bytes"] * scale
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Index cost (benchmarks/bench_index.py)",
        "",
        f"Machine: {result['machine']}. Shared with other jobs while measured: "
        "times are noisy, byte counts are not.",
        "",
        "| corpus | docs | kind | first run wall s | CPU s | MB/s | peak RSS MB | cached s | "
        "cache MB | 200 random 64-doc reads s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["sizes"]:
        for kind in ("plain", "gzip"):
            if f"{kind}_first" not in row:
                continue
            f, c = row[f"{kind}_first"], row[f"{kind}_cached"]
            mbps = row["plain_bytes"] / f["wall_s"] / 1e6
            lines.append(
                f"| {row['size_gb']:g} GB ({row['plain_bytes'] / 1e9:.2f} GB text"
                + (f", {row['gzip_bytes'] / 1e9:.2f} GB gz" if kind == "gzip" else "")
                + f") | {row['docs']:,} | {kind} | {f['wall_s']:.1f} | {f['cpu_s']:.1f} | "
                f"{mbps:.0f} | {f['peak_rss_mb']:.0f} | {c['wall_s']:.2f} | "
                f"{row[f'{kind}_cache_bytes'] / 1e6:.1f} | {c.get('random_reads_s', 0):.2f} |"
            )
    lines += ["", "Concurrent first run (4 processes on an empty cache, as 4 ranks of a node):", ""]
    for row in result["sizes"]:
        for kind in ("plain", "gzip"):
            cc = row.get(f"{kind}_concurrent")
            if cc:
                lines.append(
                    f"- {row['size_gb']:g} GB {kind}: {cc['builds']} index builds for {FILES} "
                    f"files; all 4 processes done in {cc['wall_all_s']:.1f} s "
                    f"(one process alone: {row[f'{kind}_first']['wall_all_s']:.1f} s; both with "
                    "process start-up)"
                )
    lines += [
        "",
        "The corpus files were just written, so the plain scan reads from the page cache: "
        "its MB/s is the scan's own speed; from a cold disk the disk's read speed bounds it.",
    ]
    ex = result["extrapolated_100gb"]
    lines += [
        "",
        f"Extrapolated to 100 GB (linear, from {ex['from_size_gb']:g} GB): plain "
        f"{ex['plain_first_wall_s'] / 60:.0f} min first run, cache "
        f"{ex['plain_cache_bytes'] / 1e6:.0f} MB"
        + (
            f"; gzip (from {ex['gzip_from_size_gb']:g} GB) {ex['gzip_first_wall_s'] / 60:.0f} "
            f"min, cache {ex['gzip_cache_bytes'] / 1e6:.0f} MB"
            if "gzip_first_wall_s" in ex
            else ""
        )
        + ". Once per node; later runs and other ranks map the cached index.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=float, nargs="+", default=[1.0], help="GB of JSONL text")
    p.add_argument("--no-gzip", action="store_true", help="skip the gzip measurements")
    p.add_argument(
        "--gzip-max-gb", type=float, default=None, help="measure gzip only up to this size"
    )
    p.add_argument("--work", default="/tmp/zephon-bench-index", help="corpus and cache folder")
    p.add_argument("--keep", action="store_true", help="keep the generated corpora")
    p.add_argument("--out", default=str(REPO / "docs" / "results" / "bench_index"))
    p.add_argument("--markdown-only", action="store_true", help="rewrite OUT.md from OUT.json")
    args = p.parse_args(argv)
    if args.markdown_only:
        Path(args.out + ".md").write_text(
            markdown(json.loads(Path(args.out + ".json").read_text()))
        )
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, python "
        f"{platform.python_version()}",
        "sizes": [],
    }
    for gb in args.sizes:
        gz = not args.no_gzip and (args.gzip_max_gb is None or gb <= args.gzip_max_gb)
        result["sizes"].append(run_size(work, gb, gz=gz))
        if not args.keep:
            shutil.rmtree(work / f"corpus-{gb:g}GB", ignore_errors=True)
        write(result, args.out)  # after every size, so a long run keeps what it measured
    print(markdown(result))
    return 0


def write(result: dict[str, Any], out: str) -> None:
    rows = result["sizes"]
    ex = extrapolate(rows[-1])
    for row in reversed(rows):  # gzip from the largest size that measured it
        if "gzip_first" in row:
            ex.update({k: v for k, v in extrapolate(row).items() if k.startswith("gzip")})
            ex["gzip_from_size_gb"] = row["size_gb"]
            break
    result["extrapolated_100gb"] = ex
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(out + ".md").write_text(markdown(result))


if __name__ == "__main__":
    sys.exit(main())
