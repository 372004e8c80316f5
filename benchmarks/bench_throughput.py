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

Every pipeline round also records where the pipeline's own CPU goes
(`ZephonLoader(profile=True)`, zephon/stage_profile.py): thread CPU per
delivered token of each stage (read, parse, plan, tokenize with the
tokenizer's native pool, convert, pack, assemble, other), the median over
rounds, beside the CPU raw `encode_batch_fast` takes per token. Switching
stages costs a few thousand thread-clock reads per window, not per token.

Corpora:
- `sample`: the bundled two-source mix (prose JSONL, code gzip JSONL,
  documents of about 210 tokens), concat; 1, 8 and 64 lanes.
- `long`: generated web-like JSONL with log-normal lengths (mean about 7.6
  KB) and 10% whole "source files" of 10-200 KB, one source, concat; 1, 8 and
  64 lanes.
- `web`: generated web-like JSONL, log-normal lengths with a median of 3 KB,
  one source, best_fit, mixing by tokens; 8 lanes. 100 MB by default (the
  window reads about 60 MB of it; `--web-size-mb 300` for the 300 MB corpus
  of the issue, a few minutes more to generate once).
- `mix`: the bundled prose as Parquet (70% by tokens) and whole standard
  library source files as gzip JSONL (30%), concat; 8 lanes.

    python benchmarks/bench_throughput.py            # all corpora, about 40 min on 2 cores
    python benchmarks/bench_throughput.py --quick    # smoke run

Writes <out>.json (raw figures) and <out>.md; the committed results
(docs/results/bench_throughput) are also quoted in docs/results.md.
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
from bench_pipeline import batch_tokens, loadavg, machine_info, script_module
from bench_scale import make_corpus

from harness.train import quote_in_page
from zephon import (
    STAGES,
    Recipe,
    TokenizerInfo,
    ZephonLoader,
    load_recipe,
    load_tokenizer,
    per_token,
)
from zephon.sources import SourceReader, clear_chunk_cache

REPO = Path(__file__).resolve().parents[1]
# The documentation page whose `<!-- NAME:begin/end -->` markers quote this benchmark's summary.
QUOTED_IN = "docs/results.md"
RECIPE_NAMES = {"long": "long-docs"}  # as the committed figures had it
CORPUS_LANES = {"sample": [1, 8, 64], "long": [1, 8, 64], "web": [8], "mix": [8]}


# -- corpora ----------------------------------------------------------------------


def web_length(rng: np.random.Generator) -> tuple[int, bool]:
    """Log-normal lengths (mean ~7.6 KB) plus 10% whole "source files" of 10-200 KB."""
    if rng.random() < 0.1:
        return int(np.exp(rng.uniform(np.log(10_000), np.log(200_000)))), True
    # sigma 1: mean exp(mu + 1/2) = 7.6 KB
    return int(np.clip(rng.lognormal(np.log(7_600) - 0.5, 1.0), 50, 200_000)), False


def web_3kb_length(rng: np.random.Generator) -> tuple[int, bool]:
    """Log-normal lengths with a median of 3 KB (sigma 1: mean about 5 KB)."""
    return int(np.clip(rng.lognormal(np.log(3_000), 1.0), 50, 200_000)), False


def make_mix(folder: Path) -> None:
    """The bundled prose as Parquet, and every standard-library source file, whole,
    as gzip JSONL (written once; the files of scripts/tools/build_sample_data.py)."""
    import sysconfig

    sample = script_module("build_sample_data")
    Doc, stdlib_files = sample.Doc, sample.stdlib_files
    write_jsonl_gz, write_parquet = sample.write_jsonl_gz, sample.write_parquet

    if (folder / "done").exists():
        return
    (folder / "prose").mkdir(parents=True, exist_ok=True)
    (folder / "files").mkdir(parents=True, exist_ok=True)
    for k, part in enumerate(sorted((REPO / "data" / "sample" / "prose").glob("*.jsonl"))):
        lines = part.read_text(encoding="utf-8").splitlines()
        docs = [Doc(str(i), json.loads(ln)["text"]) for i, ln in enumerate(lines) if ln.strip()]
        write_parquet(folder / "prose" / f"part-{k:05d}.parquet", docs)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in stdlib_files(stdlib):
        try:
            files.append(Doc(path.relative_to(stdlib).as_posix(), path.read_text("utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    for k in range(4):
        write_jsonl_gz(folder / "files" / f"part-{k:05d}.jsonl.gz", files[k::4])
    (folder / "done").write_text(f"{len(files)} source files\n")


def corpus_recipe(name: str, args: argparse.Namespace, lanes: int) -> Recipe:
    if name == "sample":
        return replace(
            load_recipe(REPO / "train_configs" / "data" / "sample_mix.toml"), lanes=lanes
        )
    work = Path(args.work).resolve()
    execution = f'[execution]\nworkers = 2\nprefetch = 2\ncache_dir = "{work / "cache"}"\n\n'
    if name == "long":
        make_corpus(work / "long", args.long_size_mb, seed=3, length=web_length)
        body = (
            '[packing]\nalgorithm = "concat"\nflush_interval = 32\n\n'
            f'{execution}[[source]]\nname = "web"\npath = "{work / "long" / "part-*.jsonl"}"\n'
        )
    elif name == "web":
        make_corpus(work / "web", args.web_size_mb, seed=5, length=web_3kb_length)
        body = (
            '[mixture]\nunit = "tokens"\n\n[packing]\nalgorithm = "best_fit"\nflush_interval = 32\n\n'
            f'{execution}[[source]]\nname = "web"\npath = "{work / "web" / "part-*.jsonl"}"\n'
        )
    else:
        make_mix(work / "mix")
        body = (
            '[mixture]\nunit = "tokens"\n\n[packing]\nalgorithm = "concat"\nflush_interval = 32\n\n'
            f'{execution}[[source]]\nname = "prose"\nformat = "parquet"\nweight = 0.7\n'
            f'path = "{work / "mix" / "prose" / "*.parquet"}"\n\n'
            f'[[source]]\nname = "files"\nweight = 0.3\n'
            f'path = "{work / "mix" / "files" / "*.jsonl.gz"}"\n'
        )
    path = work / f"{name}.toml"
    path.write_text(
        f'[recipe]\nname = "{RECIPE_NAMES.get(name, name)}"\nseed = 7\nlanes = 8\n\n[shuffle]\nblock_size = 64\n\n{body}'
    )
    return replace(load_recipe(path), lanes=lanes)


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
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, len(texts), 1000):
            n += sum(len(e) for e in encode(texts[i : i + 1000], add_special_tokens=False))
        dt = time.perf_counter() - t0
        self.raw_cpu_s = time.process_time() - c0
        self.tokens = n
        return dt

    def pipeline(self) -> dict[str, Any]:
        clear_chunk_cache()
        ld = self.loader(profile=True)
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
        profile = stats["profile"]
        return {
            "wall_s": wall,
            "cpu_s": cpu,
            "first_batch_s": first,
            "tokens_tokenized": stats["tokens_tokenized"],
            "tokens_from_cache": stats["work"]["tokens_from_cache"],
            "profile": profile,
            "ns_per_token": per_token(profile, row_tokens),
        }


def measure(recipe: Recipe, tok: TokenizerInfo, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    w = Window(recipe, tok, args)
    prep = time.perf_counter() - t0
    raw, fast, pipe = [w.raw(False)], [w.raw(True)], []
    fast_cpu = [w.raw_cpu_s]
    for r in range(args.rounds):
        pipe.append(w.pipeline())
        raw.append(w.raw(False))
        fast.append(w.raw(True))
        fast_cpu.append(w.raw_cpu_s)
        p = pipe[-1]["wall_s"]
        print(
            f"  round {r + 1}/{args.rounds}: raw {raw[-2]:.2f}/{raw[-1]:.2f}s  fast "
            f"{fast[-2]:.2f}/{fast[-1]:.2f}s  pipeline {p:.2f}s (first batch "
            f"{pipe[-1]['first_batch_s']:.2f}s)  ratio {(raw[-2] + raw[-1]) / 2 / p:.3f}  "
            f"fast {(fast[-2] + fast[-1]) / 2 / p:.3f}  load {loadavg()}",
            flush=True,
        )
        ns = pipe[-1]["ns_per_token"]
        print("    ns/token: " + "  ".join(f"{k} {ns[k]:.0f}" for k in (*STAGES, "total")))

    def ratios(base: list[float]) -> list[float]:
        return [(base[i] + base[i + 1]) / 2 / p["wall_s"] for i, p in enumerate(pipe)]

    med = statistics.median
    stage_ns = {k: med(p["ns_per_token"][k] for p in pipe) for k in (*STAGES, "total")}
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
        # CPU per delivered token by stage (median over rounds) and of raw encode_batch_fast
        "stage_ns_per_token": stage_ns,
        "raw_fast_cpu_ns_per_token": med(fast_cpu) * 1e9 / w.tokens,
        "pipeline_cpu_ns_per_token": med(p["cpu_s"] for p in pipe) * 1e9 / w.row_tokens,
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
    profiled = {k: x for k, x in r["results"].items() if "stage_ns_per_token" in x}
    if not profiled:  # figures recorded before the profiler
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "CPU per delivered token (ns, thread CPU, median over rounds) by stage: read (I/O and "
        "decompression), parse (records to strings), plan (the need planner), tokenize (the "
        "native call with its thread pool), convert (encodings to id arrays), pack (mixing "
        "and packing), assemble (batch tensors and digests), other (the pipeline's threads "
        "between stages); raw: `encode_batch_fast` on the same documents.",
        "",
        "| corpus | lanes | " + " | ".join(STAGES[:-1]) + " | **total** | raw |",
        "|---|---|" + "---|" * (len(STAGES) + 1),
    ]
    for key, x in profiled.items():
        ns = x["stage_ns_per_token"]
        corpus, lanes = key.split("/")
        lines.append(
            f"| {corpus} | {lanes} | "
            + " | ".join(f"{ns[k]:.0f}" for k in STAGES[:-1])
            + f" | **{ns['total']:.0f}** | {x['raw_fast_cpu_ns_per_token']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def publish(out: Path, result: dict[str, Any]) -> None:
    text = render(result)
    out.with_suffix(".md").write_text(text)
    print(text)
    if out.resolve() == (REPO / "docs" / "results" / "bench_throughput").resolve():
        quote_in_page(QUOTED_IN, "bench_throughput", text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--corpora", nargs="+", default=list(CORPUS_LANES), choices=list(CORPUS_LANES))
    p.add_argument("--lanes", type=int, nargs="+", help="lane counts of every corpus")
    p.add_argument("--tokens", type=int, default=16_000_000, help="window per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--long-size-mb", type=int, default=100)
    p.add_argument("--web-size-mb", type=int, default=100)
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
        a.tokens, a.rounds, a.long_size_mb, a.web_size_mb = 300_000, 1, 5, 5
    tok = load_tokenizer(a.tokenizer)
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(a).items() if k not in ("work", "out", "tokenizer")},
        "machine": machine_info(),
        "loadavg_start": loadavg(),
        "results": {},
    }
    for corpus in a.corpora:
        for lanes in a.lanes or CORPUS_LANES[corpus]:
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
