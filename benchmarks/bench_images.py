"""Benchmark of the image pipeline: Zephon against the raw image work and the conventional path.

On a generated image-caption corpus (WebDataset shards written by the sample
generator, scripts/sample_images.py: JPEG and PNG, 64 to 256 pixels a side,
`--images` of them), side by side in one run, alternated for `--rounds`:

a. pipeline: `ZephonLoader` over a captions recipe (8 lanes, best_fit, seq_len
   256, 32 rows a step, `--workers` workers, `on_exhausted = "repeat"`), from
   construction until the corpus runs out, in a fresh child process each
   round; images/s and tokens/s delivered (non-padding input tokens of the
   rows). The child also reports its RSS high-water against its RSS before
   the loader started, and the loader's own count of the image bytes it held
   ahead (`lookahead_peak_bytes`) against the budget (`lookahead_bytes`), for
   the default budget and for a tight one (`--tight-budget-mib`);
b. raw: the same images' bytes, held in memory, through the exact functions
   the loader's workers call per image (zephon/images/work.py: `plan_image`
   when read, `prepare_image` = decode + resize + patchify, and `image_digest`,
   the pixel hash of the batch digest) in a thread pool of `--workers` threads;
   and once more without `image_digest`, which prices the hash. The ratio a/b
   is of images/s.
c. conventional: `webdataset.WebDataset` over the same shards in
   `torch.utils.data.DataLoader` worker processes (`--workers` of them, shards
   split between them), each sample through the same `prepare_image` and the
   tokenizer, packed per rank in the main process by a greedy packer (a
   document goes into the current row if it fits, else the row is padded and
   the next one starts); images/s and tokens/s.

Where the pixel hash is paid: the thread that decoded the image hashes it
(`ImageWork._decode`, in the decode pool when workers >= 2), so it is part of
(a)'s parallel work and of (b)'s first figure.

Writes the raw results (`--json`, default docs/results/bench_images.json),
the table beside it (.md) and, for the committed results, the README figures
between its `bench_images` markers. `--quick` runs in seconds (a small corpus,
one round); the default takes a few minutes.

    .venv/bin/python benchmarks/bench_images.py [--quick] [--json PATH]
    .venv/bin/python benchmarks/bench_images.py --render docs/results/bench_images.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from bench_pipeline import quote_in_readme

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import sample_images  # noqa: E402  (the sample generator, scripts/)

TOKENIZER = REPO / "assets" / "tokenizer" / "tokenizer.json"
RESULTS = REPO / "docs" / "results" / "bench_images.json"
SEED = 31_337
PER_SHARD = 250
SEQ_LEN, GLOBAL_BATCH = 256, 32
IMAGE_EXTS = ("jpg", "png")

RECIPE = """\
# Written by benchmarks/bench_images.py.
[recipe]
name = "bench-images"
seed = 5
lanes = 8

[mixture]
unit = "tokens"
on_exhausted = "repeat"

[shuffle]
enabled = true
block_size = 32

[packing]
algorithm = "best_fit"
flush_interval = 32

[execution]
workers = 2
prefetch = 2

[image]
patch_size = 8
merge = 2
min_pixels = 1024
max_pixels = 16384

