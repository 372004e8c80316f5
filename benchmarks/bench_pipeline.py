"""Benchmark of the Zephon pipeline: throughput, restore time and state size.

Everything is measured side by side in one run, because shared machines are
noisy:

1. Throughput. Tokens/s of the full pipeline (read, tokenize, mix, shuffle,
   pack: `ZephonLoader.next_batch()` over a recipe at dp 1 with its own
   workers/prefetch) next to raw Hugging Face `Tokenizer.encode_batch` over the
   same documents, held in memory, in batches of `--raw-batch` documents. The
   two are alternated for `--rounds` rounds with a fresh loader each round;
   medians and the ratio of medians are reported. Index caches and the OS file
   cache are warmed by an untimed run first.

   Both sides count the same thing: the token ids the tokenizer produces for
   the documents the pipeline delivered in its first K batches (EOS added by
   the pipeline not counted). An untimed run with `trace=True` and prefetch 0
   records exactly which documents those are (the last one may be cut off by
   the last row); the raw side tokenizes those documents, and every timed
   pipeline round consumes exactly K batches. Also reported: process CPU time
   of each side (all threads; steadier than wall time on a shared machine),
   the time to the first batch, and a steady-state rate over batches after the
   first `--steady-skip` fraction (tokens of the documents packed in them),
   which leaves out the start-up ramp. `--workers-sweep` adds workers 0/1/2/4.

2. Restore time. From `load_state_dict(state)` to the first batch of
   `next_batch()`, for states saved at `--restore-steps` (default 10 and 1002:
   both inside a flush interval, so both replay as many rows).
   The states are built by an unmodified loader (workers 0, prefetch 0) whose
   tokenizer and reads are memoized: both are pure functions of the files, so
   the states are a plain run's, only faster to reach (the earliest one is
   compared with a plain run's, and every restore's first batch must have the
   digest of the batch the generating loader produced at that step). The
   restoring loader has the recipe's workers and prefetch; it is built first
   and starts no work before its first batch, so no work from step 0 runs in
   the timed window (`--restore-cold` also times the plain
   constructor + load_state_dict + first batch path). Reported: wall and CPU
   medians, `stats()["replay"]`, all tokenization done before the first batch
   (`stats()["first_batch"]`), and each restore against a fresh start timed
   the same way, scaled by the rows the restore must rebuild.

3. State size. Bytes of `json.dumps(merge_rank_states([state_dict()]))`.

The sustained-throughput figures docs/results.md quotes come from
`bench_throughput.py`, over windows of about 16 M tokens at 1, 8 and 64 lanes;
the short default window here (2 M tokens) charges the start-up and the
lookahead past its end to a few steps, so its ratio reads lower.

Run from the repository root, e.g.

    python benchmarks/bench_pipeline.py --workers-sweep --json outputs/bench.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import tokenizers
import torch

from zephon import (
    Recipe,
    TokenizerInfo,
    ZephonLoader,
    global_batch_digest,
    load_recipe,
    load_tokenizer,
    merge_rank_states,
)
from zephon.sources import SourceReader, default_cache_dir

REPO = Path(__file__).resolve().parents[1]


def _shown(path: str) -> str:
    """A path as results record it: relative to the repository, or ~-based; never a
    machine's absolute path."""
    full = os.path.abspath(path)
    if full.startswith(str(REPO) + os.sep):
        return os.path.relpath(full, REPO)
    home = os.path.expanduser("~")
    return "~" + full[len(home) :] if full.startswith(home + os.sep) else full


RATIO_LINE = "RATIO pipeline/raw"


# -- helpers ---------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
        "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS"),
    }


def script_module(name: str, folder: str = "tools") -> ModuleType:
    """A script of scripts/<folder>/ (the sample corpus builder), loaded from its file:
    a benchmark run as `python benchmarks/X.py` has benchmarks/ on its path, not
    scripts/tools/."""
    if name in sys.modules:  # loaded already (under pytest, scripts/tools/ is on the path)
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def batch_tokens(batch: Any) -> int:
    """Non-padding tokens of a batch's rows (seq_len + 1 each; a row never starts with padding)."""
    return batch.num_rows + batch.num_valid_tokens()


class _Ids:
    __slots__ = ("ids",)

    def __init__(self, ids: np.ndarray):
        self.ids = ids


