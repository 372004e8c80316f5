"""Benchmark of the image pipeline: Zephon against the raw image work and the conventional path.

Three generated image-caption corpora (WebDataset shards written by the sample
generator, harness/sample_images.py: JPEG and PNG scenes, or photograph-like
JPEGs, with captions), each with image settings of its own (`CORPORA`):

- web: scenes of 192 to 768 pixels a side, the sizes of web image-caption
  data, with Qwen2-VL-like settings (patch 14, merge 2, at most 200,704
  pixels = 256 placeholders an image), rows of 1,024 tokens;
- thumbnails: the sample data's 64 to 256 pixels a side (patch 8, merge 2,
  at most 16,384 pixels), rows of 256 tokens. Each image is a fraction of a
  millisecond of work, so this one prices the loader's own Python per image;
- photos: photograph-like JPEGs (`sample_images.photo`: texture at every
  scale, edges and sensor noise, quality 70 to 95) of 360 to 1,000 pixels a
  side, 20 to 300 KB a file (80 on average), with the web settings. The scenes
  are flat colour, about 5 KB a file (web), far easier to decode than photographs;
  this one prices decoding (and resizing: most are above the pixel budget) as
  photographs cost it. The page gives its files' mean, smallest and largest
  size.

For each, side by side in one run, alternated for `--rounds`:

a. pipeline: `ZephonLoader` over a captions recipe (8 lanes, best_fit, 32 rows
   a step, `--workers` workers, `on_exhausted = "repeat"`), from construction
   until it delivered `--epochs` times as many images as the corpus holds, in a
   fresh child process each round that runs Python's garbage collection as the
   trainer does (`[training] gc_every_steps`); images/s and tokens/s delivered
   (non-padding input tokens of the rows), start to end and sustained: from
   the step by which a fifth of the images were delivered to the end, when the
   first batch (best_fit needs every lane's open bins filled before its first
   rows), the lookahead and the prefetched batches are long behind. Both ends
   of that window have the same work in flight (lookahead and prefetch), so
   neither flatters it. The child also reports its RSS high-water against its
   RSS before the loader started, and the loader's own count of the image
   bytes it held ahead (`lookahead_peak_bytes`) against the budget
   (`lookahead_bytes`), for the default budget and for a tight one
   (`--tight-budget-mib`);
b. plain loop: the same images' bytes, held in memory, through the exact
   functions the loader's workers call per image (zephon/images/work.py:
   `size_image` when read, keeping the opened image, then `prepare_image` on
   it = decode + resize + patchify) in a thread pool of `--workers` threads,
   and once on one thread (b');
h. the plain loop and `image_digest`, the pixel hash the batch digest covers,
   in `--workers` threads: what the pipeline paid for every image until
   2026-12-07, and what a step's reader pays now when it reads the digests.
   (b) and (h) run right before and right after each (a), and each round's
   ratios a/b and a/h are of images/s against the mean of the two: this
   machine's speed drifts by up to a quarter within minutes, which one run
   per round would put into the ratio. The page gives the medians over rounds.
c. conventional: `webdataset.WebDataset` over the same shards in
   `torch.utils.data.DataLoader` worker processes (`--workers` of them, shards
   split between them), each sample through the same `prepare_image` and the
   tokenizer, packed per rank in the main process by a greedy packer (a
   document goes into the current row if it fits, else the row is padded and
   the next one starts); images/s and tokens/s.

Then one more run of (a) with the stage profile on (`ZephonLoader(profile=True)`,
zephon/stage_profile.py): its thread CPU per delivered image, split into the
image work, which (h) does too (header plans when read; decode, resize,
patches and pixel hash in the decode processes), and the pipeline's own (tar
member reads, the captions' tokenizer calls, framing, planning, packing,
assembling, hand-offs). On two cores that split, and the cores each side keeps
busy, is what sets the ratios.

Where the pixel hash is paid: since 2026-12-07, by whoever reads a batch's
digests, when it reads them (images/assembly.py `LaneDigests`); (a) reads
none, as the trainer reads none unless it logs them. Results written before
(no `digests_read` in a run) had it paid by the decode process that decoded
the image, as part of (a)'s parallel work.

Writes the raw results (`--json`, default docs/results/bench_images.json),
the table beside it (.md) and, for the committed results, the figures between
the `bench_images` markers of docs/results.md (QUOTED_IN). `--quick` runs in seconds (small corpora,
one round, one epoch); the default takes about half an hour for the three
corpora (`--corpora` picks some).

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness import sample_images  # the sample generator
from harness.train import quote_in_page

REPO = Path(__file__).resolve().parents[1]

TOKENIZER = REPO / "assets" / "tokenizer" / "tokenizer.json"
RESULTS = REPO / "docs" / "results" / "bench_images.json"
# The documentation page whose `<!-- NAME:begin/end -->` markers quote this benchmark's summary.
QUOTED_IN = "docs/results.md"
SEED = 31_337
PER_SHARD = 250
GLOBAL_BATCH, LANES = 32, 8
IMAGE_EXTS = ("jpg", "png")


@dataclass(frozen=True)
class Corpus:
    """A generated corpus and the image settings and row length it is read with."""

    what: str  # for the page
    sizes: tuple[tuple[int, int], ...]  # (width, height) of the scenes
    patch_size: int
    merge: int
    min_pixels: int
    max_pixels: int
    seq_len: int
    images: int  # default corpus size
    quick_images: int
    make: str = "scene"  # the sample_images function that draws one image

    @property
    def settings(self) -> str:
        return (
            f"patch {self.patch_size}, merge {self.merge}, "
            f"{self.min_pixels:,}..{self.max_pixels:,} pixels, rows of {self.seq_len:,} tokens"
        )


CORPORA = {
    "web": Corpus(
        what="scenes of 192-768 pixels a side (web image-caption sizes)",
        sizes=tuple((3 * w, 3 * h) for w, h in sample_images.SIZES),
        patch_size=14, merge=2, min_pixels=3_136, max_pixels=200_704, seq_len=1024,
        images=6000, quick_images=240,
    ),
    "thumbnails": Corpus(
        what="scenes of 64-256 pixels a side (the sample data's sizes)",
        sizes=sample_images.SIZES,
        patch_size=8, merge=2, min_pixels=1_024, max_pixels=16_384, seq_len=256,
        images=8000, quick_images=240,
    ),
    "photos": Corpus(
        what="photograph-like JPEGs of 360-1,000 pixels a side, quality 70-95",
        sizes=sample_images.PHOTO_SIZES,
        patch_size=14, merge=2, min_pixels=3_136, max_pixels=200_704, seq_len=1024,
        # quick: a step held 100 to 130 photos (256 placeholders each at most), so
        # 240 give the two steps the sustained window needs; 120 could give one
        images=2000, quick_images=240, make="photo",
    ),
}  # fmt: skip

RECIPE = """\
# Written by benchmarks/bench_images.py.
[recipe]
name = "bench-images"
seed = 5
lanes = {lanes}

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
patch_size = {patch_size}
merge = {merge}
min_pixels = {min_pixels}
max_pixels = {max_pixels}