[[source]]
name = "captions"
path = "shards/*.tar"
format = "webdataset"
"""


def build_corpus(folder: Path, images: int) -> Path:
    """Shards of `images` captioned scenes and the recipe over them (kept if present)."""
    recipe = folder / "recipe.toml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(RECIPE)
    marker = folder / f"DONE-{images}"
    if marker.is_file():
        return recipe
    shards = folder / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    for old in shards.glob("*.tar"):
        old.unlink()
    rng = np.random.default_rng(SEED)
    for s, first in enumerate(range(0, images, PER_SHARD)):
        n = min(PER_SHARD, images - first)
        sample_images.write_shard(shards / f"part-{s:05d}.tar", rng, first, n, "img-")
    marker.write_text("")
    return recipe


def image_spec(recipe: Path) -> Any:
    from zephon import load_recipe

    return load_recipe(recipe).image


def read_images(shards: list[Path]) -> list[tuple[str, bytes]]:
    """(name, encoded bytes) of every image of the shards, in shard order."""
    out = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            for m in tar:
                if m.name.rsplit(".", 1)[-1] in IMAGE_EXTS:
                    f = tar.extractfile(m)
                    assert f is not None
                    out.append((m.name, f.read()))
    return out


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- (a) the pipeline, in a child process ---------------------------------------


def pipeline_child(recipe: Path, workers: int, budget: int, images_wanted: int) -> dict[str, Any]:
    """The loader from construction until it delivered `images_wanted` images (one
    epoch's worth of the corpus); this process does nothing else."""
    import torch  # noqa: F401  (the batches are torch tensors: a trainer has it loaded)

    from zephon import ZephonLoader

    before = rss_bytes()
    cpu0, t0 = time.process_time(), time.perf_counter()
    loader = ZephonLoader(
        recipe, TOKENIZER, SEQ_LEN, GLOBAL_BATCH, num_workers=workers, prefetch=2,
        lookahead_bytes=budget,
    )  # fmt: skip
    images = tokens = steps = 0
    first: float | None = None
    first_images = 0
    try:
        while images < images_wanted:
            batch = loader.next_batch()
            steps += 1
            if batch.images is not None:
                images += batch.images.num_images
            tokens += int(batch.source_tokens.sum())  # padding excluded
            if first is None:
                first, first_images = time.perf_counter() - t0, images
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        work = loader.stats()["work"]
    finally:
        loader.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "images": images, "tokens": tokens, "steps": steps, "wall_s": wall, "cpu_s": cpu,
        "first_batch_s": first, "images_after_first": images - first_images,
        "rss_before": before, "rss_peak": peak,
        "rss_growth": peak - before, "images_decoded": work.get("images_decoded", 0),
        "lookahead_peak_bytes": work.get("lookahead_peak_bytes", 0),
        "lookahead_bytes_budget": work.get("lookahead_bytes_budget", budget),
    }  # fmt: skip


def run_pipeline(recipe: Path, workers: int, budget: int, images: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(recipe), "--workers", str(workers)]
    cmd += ["--child-budget", str(budget), "--images", str(images)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"pipeline child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- (b) the raw image work -------------------------------------------------------


def raw_images(
    images: list[tuple[str, bytes]], spec: Any, workers: int, digest: bool
) -> dict[str, Any]:
    """The workers' per-image calls over `images` in `workers` threads (order kept)."""
    from zephon.images.documents import image_digest
    from zephon.images.prepare import plan_image, prepare_image

    def one(item: tuple[str, bytes]) -> int:
        name, data = item
        plan_image(data, name, spec)
        out = prepare_image(data, name, spec)
        if digest:
            image_digest(out.grid, out.patches)
        return out.num_tokens

    cpu0, t0 = time.process_time(), time.perf_counter()
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            done = list(pool.map(one, images, chunksize=8))
    else:
        done = list(map(one, images))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"images": len(done), "placeholders": sum(done), "wall_s": wall, "cpu_s": cpu}


# -- (c) the conventional path --------------------------------------------------


class _Prepare:
    """webdataset sample -> (placeholders, patches, caption ids), in a DataLoader worker."""

    def __init__(self, spec: Any):
        self.spec, self.tok = spec, None

    def __call__(self, sample: dict[str, Any]) -> tuple[int, np.ndarray, list[int]]:
        from zephon.images.prepare import prepare_image

        if self.tok is None:  # one tokenizer per worker process
            from tokenizers import Tokenizer

            self.tok = Tokenizer.from_file(str(TOKENIZER))
        ext = next(e for e in IMAGE_EXTS if e in sample)
        out = prepare_image(sample[ext], sample["__key__"], self.spec)
        ids = self.tok.encode(sample["txt"].decode("utf-8"), add_special_tokens=False).ids
        return out.num_tokens, out.patches, ids


def conventional(shards: list[Path], spec: Any, workers: int) -> dict[str, Any]:
    """webdataset + DataLoader worker processes + a greedy per-rank packer."""
    import torch
    import webdataset as wds

    urls = [str(s) for s in shards]
    data = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_Prepare(spec))
    loader = torch.utils.data.DataLoader(
        data, batch_size=None, num_workers=workers, prefetch_factor=4 if workers else None
    )
    row = SEQ_LEN + 1
    images = tokens = rows = used = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    for placeholders, _patches, ids in loader:
        n = placeholders + 2 + len(ids) + 1  # image block, caption, EOS
        if used + n > row:  # greedy: pad the row, start the next
            rows += 1
            used = 0
        used += min(n, row)
        images += 1
        tokens += min(n, row)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"images": images, "tokens": tokens, "rows": rows + (used > 0), "wall_s": wall,
            "cpu_s": cpu}  # fmt: skip


