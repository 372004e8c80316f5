"""Sustained throughput: the Zephon pipeline against raw tokenization of the same documents.

For each corpus and each lane count (all lanes on one rank, the same global
batch), side by side in one process:

1. Untimed: a loader with `trace=True` finds the K steps whose rows hold
   `--tokens` tokens and which documents they packed; those texts are read
   into memory.
2. Timed, alternating: raw `Tokenizer.encode_batch` over those texts (1000 per
   call, the tokenizer's own thread pool), raw `encode_batch_fast` (the same
   ids without character offsets, which the pipeline uses), then the pipeline:
   a fresh loader with the recipe's workers and prefetch and the default
   lookahead budget, delivering K steps, start-up included. Decompressed gzip
   chunks are dropped before each pipeline round, so every round starts cold.
   A raw pair closes each round; a round's ratio is raw time (mean of the pair
   before and the pair after) over pipeline time, and the median over rounds
   is reported. Windows of many steps keep lookahead honest: the loader starts
   empty inside the window, and what it tokenizes past the window's end (its
   budget and prefetched steps) is work the raw side never does.

Corpora: `sample` is the bundled two-source mix (prose JSONL, code gzip JSONL,
documents of about 210 tokens); `long` is generated: web-like JSONL with
log-normal lengths (mean about 7.6 KB) and 10% whole "source files" of 10-200
KB, one source.

    python benchmarks/bench_throughput.py            # both corpora, 1/8/64 lanes, about 30 min on 2 cores
    python benchmarks/bench_throughput.py --quick    # smoke run

Writes <out>.json (raw figures) and <out>.md; the committed results
(docs/results/bench_throughput) are also quoted in the README.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

# `python benchmarks/bench_throughput.py` puts benchmarks/ first on sys.path.
from bench_pipeline import batch_tokens, loadavg, machine_info
from bench_scale import make_corpus

from zephon import ZephonLoader, load_recipe, load_tokenizer
from zephon.recipe import Recipe
from zephon.sources import SourceReader
from zephon.sources.gzipped import clear_chunk_cache
from zephon.tokenize import TokenizerInfo

REPO = Path(__file__).resolve().parents[1]
MARKERS = ("<!-- bench_throughput:begin -->", "<!-- bench_throughput:end -->")


# -- corpora ----------------------------------------------------------------------


def web_length(rng: np.random.Generator) -> tuple[int, bool]:
    """Log-normal lengths (mean ~7.6 KB) plus 10% whole "source files" of 10-200 KB."""
    if rng.random() < 0.1:
        return int(np.exp(rng.uniform(np.log(10_000), np.log(200_000)))), True
    # sigma 1: mean exp(mu + 1/2) = 7.6 KB
    return int(np.clip(rng.lognormal(np.log(7_600) - 0.5, 1.0), 50, 200_000)), False


def corpus_recipe(name: str, args: argparse.Namespace, lanes: int) -> Recipe:
    if name == "sample":
        recipe = load_recipe(REPO / "train_configs" / "data" / "sample_mix.toml")
    else:
        work = Path(args.work).resolve()
        make_corpus(work / "long", args.long_size_mb, seed=3, length=web_length)
        path = work / "long.toml"
        path.write_text(
            '[recipe]\nname = "long-docs"\nseed = 7\nlanes = 8\n\n'
            '[shuffle]\nblock_size = 64\n\n[packing]\nalgorithm = "concat"\nflush_interval = 32\n\n'
            f'[execution]\nworkers = 2\nprefetch = 2\ncache_dir = "{work / "cache"}"\n\n'
            f'[[source]]\nname = "web"\npath = "{work / "long" / "part-*.jsonl"}"\n'
        )
        recipe = load_recipe(path)
    return replace(recipe, lanes=lanes)


# -- one configuration ---------------------------------------------------------------


class Window:
    """The K steps of one configuration, and the texts of their documents."""

    def __init__(self, recipe: Recipe, tok: TokenizerInfo, args: argparse.Namespace):
        self.recipe, self.tok, self.args = recipe, tok, args
        with self.loader(prefetch=0, trace=True) as ld:
            self.steps = self.row_tokens = 0
            while self.row_tokens < args.tokens:
                self.row_tokens += batch_tokens(ld.next_batch())
                self.steps += 1
            assert ld.traces is not None
            picked = [d for lane in ld.traces.values() for d in lane]
        readers = [SourceReader(s, None) for s in recipe.sources]
        texts: dict[int, dict[int, str]] = {}
        for s in sorted({s for s, _ in picked}):
            wanted = sorted({d for k, d in picked if k == s})
            texts[s] = dict(zip(wanted, readers[s].read_docs(wanted), strict=True))
        self.texts = [texts[s][d] for s, d in picked]
        self.tokens = 0

    def loader(self, **kw: Any) -> ZephonLoader:
        a = self.args
        return ZephonLoader(self.recipe, self.tok, a.seq_len, a.global_batch, **kw)

    def raw(self, fast: bool) -> float:
        t = self.tok.tokenizer
        encode = t.encode_batch_fast if fast else t.encode_batch
        n, texts = 0, self.texts
        t0 = time.perf_counter()
        for i in range(0, len(texts), 1000):
            n += sum(len(e) for e in encode(texts[i : i + 1000], add_special_tokens=False))
        dt = time.perf_counter() - t0
        self.tokens = n
        return dt

    def pipeline(self) -> dict[str, Any]:
        clear_chunk_cache()
        ld = self.loader()
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            row_tokens = batch_tokens(ld.next_batch())
            first = time.perf_counter() - t0
            for _ in range(self.steps - 1):
                row_tokens += batch_tokens(ld.next_batch())
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            stats = ld.stats()
        finally:
            ld.close()
        if row_tokens != self.row_tokens:
            raise RuntimeError(f"pipeline delivered {row_tokens} tokens, not {self.row_tokens}")
        return {
            "wall_s": wall,
            "cpu_s": cpu,
            "first_batch_s": first,
            "tokens_tokenized": stats["tokens_tokenized"],
            "tokens_from_cache": stats["work"]["tokens_from_cache"],
        }


def measure(recipe: Recipe, tok: TokenizerInfo, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    w = Window(recipe, tok, args)
    prep = time.perf_counter() - t0
    raw, fast, pipe = [w.raw(False)], [w.raw(True)], []
    for r in range(args.rounds):
        pipe.append(w.pipeline())
        raw.append(w.raw(False))
        fast.append(w.raw(True))
        p = pipe[-1]["wall_s"]
        print(
            f"  round {r + 1}/{args.rounds}: raw {raw[-2]:.2f}/{raw[-1]:.2f}s  fast "
            f"{fast[-2]:.2f}/{fast[-1]:.2f}s  pipeline {p:.2f}s (first batch "
            f"{pipe[-1]['first_batch_s']:.2f}s)  ratio {(raw[-2] + raw[-1]) / 2 / p:.3f}  "
            f"load {loadavg()}",
            flush=True,
        )

    def ratios(base: list[float]) -> list[float]:
        return [(base[i] + base[i + 1]) / 2 / p["wall_s"] for i, p in enumerate(pipe)]

    med = statistics.median
    return {
        "steps": w.steps,
        "documents": len(w.texts),
        "raw_tokens": w.tokens,
        "row_tokens": w.row_tokens,
        "prepare_s": prep,
        "raw_s": raw,
        "raw_fast_s": fast,
        "pipeline": pipe,
        "ratios": ratios(raw),
        "ratio": med(ratios(raw)),
        "ratios_fast": ratios(fast),
        "ratio_fast": med(ratios(fast)),
        "raw_tok_s": w.tokens / med(raw),
        "raw_fast_tok_s": w.tokens / med(fast),
        "pipeline_tok_s": w.tokens / med(p["wall_s"] for p in pipe),
        "first_batch_s": med(p["first_batch_s"] for p in pipe),
        "pipeline_cpu_s": med(p["cpu_s"] for p in pipe),
        "tokens_tokenized": med(p["tokens_tokenized"] for p in pipe),
        "tokens_from_cache": max(p["tokens_from_cache"] for p in pipe),
    }


# -- output ----------------------------------------------------------------------


def render(r: dict[str, Any]) -> str:
    c = r["config"]
    lines = [
        f"seq_len {c['seq_len']}, global batch {c['global_batch']} rows, all lanes on one rank, "
        f"workers 2, prefetch 2, default lookahead (two steps); windows of about "
        f"{c['tokens'] / 1e6:.0f} M tokens from a fresh loader (start-up included), "
        f"{c['rounds']} rounds, each against the mean of the raw runs before and after it. "
        f"{r['machine']['cpus_usable']} CPUs (load {r['loadavg_start']} at the start).",
        "",
        "| corpus | lanes | steps | raw encode_batch | pipeline | **ratio** (rounds) "
        "| vs encode_batch_fast | first batch | tokenized / delivered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, x in r["results"].items():
        corpus, lanes = key.split("/")
        rounds = " ".join(f"{v:.2f}" for v in x["ratios"])
        lines.append(
            f"| {corpus} | {lanes} | {x['steps']} | {x['raw_tok_s'] / 1e6:.2f} M tok/s "
            f"| {x['pipeline_tok_s'] / 1e6:.2f} M tok/s | **{x['ratio']:.2f}** ({rounds}) "
            f"| {x['ratio_fast']:.2f} | {x['first_batch_s']:.2f} s "
            f"| {x['tokens_tokenized'] / x['row_tokens']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def publish(out: Path, result: dict[str, Any]) -> None:
    text = render(result)
    out.with_suffix(".md").write_text(text)
    print(text)
    if out.resolve() == (REPO / "docs" / "results" / "bench_throughput").resolve():
        readme = REPO / "README.md"
        body = readme.read_text()
        begin, end = MARKERS
        if begin in body and end in body:
            head, rest = body.split(begin, 1)
            readme.write_text(head + begin + "\n" + text + rest[rest.index(end) :])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--corpora", nargs="+", default=["sample", "long"], choices=["sample", "long"])
    p.add_argument("--lanes", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--tokens", type=int, default=16_000_000, help="window per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--long-size-mb", type=int, default=100)
    p.add_argument("--tokenizer", default=str(REPO / "assets" / "tokenizer" / "tokenizer.json"))
    p.add_argument("--work", default=str(REPO / "outputs" / "bench_throughput"))
    p.add_argument("--out", default=str(REPO / "docs" / "results" / "bench_throughput"))
    p.add_argument("--render", action="store_true", help="only rewrite <out>.md from <out>.json")
    p.add_argument("--quick", action="store_true", help="tiny windows, for a smoke run")
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.render:
        publish(out, json.loads(out.with_suffix(".json").read_text()))
        return 0
    if a.quick:
        a.tokens, a.rounds, a.long_size_mb = 300_000, 1, 5
    tok = load_tokenizer(a.tokenizer)
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(a).items() if k not in ("work", "out", "tokenizer")},
        "machine": machine_info(),
        "loadavg_start": loadavg(),
        "results": {},
    }
    for corpus in a.corpora:
        for lanes in a.lanes:
            print(f"[{corpus}, {lanes} lanes]", flush=True)
            recipe = corpus_recipe(corpus, a, lanes)
            result["results"][f"{corpus}/{lanes}"] = measure(recipe, tok, a)
    result["loadavg_end"] = loadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    publish(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