def memoize_readers(loader: ZephonLoader) -> None:
    """Serve every `read_range` (and `read_docs`, by document) after the first from
    memory (the files do not change). The same str objects then come back, so MemoTokenizer's lookups are cheap."""
    for reader in loader.ctx.readers:
        read, cache = reader.read_range, {}

        def read_range(start: int, end: int, read: Any = read, cache: dict = cache) -> list[Any]:
            key = (start, end)
            if key not in cache:
                cache[key] = read(start, end)
            return cache[key]

        def read_docs(docs: list[int], read_range: Any = read_range) -> list[Any]:
            return [read_range(d, d + 1)[0] for d in docs]

        reader.read_range = read_range  # type: ignore[method-assign]
        reader.read_docs = read_docs  # type: ignore[method-assign]


class MemoTokenizer:
    """`encode_batch` of a real tokenizer, memoized per text (only used to reach a
    late step quickly; the result is the same ids)."""

    def __init__(self, tok: Any):
        self.tok = tok
        self.cache: dict[str, _Ids] = {}

    def encode_batch(self, values: list[str], add_special_tokens: bool = True) -> list[_Ids]:
        cache = self.cache
        missing = list(dict.fromkeys(v for v in values if v not in cache))
        if missing:
            for text, enc in zip(
                missing,
                self.tok.encode_batch(missing, add_special_tokens=add_special_tokens),
                strict=True,
            ):
                cache[text] = _Ids(np.asarray(enc.ids, dtype=np.int32))
        return [cache[v] for v in values]


# -- 1. throughput -----------------------------------------------------------


class Throughput:
    def __init__(self, args: argparse.Namespace, recipe: Recipe, tok: TokenizerInfo):
        self.args, self.recipe, self.tok = args, recipe, tok
        self.tokens = 0  # set by the first raw round
        self.captured_state: dict[str, Any] | None = None

    def loader(self, **kw: Any) -> ZephonLoader:
        a = self.args
        return ZephonLoader(
            self.recipe,
            self.tok,
            a.seq_len,
            a.global_batch,
            cache_dir=a.cache_dir,
            lookahead_tokens=a.lookahead_tokens,
            **kw,
        )

    def prepare(self, capture_step: int) -> dict[str, Any]:
        """Untimed: warm the index and file caches, find K and the documents of K batches.
        Also keeps the state at `capture_step`, to check the fast-built one against."""
        t0 = time.perf_counter()
        with self.loader(prefetch=0, trace=True) as ld:
            assert ld.traces is not None
            batches = row_tokens = 0
            lanes: list[list[tuple[int, int]]] | None = None
            # cuts[k][i]: documents lane i had packed after k batches
            self.cuts = [[0] * len(ld.traces)]
            while lanes is None or ld.step <= capture_step:
                if ld.step == capture_step:
                    self.captured_state = merge_rank_states([ld.state_dict()])
                tokens = batch_tokens(ld.next_batch())
                if lanes is None:
                    batches, row_tokens = batches + 1, row_tokens + tokens
                    self.cuts.append([len(t) for t in ld.traces.values()])
                    if row_tokens >= self.args.tokens:
                        lanes = [list(t) for t in ld.traces.values()]
        docs = [d for lane in lanes for d in lane]
        self.lane_start = np.cumsum([0] + [len(t) for t in lanes])[:-1].tolist()
        self.batches, self.row_tokens = batches, row_tokens
        # The texts of those documents, read into memory from the same files.
        readers = [SourceReader(s, self.args.cache_dir) for s in self.recipe.sources]
        used = sorted({s for s, _ in docs})
        texts = {s: readers[s].read_range(0, readers[s].num_docs) for s in used}
        self.texts = [texts[s][i] for s, i in docs]
        self.num_docs = len(docs)
        return {"warmup_s": time.perf_counter() - t0, "batches": batches, "docs": len(docs)}

    def raw(self) -> tuple[float, float, int]:
        """(wall s, process CPU s, tokens) of encode_batch over the documents."""
        enc, step, texts = self.tok.tokenizer.encode_batch, self.args.raw_batch, self.texts
        lengths: list[int] = []
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, len(texts), step):
            lengths.extend(len(e) for e in enc(texts[i : i + step], add_special_tokens=False))
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        n = sum(lengths)
        self.doc_tokens = lengths
        if self.tokens and n != self.tokens:
            raise RuntimeError(f"raw token count changed between rounds: {n} != {self.tokens}")
        self.tokens = n
        return dt, dc, n

    def window_tokens(self, k0: int) -> int:
        """Tokens of the documents packed in batches k0+1..K (lanes apart)."""
        a, b, lens = self.cuts[k0], self.cuts[self.batches], self.doc_tokens
        return sum(sum(lens[s + a[i] : s + b[i]]) for i, s in enumerate(self.lane_start))

    def pipeline(self, workers: int | None = None) -> tuple[float, float, dict[str, Any]]:
        """(wall s, process CPU s, info) of K next_batch() calls on a fresh loader."""
        ld = self.loader(num_workers=workers)
        try:
            row_tokens = 0
            c0, t0 = time.process_time(), time.perf_counter()
            stamps = [t0]
            for _ in range(self.batches):
                row_tokens += batch_tokens(ld.next_batch())
                stamps.append(time.perf_counter())
            dt, dc = stamps[-1] - t0, time.process_time() - c0
            stats = ld.stats()  # approximate: the prefetch thread may be a step further
        finally:
            ld.close()
        if row_tokens != self.row_tokens:
            raise RuntimeError(
                f"pipeline delivered {row_tokens} tokens, expected {self.row_tokens}"
            )
        return (
            dt,
            dc,
            {
                "workers": ld.num_workers,
                "prefetch": ld.prefetch,
                "first_batch_s": stamps[1] - t0,
                "steady_s": stamps[-1] - stamps[self.steady_from],
                "docs_tokenized_at_end": stats["docs_tokenized"],
                "docs_packed_at_end": stats["docs_packed"],
            },
        )


