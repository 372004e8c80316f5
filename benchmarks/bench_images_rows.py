"""The image pipeline at the batch one rank really gets: 8 and 64 rows a step.

bench_images.py measures 32 rows a step on one rank. A rank of a large job
sees fewer (a 512-row global batch on 64 ranks is 8 a rank), and the rows a
step decide how much image work each step asks for, and so how far ahead the
pipeline must work to keep its decode processes busy. This runs one corpus of
bench_images (default: photos, photograph-like JPEGs) at each `--rows`, start
to end including construction, in rounds, against four references over the
same bytes and the same per-image work:

- the plain loop in `--workers` threads and on one thread (bench_images' b and
  b'), each round before and after the pipeline (their mean);
- a decode-only DataLoader: webdataset + `DataLoader(num_workers=--workers,
  batch_size=None)`, each sample through `prepare_image`, nothing else;
- the conventional loader with packing (bench_images' c: the same plus the
  tokenizer and a greedy packer).

It reports each ratio's median over rounds, the first batch's delay from the
start of construction, and the images of the documents the lanes held by
then (best_fit fills every lane's open bins before its first rows). Writes
docs/results/bench_images_rows.json and its page.

    .venv/bin/python benchmarks/bench_images_rows.py [--rows 8,64] [--rounds 2]
    .venv/bin/python benchmarks/bench_images_rows.py --render docs/results/bench_images_rows.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_images as bi

RESULTS = bi.REPO / "docs" / "results" / "bench_images_rows.json"
# The documentation page whose `<!-- bench_images_rows:begin/end -->` markers quote the table.
QUOTED_IN = "docs/results.md"
REFERENCES = {
    "plain": "2-thread loop",
    "plain_1_thread": "1 thread",
    "decode_only": "webdataset + DataLoader, decode only",
    "conventional": "webdataset + DataLoader, with packing",
}


def decode_only(shards: list[Path], spec: Any, workers: int) -> dict[str, Any]:
    """webdataset + DataLoader worker processes, each sample decoded, resized and cut
    into patches (`prepare_image`); no tokenizer, no packing."""
    import torch
    import webdataset as wds

    from zephon.images import prepare_image

    def prepare(sample: dict[str, Any]) -> int:
        ext = next(e for e in bi.IMAGE_EXTS if e in sample)
        return prepare_image(sample[ext], sample["__key__"], spec).num_tokens

    data = wds.WebDataset([str(s) for s in shards], shardshuffle=False, empty_check=False)
    loader = torch.utils.data.DataLoader(
        data.map(prepare), batch_size=None, num_workers=workers,
        prefetch_factor=4 if workers else None,
    )  # fmt: skip
    t0 = time.perf_counter()
    images = sum(1 for _ in loader)
    return {"images": images, "wall_s": time.perf_counter() - t0}


def pipeline(recipe: Path, seq_len: int, rows: int, workers: int, images: int) -> dict[str, Any]:
    """bench_images' pipeline child at `rows` rows a step, in a process of its own."""
    cmd = [sys.executable, __file__, "--child", str(recipe), "--child-seq-len", str(seq_len)]
    cmd += ["--rows", str(rows), "--workers", str(workers), "--images", str(images)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=bi.REPO, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"pipeline child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child(args: argparse.Namespace) -> None:
    bi.GLOBAL_BATCH = int(args.rows)  # the loader's global batch: one rank, these rows
    out = bi.pipeline_child(
        Path(args.child), args.child_seq_len, args.workers, 512 << 20, args.images, False
    )
    out["first_batch_images"] = out["step_images"][0]
    # counted after the timed run, in a loader of its own: the count, not its time
    out["lane_images_at_first_batch"] = _first_batch_images(
        Path(args.child), args.child_seq_len, int(args.rows), args.workers
    )
    print(json.dumps({k: v for k, v in out.items() if k not in ("step_s", "step_images")}))


def _first_batch_images(recipe: Path, seq_len: int, rows: int, workers: int) -> int:
    """Images of the documents the lanes held when the first batch was delivered (a
    loader of its own; `images_framed`: counted when a document is framed, before
    its pixels come)."""
    from zephon import ZephonLoader

    loader = ZephonLoader(recipe, bi.TOKENIZER, seq_len, rows, num_workers=workers, prefetch=2)
    try:
        loader.next_batch()
        return int(loader.stats()["work"]["images_framed"])
    finally:
        loader.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = bi.CORPORA[args.corpus]
    count = args.images or corpus.images
    folder = Path(args.work) / args.corpus
    recipe = bi.build_corpus(folder, corpus, count)
    shards = sorted((folder / "shards").glob("*.tar"))
    spec = bi.image_spec(recipe)
    images = bi.read_images(shards)
    bi.raw_images(images[:50], spec, args.workers, True)  # warm imports and caches
    by_rows = {}
    for rows in args.rows:
        rounds = []
        for _ in range(args.rounds):
            r: dict[str, Any] = {"plain_before": bi.raw_images(images, spec, args.workers, False)}
            r["pipeline"] = pipeline(
                recipe, corpus.seq_len, rows, args.workers, count * args.epochs
            )
            r["plain_after"] = bi.raw_images(images, spec, args.workers, False)
            r["plain_1_thread"] = bi.raw_images(images, spec, 1, False)
            r["decode_only"] = decode_only(shards, spec, args.workers)
            r["conventional"] = bi.conventional(shards, spec, args.workers, corpus.seq_len)
            rounds.append(r)
            print(f"rows {rows}: {ratios(r)}", flush=True)
        by_rows[str(rows)] = rounds
    return {
        "command": "benchmarks/bench_images_rows.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
        "corpus": args.corpus,
        "what": corpus.what,
        "settings": corpus.settings,
        "images": count,
        "epochs": args.epochs,
        "workers": args.workers,
        "rounds": by_rows,
    }


def ratios(r: dict[str, Any]) -> dict[str, float]:
    """The pipeline's images/s over each reference's, in one round."""
    a = bi.rate(r["pipeline"], "images")
    plain = (bi.rate(r["plain_before"], "images") + bi.rate(r["plain_after"], "images")) / 2
    return {
        "plain": round(a / plain, 3),
        **{k: round(a / bi.rate(r[k], "images"), 3) for k in REFERENCES if k != "plain"},
    }


def first_batch_floor(r: dict[str, Any]) -> float:
    """Seconds the plain loop takes, at its mean rate in the round, to decode as many
    images as the first batch holds: what no loader on these cores can beat without
    decoding less, before starting its processes and reading its documents."""
    plain = (bi.rate(r["plain_before"], "images") + bi.rate(r["plain_after"], "images")) / 2
    return r["pipeline"]["first_batch_images"] / plain


def has_floors(doc: dict[str, Any]) -> bool:
    """The run counted its first batch's images (runs before it did not)."""
    return all("first_batch_images" in r["pipeline"] for v in doc["rounds"].values() for r in v)


def table(doc: dict[str, Any]) -> str:
    head = ["rows a step", *(f"pipeline / {v}" for v in REFERENCES.values())]
    floors = has_floors(doc)
    head += ["first batch (s)", *(["the loop's time for its images (s)"] if floors else [])]
    head += ["images in the lanes by then", "pipeline images/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rows, rounds in doc["rounds"].items():
        each = [ratios(r) for r in rounds]
        cells = [rows]
        for key in REFERENCES:
            values = [x[key] for x in each]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        first = [r["pipeline"]["first_batch_s"] for r in rounds]
        cells.append(f"{statistics.median(first):.1f} ({min(first):.1f}-{max(first):.1f})")
        if floors:
            floor = [first_batch_floor(r) for r in rounds]
            cells.append(f"{statistics.median(floor):.1f} ({min(floor):.1f}-{max(floor):.1f})")
        cells.append(
            str(int(statistics.median(r["pipeline"]["lane_images_at_first_batch"] for r in rounds)))
        )
        cells.append(f"{statistics.median(bi.rate(r['pipeline'], 'images') for r in rounds):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def page(doc: dict[str, Any]) -> str:
    n = len(next(iter(doc["rounds"].values())))
    return (
        "# Images at the rows a rank gets\n\n"
        f"Written by `{doc['command'].strip()}` on {doc['machine']}, from "
        "`bench_images_rows.json` beside this page.\n\n"
        f"Corpus: {doc['images']:,} {doc['what']} ({doc['settings']}), read {doc['epochs']} "
        f"times; `[execution] workers = {doc['workers']}`. Each cell: the median over "
        f"{n} rounds (smallest-largest), start to end including the loader's construction; "
        "the plain loop is the mean of its runs right before and after the pipeline.\n\n"
        + table(doc)
        + "\nFirst batch: seconds from the start of construction. Images in the lanes: "
        "those of the documents the lanes' packers held when it came (best_fit keeps 8 "
        "bins open a lane before its first rows); a document reaches its lane framed "
        "from its images' headers, and the first batch waits for its own images "
        "only (images/work.py).\n" + (FLOOR_NOTE if has_floors(doc) else "")
    )


FLOOR_NOTE = (
    "\nThe loop's time for its images: as many images as the first batch holds, at "
    "the plain loop's mean rate in the same round, the decoding no loader on these "
    "cores can skip before its first batch (with the exact decode). The rest of "
    "the first batch's time is the decode processes' start (a Python with numpy "
    "and Pillow each, begun as construction begins) and the reading that finds "
    "the batch's documents, which overlap.\n"
)


def publish(path: Path) -> int:
    doc = json.loads(path.read_text())
    path.with_suffix(".md").write_text(page(doc))
    if path.resolve() == RESULTS.resolve():  # the committed results: quoted in the docs too
        bi.quote_in_page(QUOTED_IN, "bench_images_rows", table(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="8,64", help="rows a step, comma-separated")
    p.add_argument("--corpus", default="photos", choices=list(bi.CORPORA))
    p.add_argument("--images", type=int, default=None, help="corpus size (default: its own)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work", default=str(bi.REPO / "outputs" / "bench_images"))
    p.add_argument("--json", default=str(RESULTS))
    p.add_argument("--render", metavar="JSON", help="only regenerate the page from a JSON")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-seq-len", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.render:
        return publish(Path(args.render))
    if args.child:
        child(args)
        return 0
    args.rows = [int(x) for x in args.rows.split(",")]
    doc = run(args)
    path = Path(args.json)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return publish(path)


if __name__ == "__main__":
    sys.exit(main())
