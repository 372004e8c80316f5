"""What an image costs outside its pixels: reading its header, and a decode process's
memory habits. The figures behind two choices of zephon/images (docs/design.md §14):

1. header: the planner's read of every image's header, on the thumbnails and the
   web scenes of benchmarks/bench_images.py, by Pillow (`header.open_image`) and
   from the bytes (`header_scan.scan_header`, which hands anything unusual to
   Pillow): µs of CPU per image on one thread, and how many the scan read itself;
2. decode process: one `python -m zephon.images.decode_processes` child decoding
   the web scenes and the photographs, fed tasks of 8 images as the loader does,
   with glibc's malloc defaults and with the settings the loader gives it
   (`decode_processes.MALLOC_SETTINGS`): its CPU and minor page faults per image,
   read from /proc.

Writes docs/results/bench_image_work.{json,md} (`--json` elsewhere).

    .venv/bin/python benchmarks/bench_image_work.py
    .venv/bin/python benchmarks/bench_image_work.py --render docs/results/bench_image_work.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import bench_images

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results" / "bench_image_work.json"
PER_TASK = 8  # images a task, as ImageWork sends them (MAX_DOCS_PER_TASK)


def corpus(name: str, work: Path, count: int | None) -> tuple[list[tuple[str, bytes]], Any]:
    spec = bench_images.CORPORA[name]
    n = count or spec.images
    recipe = bench_images.build_corpus(work / name, spec, n)
    shards = sorted((work / name / "shards").glob("*.tar"))
    return bench_images.read_images(shards)[:n], bench_images.image_spec(recipe)


def headers(images: list[tuple[str, bytes]], rounds: int) -> dict[str, Any]:
    """µs of CPU per image of Pillow's open and of the byte scan (best of rounds)."""
    from zephon.images.header import open_image
    from zephon.images.header_scan import scan_header

    limit = 1 << 40
    scanned = sum(scan_header(d, n, limit) is not None for n, d in images)
    best = {"pillow_us": float("inf"), "scan_us": float("inf")}
    for _ in range(rounds):
        for key, read in (("pillow_us", open_image), ("scan_us", scan_header)):
            c = time.process_time()
            for name, data in images:
                read(data, name, limit)
            best[key] = min(best[key], 1e6 * (time.process_time() - c) / len(images))
    return {"images": len(images), "scanned": scanned, **best}


def _proc_stat(pid: int) -> tuple[int, float]:
    """(minor faults, CPU seconds) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decode_process(images: list[tuple[str, bytes]], spec: Any, settings: bool) -> dict[str, Any]:
    """One decode process over `images`, two tasks in flight; its CPU and faults."""
    from zephon.images import decode_processes as dp
    from zephon.images import size_image
    from zephon.images.shared_patches import PatchArena

    saved = dict(dp.MALLOC_SETTINGS)
    if not settings:  # the child gets glibc's defaults
        dp.MALLOC_SETTINGS.clear()
    try:
        pool = dp.DecodeProcesses(1)
    finally:
        dp.MALLOC_SETTINGS.update(saved)
    arena = PatchArena()
    try:
        pid = pool._procs[0].pid
        name, data = images[0]
        slot = arena.take(size_image(data, name, spec).patch_bytes)
        pool.submit(dp.Task(spec, [[(data, name, slot)]], arena.segment_names())).result()
        arena.give(slot)  # the process has imported everything and decoded once
        faults0, cpu0 = _proc_stat(pid)
        pending: list[tuple[Any, list[Any]]] = []
        for at in range(0, len(images), PER_TASK):
            chunk = images[at : at + PER_TASK]
            slots = [arena.take(size_image(d, n, spec).patch_bytes) for n, d in chunk]
            docs = [[(d, n, s)] for (n, d), s in zip(chunk, slots, strict=True)]
            pending.append((pool.submit(dp.Task(spec, docs, arena.segment_names())), slots))
            if len(pending) > 2:
                future, done = pending.pop(0)
                future.result()
                for s in done:
                    arena.give(s)
        for future, _ in pending:
            future.result()
        faults1, cpu1 = _proc_stat(pid)
    finally:
        pool.close()
        arena.close()
    n = len(images)
    return {"images": n, "cpu_us": 1e6 * (cpu1 - cpu0) / n, "faults": (faults1 - faults0) / n}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    out: dict[str, Any] = {"headers": {}, "decode_process": {}}
    for name in ("thumbnails", "web"):
        images, _ = corpus(name, work, args.images)
        out["headers"][name] = headers(images, args.rounds)
    from zephon.images.decode_processes import MALLOC_SETTINGS

    for name in ("web", "photos"):
        images, spec = corpus(name, work, args.images)
        images = images[: args.decode_images]
        out["decode_process"][name] = {
            "defaults": decode_process(images, spec, settings=False),
            "settings": decode_process(images, spec, settings=True),
        }
    out["malloc_settings"] = MALLOC_SETTINGS
    out["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
    return out


def page(doc: dict[str, Any]) -> str:
    lines = [
        "# What an image costs outside its pixels",
        "",
        "Generated by `benchmarks/bench_image_work.py` from `bench_image_work.json`; "
        f"measured on {doc['machine']['cpus']} CPUs.",
        "",
        "Reading the header of every image on one thread (µs of CPU an image, best of "
        "rounds): Pillow's open, and the scan of `zephon/images/header_scan.py`, which "
        "hands what it does not fully understand to Pillow.",
        "",
        "| corpus | images | read by the scan | Pillow µs | scan µs |",
        "|---|---|---|---|---|",
    ]
    for name, h in doc["headers"].items():
        lines.append(
            f"| {name} | {h['images']:,} | {h['scanned']:,} | {h['pillow_us']:.1f} "
            f"| {h['scan_us']:.1f} |"
        )
    settings = ", ".join(f"`{k}={v}`" for k, v in doc["malloc_settings"].items())
    lines += [
        "",
        "One decode process, tasks of 8 images, two in flight: CPU and minor page "
        f"faults per image, with glibc's malloc defaults and with the loader's settings "
        f"({settings}).",
        "",
        "| corpus | images | defaults: µs | faults | settings: µs | faults |",
        "|---|---|---|---|---|---|",
    ]
    for name, d in doc["decode_process"].items():
        a, b = d["defaults"], d["settings"]
        lines.append(
            f"| {name} | {a['images']:,} | {a['cpu_us']:.0f} | {a['faults']:.0f} "
            f"| {b['cpu_us']:.0f} | {b['faults']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=None, help="corpus size (default: per corpus)")
    ap.add_argument("--decode-images", type=int, default=1000, help="images a decode run takes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=str(REPO / "outputs" / "bench_images"))
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--render", metavar="JSON", help="only regenerate the page from a JSON")
    args = ap.parse_args(argv)
    path = Path(args.render or args.json)
    if not args.render:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run(args), indent=2) + "\n")
    text = page(json.loads(path.read_text()))
    path.with_suffix(".md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