def run_throughput(
    args: argparse.Namespace, recipe: Recipe, tok: TokenizerInfo
) -> tuple[dict[str, Any], Throughput]:
    tp = Throughput(args, recipe, tok)
    prep = tp.prepare(capture_step=min(args.restore_steps))
    tp.steady_from = max(1, round(tp.batches * args.steady_skip))
    print(
        f"[throughput] warm-up (untimed; warms index and file caches): {prep['batches']} batches, "
        f"{prep['docs']} documents, {prep['warmup_s']:.1f}s",
        flush=True,
    )
    raw_s, raw_cpu, pipe_s, pipe_cpu, extra = [], [], [], [], []
    for r in range(args.rounds):
        dt_raw, dc_raw, n = tp.raw()
        dt_pipe, dc_pipe, info = tp.pipeline()
        raw_s.append(dt_raw)
        raw_cpu.append(dc_raw)
        pipe_s.append(dt_pipe)
        pipe_cpu.append(dc_pipe)
        extra.append(info)
        if r == 0:
            steady_tokens = tp.window_tokens(tp.steady_from)
        steady = steady_tokens / info["steady_s"]
        print(
            f"[throughput] round {r + 1}/{args.rounds}: raw {n / dt_raw:,.0f} tok/s ({dt_raw:.2f}s, "
            f"cpu {dc_raw:.2f}s)  pipeline {n / dt_pipe:,.0f} tok/s ({dt_pipe:.2f}s, cpu "
            f"{dc_pipe:.2f}s; first batch {info['first_batch_s']:.2f}s; steady {steady:,.0f} tok/s)  "
            f"ratio {dt_raw / dt_pipe:.2f}  load {loadavg()}",
            flush=True,
        )
    n = tp.tokens
    med = statistics.median
    steady_med = med(x["steady_s"] for x in extra)
    out: dict[str, Any] = {
        "batches_per_round": tp.batches,
        "documents": tp.num_docs,
        "tokens": n,
        "row_tokens": tp.row_tokens,
        "raw_batch_docs": args.raw_batch,
        "raw_s": raw_s,
        "raw_cpu_s": raw_cpu,
        "pipeline_s": pipe_s,
        "pipeline_cpu_s": pipe_cpu,
        "raw_tok_s": n / med(raw_s),
        "pipeline_tok_s": n / med(pipe_s),
        "ratio": med(raw_s) / med(pipe_s),
        "ratio_per_round_median": med(a / b for a, b in zip(raw_s, pipe_s, strict=True)),
        "raw_tok_per_cpu_s": n / med(raw_cpu),
        "pipeline_tok_per_cpu_s": n / med(pipe_cpu),
        "cpu_ratio": med(raw_cpu) / med(pipe_cpu),
        "pipeline_rounds": extra,
        "steady_from_batch": tp.steady_from,
        "steady_tokens": steady_tokens,
        "pipeline_steady_tok_s": steady_tokens / steady_med,
        "steady_ratio": (steady_tokens / steady_med) / (n / med(raw_s)),
        "first_batch_median_s": med(x["first_batch_s"] for x in extra),
        "workers": extra[0]["workers"],
        "prefetch": extra[0]["prefetch"],
    }
    if args.workers_sweep:
        sweep = []
        for w in (0, 1, 2, 4):
            dt_raw, _, _ = tp.raw()
            dt, dc, _ = tp.pipeline(workers=w)
            sweep.append(
                {
                    "workers": w,
                    "pipeline_tok_s": n / dt,
                    "pipeline_tok_per_cpu_s": n / dc,
                    "raw_tok_s": n / dt_raw,
                    "ratio": dt_raw / dt,
                }
            )
            print(
                f"[sweep] workers={w}: pipeline {n / dt:,.0f} tok/s (cpu {dc:.2f}s), raw just before "
                f"{n / dt_raw:,.0f} tok/s, ratio {dt_raw / dt:.2f}  load {loadavg()}",
                flush=True,
            )
        out["workers_sweep"] = sweep
    return out, tp