[[source]]
name = "captions"
path = "shards/*.tar"
format = "webdataset"
"""


def build_corpus(folder: Path, corpus: Corpus, images: int) -> Path:
    """Shards of `images` captioned images and the recipe over them (kept if present)."""
    recipe = folder / "recipe.toml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(RECIPE.format(lanes=LANES, **asdict(corpus)))
    sizes = "x".join(f"{w}-{h}" for w, h in corpus.sizes)
    marker = folder / f"DONE-{corpus.make}-{images}-{sizes}"
    if marker.is_file():
        return recipe
    shards = folder / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    for old in [*shards.glob("*.tar"), *folder.glob("DONE-*")]:
        old.unlink()
    rng = np.random.default_rng(SEED)
    make = getattr(sample_images, corpus.make)
    for s, first in enumerate(range(0, images, PER_SHARD)):
        n = min(PER_SHARD, images - first)
        path = shards / f"part-{s:05d}.tar"
        sample_images.write_shard(path, rng, first, n, "img-", corpus.sizes, make)
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


def decode_pids() -> list[int]:
    """This process's live image decode processes (zephon/images/decode_processes.py)."""
    pids = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"zephon.images.decode_processes" in f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def children_usage() -> tuple[float, int]:
    """(CPU seconds, summed peak RSS bytes) of the decode processes."""
    cpu, peak = 0.0, 0
    for pid in decode_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            with open(f"/proc/{pid}/status") as f:
                hwm = next(line for line in f if line.startswith("VmHWM:"))
            peak += int(hwm.split()[1]) * 1024
        except (OSError, StopIteration):  # ended meanwhile
            continue
    return cpu, peak