# -- the run ---------------------------------------------------------------------


def rate(r: dict[str, Any], key: str) -> float:
    return r[key] / r["wall_s"] if r["wall_s"] > 0 else 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(args.work)
    recipe = build_corpus(folder, args.images)
    shards = sorted((folder / "shards").glob("*.tar"))
    spec = image_spec(recipe)
    images = read_images(shards)
    budget = 512 << 20
    tight = args.tight_budget_mib << 20
    rounds: list[dict[str, Any]] = []
    raw_images(images[:50], spec, args.workers, True)  # warm imports and caches
    for _ in range(args.rounds):
        r: dict[str, Any] = {"pipeline": run_pipeline(recipe, args.workers, budget, args.images)}
        r["raw"] = raw_images(images, spec, args.workers, True)
        r["raw_no_digest"] = raw_images(images, spec, args.workers, False)
        r["raw_1_thread"] = raw_images(images, spec, 1, True)
        r["conventional"] = conventional(shards, spec, args.workers)
        rounds.append(r)
    tight_run = run_pipeline(recipe, args.workers, tight, args.images)

    def med(kind: str, key: str) -> float:
        return statistics.median(rate(r[kind], key) for r in rounds)

    a_img, b_img = med("pipeline", "images"), med("raw", "images")
    sustained = statistics.median(
        r["pipeline"]["images_after_first"]
        / (r["pipeline"]["wall_s"] - r["pipeline"]["first_batch_s"])
        for r in rounds
    )
    summary = {
        "pipeline_images_s": a_img,
        "pipeline_sustained_images_s": sustained,
        "pipeline_first_batch_s": statistics.median(r["pipeline"]["first_batch_s"] for r in rounds),
        "pipeline_tokens_s": med("pipeline", "tokens"),
        "raw_images_s": b_img,
        "raw_no_digest_images_s": med("raw_no_digest", "images"),
        "raw_1_thread_images_s": med("raw_1_thread", "images"),
        "conventional_images_s": med("conventional", "images"),
        "conventional_tokens_s": med("conventional", "tokens"),
        "ratio_pipeline_raw": a_img / b_img if b_img else 0.0,
        "ratio_sustained_raw": sustained / b_img if b_img else 0.0,
        "digest_share_of_raw": 1 - b_img / med("raw_no_digest", "images")
        if med("raw_no_digest", "images")
        else 0.0,
    }
    memory = {
        "default": {k: rounds[-1]["pipeline"][k] for k in MEMORY_KEYS},
        "tight": {k: tight_run[k] for k in MEMORY_KEYS},
    }
    return {
        "title": "Image pipeline: Zephon against the raw image work and webdataset + DataLoader",
        "config": {
            "quick": args.quick,
            "images": args.images,
            "shards": len(shards),
            "workers": args.workers,
            "rounds": args.rounds,
            "seq_len": SEQ_LEN,
            "global_batch": GLOBAL_BATCH,
            "lanes": 8,
            "corpus_bytes": sum(len(d) for _, d in images),
            "image_settings": "patch 8, merge 2, 1024..16384 pixels",
        },  # fmt: skip
        "summary": summary,
        "memory": memory,
        "rounds": rounds,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "busy_2_core": args.busy,
        },  # fmt: skip
    }