# -- 2./3. restore time and state size -----------------------------------------


def build_states(
    args: argparse.Namespace, recipe: Recipe, tok: TokenizerInfo
) -> tuple[dict[int, dict[str, Any]], dict[int, str], float]:
    """States at each restore step, and the digest of the batch that follows each.

    An unmodified loader (workers 0, prefetch 0) whose tokenizer and readers are
    memoized: both are pure functions of the files, so the states are the ones a
    plain run writes (checked against one below and by every restore's digest)."""
    memo = replace(tok, tokenizer=MemoTokenizer(tok.tokenizer))
    states, expected = {}, {}
    t0 = time.perf_counter()
    # Untimed: torch's intra-op threads make each step's batch assembly cost
    # 10-50 ms on a busy 2-core machine, against ~1 ms with one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with ZephonLoader(
        recipe,
        memo,
        args.seq_len,
        args.global_batch,
        num_workers=0,
        prefetch=0,
        cache_dir=args.cache_dir,
        lookahead_tokens=args.lookahead_tokens,
    ) as ld:
        memoize_readers(ld)
        for step in sorted(set(args.restore_steps)):
            while ld.step < step:
                ld.next_batch()
            states[step] = json.loads(json.dumps(merge_rank_states([ld.state_dict()])))
            expected[step] = global_batch_digest(ld.next_batch().digests)
    torch.set_num_threads(threads)
    return states, expected, time.perf_counter() - t0