# -- (a) the pipeline, in a child process ---------------------------------------


def pipeline_child(
    recipe: Path, seq_len: int, workers: int, budget: int, images_wanted: int, profile: bool
) -> dict[str, Any]:
    """The loader from construction until it delivered `images_wanted` images; this
    process does nothing else. `profile`: with the stage profile (its snapshot kept)."""
    import torch  # noqa: F401  (the batches are torch tensors: a trainer has it loaded)

    from torchtitan.components.garbage_collection import ScheduledCollection
    from torchtitan.config.job_config import Training
    from zephon import ZephonLoader

    before = rss_bytes()
    # Python's garbage collection as the trainer runs it ([training] gc_every_steps)
    collections = ScheduledCollection(Training().gc_every_steps)
    cpu0, t0 = time.process_time(), time.perf_counter()
    loader = ZephonLoader(
        recipe, TOKENIZER, seq_len, GLOBAL_BATCH, num_workers=workers, prefetch=2,
        lookahead_bytes=budget, profile=profile,
    )  # fmt: skip
    images = tokens = steps = 0
    step_s: list[float] = []  # when each step was delivered, from construction
    step_images: list[int] = []  # images delivered by then
    try:
        while images < images_wanted:
            batch = loader.next_batch()
            steps += 1
            collections.after_step(steps)
            if batch.images is not None:
                images += batch.images.num_images
            tokens += int(batch.source_tokens.sum())  # padding excluded
            step_s.append(time.perf_counter() - t0)
            step_images.append(images)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        # the decode processes (2 workers or more) work for this loader only here
        decode_cpu, decode_peak = children_usage()
        stats = loader.stats()
        work = stats["work"]
    finally:
        loader.close()
        collections.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "images": images, "tokens": tokens, "steps": steps, "wall_s": wall,
        "cpu_s": cpu + decode_cpu, "decode_processes_cpu_s": decode_cpu,
        "decode_processes_rss_peak": decode_peak,
        "first_batch_s": step_s[0], "step_s": step_s, "step_images": step_images,
        "rss_before": before, "rss_peak": peak,
        "rss_growth": peak - before, "images_decoded": work.get("images_decoded", 0),
        "images_framed": work.get("images_framed", 0),
        "digests_read": False,  # the image lanes' pixels are hashed only when read
        "lookahead_peak_bytes": work.get("lookahead_peak_bytes", 0),
        "lookahead_bytes_budget": work.get("lookahead_bytes_budget", budget),
        **({"profile": stats["profile"]} if profile else {}),
    }  # fmt: skip


def run_pipeline(
    recipe: Path, seq_len: int, workers: int, budget: int, images: int, profile: bool = False
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(recipe), "--workers", str(workers)]
    cmd += ["--child-seq-len", str(seq_len)] + (["--child-profile"] if profile else [])
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
    from zephon.images import image_digest, prepare_image, size_image

    def one(item: tuple[str, bytes]) -> int:
        name, data = item
        plan = size_image(data, name, spec, keep_open=True)
        out = prepare_image(data, name, spec, plan)  # the plan's opened image, as the workers
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
        from zephon.images import prepare_image

        if self.tok is None:  # one tokenizer per worker process
            from tokenizers import Tokenizer

            self.tok = Tokenizer.from_file(str(TOKENIZER))
        ext = next(e for e in IMAGE_EXTS if e in sample)
        out = prepare_image(sample[ext], sample["__key__"], self.spec)
        ids = self.tok.encode(sample["txt"].decode("utf-8"), add_special_tokens=False).ids
        return out.num_tokens, out.patches, ids