MEMORY_KEYS = ("lookahead_bytes_budget", "lookahead_peak_bytes", "rss_before", "rss_peak",
               "rss_growth")  # fmt: skip


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def table(doc: dict[str, Any]) -> str:
    """The figures the README quotes."""
    s, c = doc["summary"], doc["config"]
    n = c["workers"]
    return (
        f"| {c['images']:,} images, {n} workers | images/s | tokens/s |\n|---|---|---|\n"
        f"| (a) Zephon pipeline, start to end | {s['pipeline_images_s']:.0f} | "
        f"{s['pipeline_tokens_s']:,.0f} |\n"
        f"| (a') the same after its first batch "
        f"({s['pipeline_first_batch_s']:.1f} s) | {s['pipeline_sustained_images_s']:.0f} | |\n"
        f"| (b) raw decode + resize + patchify + hash, {n} threads | {s['raw_images_s']:.0f} | |\n"
        f"| (b') the same, 1 thread | {s['raw_1_thread_images_s']:.0f} | |\n"
        f"| (c) webdataset + DataLoader ({n} processes) + greedy packing | "
        f"{s['conventional_images_s']:.0f} | {s['conventional_tokens_s']:,.0f} |\n"
        f"| ratio a/b (a'/b) | {s['ratio_pipeline_raw']:.2f} ({s['ratio_sustained_raw']:.2f}) | |\n"
    )


def page(doc: dict[str, Any]) -> str:
    s, m, c = doc["summary"], doc["memory"], doc["config"]
    where = (
        "measured on a busy shared 2-core machine (other jobs running); rerun on a quiet one"
        if doc["machine"]["busy_2_core"]
        else f"measured on {doc['machine']['cpus']} CPUs"
    )
    lines = [
        f"# {doc['title']}",
        "",
        f"Generated by `benchmarks/bench_images.py` from `bench_images.json`; {where}. "
        f"Medians of {c['rounds']} round(s); {c['images']:,} images in {c['shards']} shards "
        f"({_mib(c['corpus_bytes'])} encoded), {c['image_settings']}.",
        "",
        table(doc),
        f"- The pixel hash of the batch digest is paid by the worker that decoded the image "
        f"(`ImageWork._decode`): {100 * s['digest_share_of_raw']:.1f}% of the raw image work "
        f"({s['raw_no_digest_images_s']:.0f} images/s without it).",
        "",
        "| lookahead budget | accounted peak | RSS before | RSS peak | RSS growth |",
        "|---|---|---|---|---|",
    ]
    for name in ("default", "tight"):
        r = m[name]
        lines.append(
            f"| {_mib(r['lookahead_bytes_budget'])} ({name}) | {_mib(r['lookahead_peak_bytes'])} "
            f"| {_mib(r['rss_before'])} | {_mib(r['rss_peak'])} | {_mib(r['rss_growth'])} |"
        )
    lines += [
        "",
        "The accounted peak is the loader's own count (`lookahead_peak_bytes`): every "
        "document queued for a call reserves its patches and its largest decode peak "
        "from the header (Pillow's working copies included), and the step being "
        "produced is never held back, so a budget below one step's documents (the tight "
        "one) cannot lower it. RSS is the child process's (`ru_maxrss`), before: after "
        "importing torch and zephon, before the loader is built.",
        "",
        f"Against one raw thread, a/b' = {s['pipeline_images_s'] / s['raw_1_thread_images_s']:.2f}"
        f"; the conventional path (c) against the pipeline: "
        f"{s['conventional_images_s'] / s['pipeline_images_s']:.2f}.",
    ]
    return "\n".join(lines) + "\n"


def publish(path: Path) -> int:
    doc = json.loads(path.read_text())
    path.with_suffix(".md").write_text(page(doc))
    if path.resolve() == RESULTS.resolve():
        quote_in_readme("bench_images", table(doc))
    print(page(doc), end="")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small corpus, one round (seconds)")
    ap.add_argument("--images", type=int, default=None, help="corpus size (default 8000)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="default 3, 1 with --quick")
    ap.add_argument("--tight-budget-mib", type=int, default=4)
    ap.add_argument("--work", default=str(REPO / "outputs" / "bench_images"))
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--busy", action="store_true", help="say in the page: a busy 2-core machine")
    ap.add_argument("--render", metavar="JSON", help="only regenerate the page from a JSON")
    ap.add_argument("--child", metavar="RECIPE", help=argparse.SUPPRESS)
    ap.add_argument("--child-budget", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.images is None:
        args.images = 240 if args.quick else 8000
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(
            json.dumps(
                pipeline_child(Path(args.child), args.workers, args.child_budget, args.images)
            )
        )
        return 0
    if args.render:
        return publish(Path(args.render))
    doc = run(args)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    publish(out)
    s = doc["summary"]
    print(f"RATIO pipeline/raw = {s['ratio_pipeline_raw']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