def run_restore(
    args: argparse.Namespace, recipe: Recipe, tok: TokenizerInfo, captured: dict[str, Any] | None
) -> dict[str, Any]:
    states, expected, gen_s = build_states(args, recipe, tok)
    first = min(states)
    check = "not checked"
    if captured is not None:
        if json.loads(json.dumps(captured)) != states[first]:
            raise RuntimeError(f"the fast-built state at step {first} differs from a plain run's")
        check = f"state at step {first} identical to a plain run's"
    print(
        f"[restore] states built in {gen_s:.1f}s (memoized tokenizer and reads); {check}",
        flush=True,
    )
    steps = sorted(states)
    times: dict[int, list[float]] = {s: [] for s in steps}
    load_times: dict[int, list[float]] = {s: [] for s in steps}
    cold: dict[int, list[float]] = {s: [] for s in steps}
    cpu: dict[int, list[float]] = {s: [] for s in steps}
    replay: dict[int, dict[str, int]] = {}
    tokenized: dict[int, list[tuple[int, int]]] = {s: [] for s in steps}
    fresh: list[float] = []
    fresh_first: dict[str, int] = {}

    def make(prefetch: int | None) -> ZephonLoader:
        return ZephonLoader(
            recipe,
            tok,
            args.seq_len,
            args.global_batch,
            prefetch=prefetch,
            cache_dir=args.cache_dir,
            lookahead_tokens=args.lookahead_tokens,
        )

    def verify(step: int, batch: Any) -> None:
        if global_batch_digest(batch.digests) != expected[step]:
            raise RuntimeError(f"restore at step {step}: first batch differs from the original run")

    for rep in range(args.restore_reps):
        # A fresh start, timed the same way, as the reference for the restores.
        ld = make(prefetch=None)
        try:
            t0 = time.perf_counter()
            ld.next_batch()
            fresh.append(time.perf_counter() - t0)
            fresh_first = ld.stats()["first_batch"]
        finally:
            ld.close()
        for step in steps if rep % 2 == 0 else steps[::-1]:
            # The loader starts no work until its first batch, so building it
            # first and timing load_state_dict + next_batch measures the restore.
            ld = make(prefetch=None)
            try:
                c0, t0 = time.process_time(), time.perf_counter()
                ld.load_state_dict(states[step])
                t1 = time.perf_counter()
                batch = ld.next_batch()
                t2, c2 = time.perf_counter(), time.process_time()
                cpu[step].append(c2 - c0)
                fb = ld.stats()["first_batch"]
                tokenized[step].append((fb["docs_tokenized"], fb["tokens_tokenized"]))
                replay[step] = ld.stats()["replay"]
                row_tokens = fb["row_tokens"]
            finally:
                ld.close()
            verify(step, batch)
            times[step].append(t2 - t0)
            load_times[step].append(t1 - t0)
            if args.restore_cold:
                # As a trainer resumes: build a default loader, load the state at once.
                t0 = time.perf_counter()
                ld = make(prefetch=None)
                try:
                    ld.load_state_dict(states[step])
                    batch = ld.next_batch()
                    cold[step].append(time.perf_counter() - t0)
                finally:
                    ld.close()
                verify(step, batch)
        print(
            f"[restore] rep {rep + 1}/{args.restore_reps}: "
            + f"fresh {fresh[-1] * 1e3:.0f} ms  "
            + "  ".join(
                f"step {s}: {times[s][-1] * 1e3:.0f} ms"
                + (f" (cold {cold[s][-1] * 1e3:.0f} ms)" if cold[s] else "")
                for s in steps
            )
            + f"  load {loadavg()}",
            flush=True,
        )
    lanes = recipe.lanes
    result: dict[str, Any] = {
        "build_states_s": gen_s,
        "state_check": check,
        "workers": recipe.execution.workers,
        "prefetch": recipe.execution.prefetch,
        "fresh_s": fresh,
        "fresh_median_s": statistics.median(fresh),
        "fresh_first_batch": fresh_first,
        "per_step": {},
    }
    for step in steps:
        blob = json.dumps(states[step])
        lane_entries = [len(json.dumps(v)) for v in states[step]["lanes"].values()]
        result["per_step"][str(step)] = {
            "restore_s": times[step],
            "restore_median_s": statistics.median(times[step]),
            "load_state_dict_median_s": statistics.median(load_times[step]),
            "restore_cpu_median_s": statistics.median(cpu[step]),
            "cold_s": cold[step],
            "cold_median_s": statistics.median(cold[step]) if cold[step] else None,
            "replay": replay[step],
            # all tokenizer output before the first batch was assembled (replay
            # included; lookahead starts after it), median over repetitions
            "tokenized_docs": statistics.median(d for d, _ in tokenized[step]),
            "tokenized_tokens": statistics.median(t for _, t in tokenized[step]),
            "rows_since_flush_per_lane": [
                e["rows_since_flush"] for e in states[step]["lanes"].values()
            ],
            # restore time over (fresh start x (rows + replayed rows) / rows): the
            # restore must rebuild its replayed rows too (target <= 1.5)
            "vs_fresh_plus_replay": statistics.median(times[step])
            / (
                statistics.median(fresh)
                * (row_tokens + replay[step]["rows"] * (args.seq_len + 1))
                / row_tokens
            ),
            "state_bytes": len(blob),
            "state_bytes_per_lane": len(blob) / lanes,
            "lane_entry_bytes_mean": statistics.mean(lane_entries),
        }
    base = result["per_step"][str(first)]["restore_median_s"]
    base_cpu = result["per_step"][str(first)]["restore_cpu_median_s"]
    result["ratios"] = {
        f"t({s})/t({first})": result["per_step"][str(s)]["restore_median_s"] / base
        for s in steps[1:]
    }
    result["cpu_ratios"] = {
        f"t({s})/t({first})": result["per_step"][str(s)]["restore_cpu_median_s"] / base_cpu
        for s in steps[1:]
    }
    return result