def conventional(shards: list[Path], spec: Any, workers: int, seq_len: int) -> dict[str, Any]:
    """webdataset + DataLoader worker processes + a greedy per-rank packer."""
    import torch
    import webdataset as wds

    urls = [str(s) for s in shards]
    data = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(_Prepare(spec))
    loader = torch.utils.data.DataLoader(
        data, batch_size=None, num_workers=workers, prefetch_factor=4 if workers else None
    )
    row = seq_len + 1
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


# What a round's pipeline rates are divided by: the plain loop (b) and the plain
# loop with the pixel hash (h), each the mean of the runs before and after the
# pipeline; webdataset + DataLoader (c).
REFERENCES = ("plain", "hashed", "conventional")


def reference_rate(r: dict[str, Any], ref: str) -> float:
    if ref == "conventional":
        return rate(r["conventional"], "images")
    return (rate(r[f"{ref}_before"], "images") + rate(r[f"{ref}_after"], "images")) / 2


def cores_busy(r: dict[str, Any]) -> float:
    """A run's process CPU seconds (every thread of the process) per wall second."""
    return r["cpu_s"] / r["wall_s"] if r["wall_s"] > 0 else 0.0


def file_sizes(images: list[tuple[str, bytes]]) -> dict[str, float]:
    """Mean, smallest and largest encoded image, in bytes."""
    sizes = [len(d) for _, d in images]
    return {"mean": statistics.fmean(sizes), "min": min(sizes), "max": max(sizes)}


STEADY_FROM = 0.2  # the sustained window starts once this share of the images is delivered


def sustained(a: dict[str, Any]) -> dict[str, float]:
    """Images/s of a pipeline run over its steady window (see the module notes)."""
    times, counts = a["step_s"], a["step_images"]
    if len(times) < 2:
        raise SystemExit(
            f"bench_images: the pipeline delivered {len(times)} step(s); the sustained "
            "window needs two at least: a larger corpus (--images) or more --epochs"
        )
    k = next(i for i, n in enumerate(counts) if n >= STEADY_FROM * counts[-1])
    k = min(k, len(times) - 2)
    return {
        "from_step": k + 1,
        "images": counts[-1] - counts[k],
        "seconds": times[-1] - times[k],
        "images_s": (counts[-1] - counts[k]) / (times[-1] - times[k]),
    }