# -- main --------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--recipe", default=str(REPO / "train_configs/data/sample_mix.toml"))
    p.add_argument("--tokenizer", default=str(REPO / "assets/tokenizer/tokenizer.json"))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=2_000_000, help="token budget per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--raw-batch", type=int, default=1000, help="documents per encode_batch call")
    p.add_argument(
        "--steady-skip",
        type=float,
        default=0.25,
        help="steady-state figure: skip this fraction of the batches (ramp-up)",
    )
    p.add_argument(
        "--lookahead-tokens",
        type=int,
        default=None,
        help="loader lookahead budget in tokens (default: the recipe's, else two steps)",
    )
    p.add_argument(
        "--restore-steps",
        type=int,
        nargs="+",
        default=None,
        help="steps to restore at; ratios are to the first (default 10 1002: the same replay "
        "depth, inside a flush interval)",
    )
    p.add_argument(
        "--restore-reps", type=int, default=None, help="repetitions per step (default 3)"
    )
    p.add_argument(
        "--cache-dir", default=None, help="index cache (default: the recipe's or user cache)"
    )
    p.add_argument(
        "--workers-sweep", action="store_true", help="also run the pipeline with workers 0/1/2/4"
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads for the whole run (default: torch's own)",
    )
    p.add_argument("--skip-restore", action="store_true")
    p.add_argument(
        "--restore-cold",
        action="store_true",
        help="also time constructor + load_state_dict + first batch (as a trainer resumes)",
    )
    p.add_argument("--quick", action="store_true", help="tiny budget, for a CI smoke test")
    p.add_argument("--json", default=None, help="write the figures to this path")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens = min(args.tokens, 60_000)
        args.rounds = 1
        args.seq_len = min(args.seq_len, 128)
        args.global_batch = min(args.global_batch, 8)
        args.restore_steps = args.restore_steps or [10, 100]
        args.restore_reps = args.restore_reps or 1
    args.restore_steps = sorted(set(args.restore_steps or [10, 1002]))
    args.restore_reps = args.restore_reps or 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    recipe = load_recipe(args.recipe)
    tok = load_tokenizer(args.tokenizer)
    mach = machine_info()
    cache = args.cache_dir or recipe.execution.cache_dir or default_cache_dir()
    print(
        f"# {recipe.name}: seq_len {args.seq_len}, global batch {args.global_batch}, lanes {recipe.lanes}, "
        f"dp 1, {args.rounds} round(s) of ~{args.tokens:,} tokens; index cache {_shown(cache)}",
        flush=True,
    )
    print(
        f"# {mach['cpu_model']}, {mach['cpus_usable']} usable CPUs, load {loadavg()}; "
        f"python {mach['python']}, tokenizers {mach['tokenizers']}, torch threads "
        f"{mach['torch_threads']}",
        flush=True,
    )
    t_start = time.perf_counter()
    result: dict[str, Any] = {
        "config": {
            "recipe": _shown(args.recipe),
            "tokenizer": _shown(args.tokenizer),
            "seq_len": args.seq_len,
            "global_batch": args.global_batch,
            "lanes": recipe.lanes,
            "tokens_budget": args.tokens,
            "rounds": args.rounds,
            "restore_steps": args.restore_steps,
            "restore_reps": args.restore_reps,
            "lookahead_tokens": args.lookahead_tokens or recipe.execution.lookahead_tokens,
            "cache_dir": _shown(cache),
            "quick": args.quick,
        },
        "machine": mach,
        "loadavg_start": loadavg(),
    }
    tp, bench = run_throughput(args, recipe, tok)
    result["throughput"] = tp
    if not args.skip_restore:
        result["restore"] = run_restore(args, recipe, tok, bench.captured_state)
    result["loadavg_end"] = loadavg()
    result["wall_s"] = time.perf_counter() - t_start
    print_summary(result)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def print_summary(result: dict[str, Any]) -> None:
    tp = result["throughput"]
    print("\n== summary ==")
    if result["config"]["quick"]:
        print("(--quick: smoke-test budget; the figures below are not meaningful)")
    print(
        f"{tp['documents']:,} documents, {tp['tokens']:,} tokens per round ({tp['batches_per_round']} "
        f"batches); pipeline workers {tp['workers']}, prefetch {tp['prefetch']}; raw: encode_batch "
        f"of {tp['raw_batch_docs']} docs; index caches warmed before timing"
    )
    print(f"{'':<22}{'tok/s (median)':>15}{'tok/cpu-s':>11}  rounds wall s")
    for name, key in (("raw encode_batch", "raw"), ("pipeline next_batch", "pipeline")):
        print(
            f"{name:<22}{tp[key + '_tok_s']:>15,.0f}{tp[key + '_tok_per_cpu_s']:>11,.0f}  "
            + " ".join(f"{s:.2f}" for s in tp[key + "_s"])
        )
    print(
        f"{'pipeline, steady state':<22}{tp['pipeline_steady_tok_s']:>15,.0f}{'':>11}  "
        f"batches {tp['steady_from_batch'] + 1}..{tp['batches_per_round']} "
        f"(first batch after {tp['first_batch_median_s']:.2f}s)"
    )
    print(
        f"{RATIO_LINE} = {tp['ratio']:.3f} (ratio of medians; target >= 0.90); "
        f"per-round median {tp['ratio_per_round_median']:.3f}; by CPU time {tp['cpu_ratio']:.3f}; "
        f"steady state {tp['steady_ratio']:.3f}"
    )
    if "workers_sweep" in tp:
        print(f"{'workers':<10}{'pipeline tok/s':>15}{'tok/cpu-s':>11}{'vs raw':>8}")
        for row in tp["workers_sweep"]:
            print(
                f"{row['workers']:<10}{row['pipeline_tok_s']:>15,.0f}"
                f"{row['pipeline_tok_per_cpu_s']:>11,.0f}{row['ratio']:>8.2f}"
            )
    if "restore" in result:
        rs = result["restore"]
        print(
            f"restore (workers {rs['workers']}, prefetch {rs['prefetch']}); {rs['state_check']}\n"
            f"{'step':<7}{'median ms':>10}{'load ms':>9}{'cpu ms':>8}{'state B':>9}{'B/lane':>8}"
            f"{'rows/lane':>10}{'tok. docs':>10}{'tok. tokens':>12}  replay (rows, docs packed, "
            "docs tokenized)"
        )
        for step, r in rs["per_step"].items():
            rp = r["replay"]
            print(
                f"{step:<7}{r['restore_median_s'] * 1e3:>10.0f}{r['load_state_dict_median_s'] * 1e3:>9.0f}"
                f"{r['restore_cpu_median_s'] * 1e3:>8.0f}"
                f"{r['state_bytes']:>9}{r['state_bytes_per_lane']:>8.0f}"
                f"{max(r['rows_since_flush_per_lane']):>10}{r['tokenized_docs']:>10.0f}"
                f"{r['tokenized_tokens']:>12,.0f}  "
                f"{rp['rows']}, {rp['docs_packed']}, {rp['docs_tokenized']}"
            )
        for step, r in rs["per_step"].items():
            if r["cold_median_s"] is not None:
                print(
                    f"cold resume at step {step} (constructor included): {r['cold_median_s'] * 1e3:.0f} ms"
                )
        print(f"fresh start to first batch: {rs['fresh_median_s'] * 1e3:.0f} ms")
        for step, r in rs["per_step"].items():
            print(
                f"RESTORE t({step}) / (fresh x (rows + replayed rows) / rows) = "
                f"{r['vs_fresh_plus_replay']:.3f} (target <= 1.5)"
            )
        for name, value in rs["ratios"].items():
            print(
                f"RESTORE {name} = {value:.3f} (target < 1.2); by CPU time "
                f"{rs['cpu_ratios'][name]:.3f}"
            )
    print(
        f"wall {result['wall_s']:.0f}s, load avg {result['loadavg_start']} -> {result['loadavg_end']}"
    )


if __name__ == "__main__":
    sys.exit(main())