def run_corpus(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Rounds of (b), (a), (b), the other baselines and (c) over one corpus, and
    the tight-budget run."""
    corpus = CORPORA[name]
    count = args.images or (corpus.quick_images if args.quick else corpus.images)
    wanted = count * args.epochs
    folder = Path(args.work) / name
    recipe = build_corpus(folder, corpus, count)
    shards = sorted((folder / "shards").glob("*.tar"))
    spec = image_spec(recipe)
    images = read_images(shards)
    encoded = file_sizes(images)
    print(
        f"corpus {name}: {len(images):,} images, {encoded['mean'] / 1e3:.1f} KB a file "
        f"(mean; {encoded['min'] / 1e3:.1f} to {encoded['max'] / 1e3:.1f} KB)",
        flush=True,
    )
    budget = 512 << 20
    tight = args.tight_budget_mib << 20
    rounds: list[dict[str, Any]] = []
    raw_images(images[:50], spec, args.workers, True)  # warm imports and caches
    n = args.workers
    for _ in range(args.rounds):
        r: dict[str, Any] = {
            "plain_before": raw_images(images, spec, n, False),
            "hashed_before": raw_images(images, spec, n, True),
        }
        r["pipeline"] = run_pipeline(recipe, corpus.seq_len, n, budget, wanted)
        r["hashed_after"] = raw_images(images, spec, n, True)
        r["plain_after"] = raw_images(images, spec, n, False)
        r["plain_1_thread"] = raw_images(images, spec, 1, False)
        r["conventional"] = conventional(shards, spec, n, corpus.seq_len)
        r["sustained"] = sustained(r["pipeline"])
        a, a_sustained = rate(r["pipeline"], "images"), r["sustained"]["images_s"]
        r["ratios"] = {}
        for ref in REFERENCES:
            base = reference_rate(r, ref)
            r["ratios"][ref] = a / base
            r["ratios"][f"{ref}_sustained"] = a_sustained / base
        rounds.append(r)
    tight_run = run_pipeline(recipe, corpus.seq_len, args.workers, tight, count)
    profiled = run_pipeline(recipe, corpus.seq_len, args.workers, budget, wanted, profile=True)

    def med(kind: str, key: str) -> float:
        return statistics.median(rate(r[kind], key) for r in rounds)

    def med_of(values: Any) -> float:
        return statistics.median(list(values))

    def bracket(kind: str) -> list[dict[str, Any]]:
        return [r[f"{kind}_{when}"] for r in rounds for when in ("before", "after")]

    summary = {
        "pipeline_images_s": med("pipeline", "images"),
        "pipeline_sustained_images_s": med_of(r["sustained"]["images_s"] for r in rounds),
        "pipeline_first_batch_s": med_of(r["pipeline"]["first_batch_s"] for r in rounds),
        "pipeline_tokens_s": med("pipeline", "tokens"),
        "plain_images_s": med_of(rate(x, "images") for x in bracket("plain")),
        "hashed_images_s": med_of(rate(x, "images") for x in bracket("hashed")),
        "plain_1_thread_images_s": med("plain_1_thread", "images"),
        "conventional_images_s": med("conventional", "images"),
        "conventional_tokens_s": med("conventional", "tokens"),
        # per reference: the median over rounds, and every round's
        "ratios": {k: med_of(r["ratios"][k] for r in rounds) for k in rounds[0]["ratios"]},
        "ratio_rounds": {k: [r["ratios"][k] for r in rounds] for k in rounds[0]["ratios"]},
        # the hash's share of the plain loop and the hash: 1 - (h) / (b), per round
        "digest_share": med_of(
            1 - reference_rate(r, "hashed") / reference_rate(r, "plain") for r in rounds
        ),
        # process CPU (all threads) over wall: the cores each kept busy
        "pipeline_cores_busy": med_of(cores_busy(r["pipeline"]) for r in rounds),
        "plain_cores_busy": med_of(cores_busy(x) for x in bracket("plain")),
    }
    cpu_per_image = {
        "pipeline": per_image(profiled["profile"], profiled["images"]),
        "plain_us": med_of(1e6 * x["cpu_s"] / x["images"] for x in bracket("plain")),
        "hashed_us": med_of(1e6 * x["cpu_s"] / x["images"] for x in bracket("hashed")),
        "plain_1_thread_us": med_of(
            1e6 * r["plain_1_thread"]["cpu_s"] / r["plain_1_thread"]["images"] for r in rounds
        ),
    }
    memory = {
        "default": {k: rounds[-1]["pipeline"][k] for k in MEMORY_KEYS},
        "tight": {k: tight_run[k] for k in MEMORY_KEYS},
    }
    return {
        "config": {
            "what": corpus.what,
            "images": count,
            "epochs": args.epochs,
            "shards": len(shards),
            "workers": args.workers,
            "rounds": args.rounds,
            "seq_len": corpus.seq_len,
            "global_batch": GLOBAL_BATCH,
            "lanes": LANES,
            "corpus_bytes": sum(len(d) for _, d in images),
            "encoded_bytes": encoded,
            "decoded_pixels": int(sum(int(np.prod(p)) for p in _sizes(images, spec))),
            "image_settings": corpus.settings,
        },
        "summary": summary,
        "cpu_per_image": cpu_per_image,
        "profiled_run": {k: v for k, v in profiled.items() if k not in ("step_s", "step_images")},
        "memory": memory,
        "rounds": rounds,
    }


# What a profiled run's thread CPU per delivered image is spent on (µs): the image
# work its workers do (the same calls as (b)), and the pipeline's own.
IMAGE_WORK = ("header plans", "decoding")
OWN = ("tar reads", "captions", "framing", "plan", "pack", "assemble", "other")


def per_image(profile: dict[str, Any], images: int) -> dict[str, float]:
    """µs of thread CPU per delivered image, by what it was spent on (stage_profile)."""
    threads, cpu = profile["threads"], profile["cpu_ns"]

    def image_on(prefix: str) -> int:
        return sum(t.get("image", 0) for name, t in threads.items() if name.startswith(prefix))

    parts = {
        "header plans": image_on("plan"),  # read time, on the planning thread
        "decoding": image_on("zephon-decode"),  # decode, resize, patches, pixel hash
        "tar reads": cpu["read"] + cpu["parse"],
        "captions": cpu["tokenize"] + cpu["convert"],  # the tokenizer, its native pool too
        "framing": image_on("tokenize"),  # documents with images as id arrays
        "plan": cpu["plan"],
        "pack": cpu["pack"],
        "assemble": cpu["assemble"],
    }
    parts["other"] = profile["total_cpu_ns"] - sum(parts.values())  # hand-offs, waits
    out = {k: v / images / 1e3 for k, v in parts.items()}
    out["image work"] = sum(out[k] for k in IMAGE_WORK)
    out["own"] = sum(out[k] for k in OWN)
    return out


def _sizes(images: list[tuple[str, bytes]], spec: Any) -> list[tuple[int, int]]:
    """Stored (width, height) of each image, from its header."""
    from zephon.images import size_image

    return [size_image(data, name, spec).header.stored_size for name, data in images]


def run(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "title": "Image pipeline: Zephon against a plain decode loop and webdataset + DataLoader",
        "quick": args.quick,
        "corpora": {name: run_corpus(name, args) for name in args.corpora},
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


def corpus_table(name: str, r: dict[str, Any]) -> str:
    s, c = r["summary"], r["config"]
    n = c["workers"]
    return (
        f"| {name}: {c['images']:,} images, {n} workers | images/s | tokens/s |\n"
        "|---|---|---|\n"
        f"| (a) Zephon pipeline, start to end ({c['epochs']} epoch{'s' * (c['epochs'] > 1)}, "
        f"first batch "
        f"{s['pipeline_first_batch_s']:.1f} s) | {s['pipeline_images_s']:.0f} | "
        f"{s['pipeline_tokens_s']:,.0f} |\n"
        f"| (a') the same, sustained (after the first fifth) "
        f"| {s['pipeline_sustained_images_s']:.0f} | |\n"
        f"| (b) plain loop: decode + resize + patchify, {n} threads "
        f"| {s['plain_images_s']:.0f} | |\n"
        f"| (b') the same, 1 thread | {s['plain_1_thread_images_s']:.0f} | |\n"
        f"| (h) the plain loop and the batch digest's pixel hash, {n} threads "
        f"| {s['hashed_images_s']:.0f} | |\n"
        f"| (c) webdataset + DataLoader ({n} processes) + greedy packing | "
        f"{s['conventional_images_s']:.0f} | {s['conventional_tokens_s']:,.0f} |\n"
        + "".join(
            f"| ratio a/{ref} (a'/{ref}), median of rounds | {s['ratios'][key]:.2f} "
            f"({s['ratios'][key + '_sustained']:.2f}) | |\n"
            for ref, key in (("b", "plain"), ("h", "hashed"), ("c", "conventional"))
        )
    )


def decoded(run: dict[str, Any]) -> str:
    """How many images the run decoded. A run before `images_framed` was counted
    apart counted, as `images_decoded`, the images of the documents framed: since
    2026-12-07 a document is framed before its pixels come."""
    if "images_framed" in run:
        return f"it decoded {run['images_decoded']:,} images"
    return f"its lanes were given documents holding {run['images_decoded']:,} images"


def cpu_table(r: dict[str, Any], cpus: int) -> str:
    """Thread CPU per delivered image of the profiled run, against the plain loop's."""
    c, run = r["cpu_per_image"], r["profiled_run"]
    p = c["pipeline"]

    def cores(part: str) -> float:  # µs per delivered image -> CPU s per wall s
        return p[part] * run["images"] / run["wall_s"] / 1e6

    head = [*IMAGE_WORK, "**image work**", *OWN, "**own**"]
    cells = [f"{p[k]:.0f}" for k in IMAGE_WORK] + [f"**{p['image work']:.0f}**"]
    cells += [f"{p[k]:.0f}" for k in OWN] + [f"**{p['own']:.0f}**"]
    return (
        f"CPU per delivered image (µs of thread CPU; one more run of (a), profiled: "
        f"`ZephonLoader(profile=True)`; {decoded(run)} to deliver "
        f"{run['images']:,}): the image work its workers do (header plans when "
        f"read; decode, resize, patches{'' if 'digests_read' in run else ' and pixel hash'} in the decode processes) and the pipeline's own "
        "(tar member reads, the captions' tokenizer calls, framing documents as id arrays, "
        "the planner, packing, assembling batches, the rest: hand-offs and loops). The plain "
        f"loop (b) spends {c['plain_us']:.0f} µs of CPU per image in "
        f"{r['config']['workers']} threads, {c['plain_1_thread_us']:.0f} in one; with the "
        f"hash (h), {c['hashed_us']:.0f}.\n\n"
        "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n"
        "| " + " | ".join(cells) + " |\n\n"
        f"Cores kept busy in that run (CPU s per wall s, {run['wall_s']:.1f} s): "
        + ", ".join(f"{k} {cores(k):.2f}" for k in ("decoding", "header plans", "own"))
        + f", of {cpus} CPUs."
    )


def table(doc: dict[str, Any]) -> str:
    """The figures QUOTED_IN quotes: one table per corpus."""
    return "\n".join(corpus_table(name, r) for name, r in doc["corpora"].items())


def hash_share(r: dict[str, Any]) -> str:
    """The pixel hash's share of the plain loop with it, or that it is within the
    noise: smaller than the spread of the plain loop's rates (both brackets of every
    round)."""
    share = r["summary"]["digest_share"]
    rates = [rate(x[k], "images") for x in r["rounds"] for k in ("plain_before", "plain_after")]
    spread = (max(rates) - min(rates)) / statistics.median(rates)
    if share < spread:
        return (
            f"within this run's noise ({100 * share:.1f}% of (h), while the plain loop's "
            f"rates spread by {100 * spread:.0f}%)"
        )
    return f"{100 * share:.1f}% of (h)"


def page(doc: dict[str, Any]) -> str:
    rounds = {r["config"]["rounds"] for r in doc["corpora"].values()}
    where = (
        "measured on a busy shared 2-core machine (other jobs running); rerun on a quiet one"
        if doc["machine"]["busy_2_core"]
        else f"measured on {doc['machine']['cpus']} CPUs"
    )
    lines = [
        f"# {doc['title']}",
        "",
        f"Generated by `benchmarks/bench_images.py` from `bench_images.json`; {where}. "
        f"Medians of {'/'.join(map(str, sorted(rounds)))} round(s).",
        "",
    ]
    for name, r in doc["corpora"].items():
        s, m, c = r["summary"], r["memory"], r["config"]
        e = c["encoded_bytes"]
        files = (
            f"; files of {e['mean'] / 1e3:,.1f} KB on average, {e['min'] / 1e3:,.1f} to "
            f"{e['max'] / 1e3:,.1f} KB"
        )
        lines += [
            f"## {name}: {c['what']}",
            "",
            f"{c['images']:,} images in {c['shards']} shards ({_mib(c['corpus_bytes'])} "
            f"encoded, {c['decoded_pixels'] / c['images'] / 1e3:,.0f} k pixels an image "
            f"decoded{files}), {c['image_settings']}.",
            "",
            corpus_table(name, r),
            *(
                f"- Ratios a/{ref} by round (a'/{ref}): "
                + ", ".join(
                    f"{x:.2f} ({y:.2f})"
                    for x, y in zip(
                        s["ratio_rounds"][key], s["ratio_rounds"][f"{key}_sustained"], strict=True
                    )
                )
                + "."
                for ref, key in (("b", "plain"), ("h", "hashed"), ("c", "conventional"))
            ),
            (
                "- The pixel hash of the batch digest: not paid by (a), which reads no digest "
                f"(the default trainer reads none); when read, {hash_share(r)}."
                if "digests_read" in r["profiled_run"]
                else "- The pixel hash of the batch digest is paid by the decode process that "
                f"decoded the image: {hash_share(r)}."
            ),
            f"- Against one plain thread, a/b' = "
            f"{s['pipeline_images_s'] / s['plain_1_thread_images_s']:.2f}.",
            f"- Cores kept busy (process CPU s / wall s, every thread): the pipeline "
            f"{s['pipeline_cores_busy']:.2f} (its child process and its decode processes, "
            f"construction to the last step), the plain loop (b) {s['plain_cores_busy']:.2f}, "
            f"of {doc['machine']['cpus']} CPUs.",
            "",
            cpu_table(r, doc["machine"]["cpus"]),
            "",
            "| lookahead budget | accounted peak | RSS before | RSS peak | RSS growth |",
            "|---|---|---|---|---|",
        ]
        for budget in ("default", "tight"):
            b = m[budget]
            lines.append(
                f"| {_mib(b['lookahead_bytes_budget'])} ({budget}) | "
                f"{_mib(b['lookahead_peak_bytes'])} | {_mib(b['rss_before'])} | "
                f"{_mib(b['rss_peak'])} | {_mib(b['rss_growth'])} |"
            )
        lines.append("")
    lines += [
        "The accounted peak is the loader's own count (`lookahead_peak_bytes`): the "
        "patches of every document queued, decoded or waiting for its lane, and the "
        "largest decode peaks of the queued documents, as many as decode at once, from "
        "the headers (Pillow's working copies included). The rows of the step being "
        "produced are never held back, so a budget below one step's documents (the "
        "tight one) cannot lower it. RSS is the child process's (`ru_maxrss`), before: "
        "after importing torch and zephon, before the loader is built; besides the "
        "lookahead it holds the packers' open bins, the prefetched batches and the "
        "batch being consumed.",
    ]
    return "\n".join(lines) + "\n"


def publish(path: Path) -> int:
    doc = json.loads(path.read_text())
    path.with_suffix(".md").write_text(page(doc))
    if path.resolve() == RESULTS.resolve():
        quote_in_page(QUOTED_IN, "bench_images", table(doc))
    print(page(doc), end="")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small corpora, one round (seconds)")
    ap.add_argument("--corpora", default=",".join(CORPORA), help="which of: " + ", ".join(CORPORA))
    ap.add_argument("--images", type=int, default=None, help="corpus size (default: per corpus)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="default 3, 1 with --quick")
    ap.add_argument("--epochs", type=int, default=None, help="pipeline window in corpus passes "
                    "(default 2, 1 with --quick)")  # fmt: skip
    ap.add_argument("--tight-budget-mib", type=int, default=4)
    ap.add_argument("--work", default=str(REPO / "outputs" / "bench_images"))
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--busy", action="store_true", help="say in the page: a busy 2-core machine")
    ap.add_argument("--render", metavar="JSON", help="only regenerate the page from a JSON")
    ap.add_argument("--child", metavar="RECIPE", help=argparse.SUPPRESS)
    ap.add_argument("--child-budget", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-seq-len", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.corpora = [c for c in args.corpora.split(",") if c]
    unknown = [c for c in args.corpora if c not in CORPORA]
    if unknown or not args.corpora:
        ap.error(f"--corpora: unknown {unknown}; expected some of {', '.join(CORPORA)}")
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.epochs is None:
        args.epochs = 1 if args.quick else 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        budget, seq_len = args.child_budget, args.child_seq_len
        result = pipeline_child(
            Path(args.child), seq_len, args.workers, budget, args.images, args.child_profile
        )
        print(json.dumps(result))
        return 0
    if args.render:
        return publish(Path(args.render))
    doc = run(args)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    publish(out)
    for name, r in doc["corpora"].items():
        s = r["summary"]["ratios"]
        print(
            f"RATIO {name} pipeline/plain = {s['plain']:.3f} sustained {s['plain_sustained']:.3f}"
            f"; /hashed {s['hashed']:.3f} ({s['hashed_sustained']:.3f})"
            f"; /conventional {s['conventional']:.3f} ({s['conventional_sustained']:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
