"""Scale benchmark: start-up, restore, memory and throughput against lanes per rank.

Generates a JSONL corpus of a given size (log-normal document lengths plus a
tail of very long documents), then for each lane count (all lanes on one rank,
the same global batch) runs, each in a fresh subprocess so that peak RSS
(ru_maxrss) belongs to that configuration alone:

- fresh: time to the first batch, documents and tokens tokenized before it
  (`stats()["first_batch"]`), peak RSS, then a steady window of steps whose
  documents are then encoded by raw `Tokenizer.encode_batch` (1000 per call)
  in the same process: the ratio is raw time / pipeline time on the same
  documents. The loader state after `--restore-step` steps is saved.
- restore: a new loader loads that state (a step inside a flush interval, so
  the restore has rows to replay) and times its first batch.
- idle: a loader built but never started (the fixed overhead of the process).

And one long-document check: `--long-steps` steps of a small recipe over a
plain corpus, with and without one `--long-doc-mb` single-line document.

Writes <out>.json (raw figures) and <out>.md (the table quoted in docs/results.md).
The machine used for the committed figures was shared with other jobs: time
ratios are noisy; counts and RSS are not.

    python benchmarks/bench_scale.py                      # ~100 MB, about ten minutes on 2 cores
    python benchmarks/bench_scale.py --size-mb 1000 --lanes 1 8 32 64 256 1024 \\
        --seq-len 2048 --global-batch 512 --out outputs/bench_scale_1g
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.train import quote_in_page

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "assets" / "tokenizer" / "tokenizer.json"
# The documentation page whose `<!-- NAME:begin/end -->` markers quote this benchmark's summary.
QUOTED_IN = "docs/results.md"


# -- corpus ---------------------------------------------------------------------


def _vocabulary(rng: np.random.Generator, n: int = 4000) -> np.ndarray:
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    p = np.linspace(2.0, 0.2, len(letters))
    words = []
    for _ in range(n):
        k = int(rng.integers(1, 11))
        words.append("".join(rng.choice(letters, k, p=p / p.sum())))
    extra = ["the", "of", "and", "to", "in", "def", "return", "=", "(", ")", ":", "#", "1", "42"]
    return np.array(words + extra * 40)


def _text(rng: np.random.Generator, vocab: np.ndarray, chars: int) -> str:
    n = max(1, chars // 6)
    words = vocab[rng.zipf(1.3, n) % len(vocab)]
    lines = [" ".join(words[i : i + 12]) for i in range(0, n, 12)]
    return "\n".join(lines)


def _scale_length(rng: np.random.Generator) -> tuple[int, bool]:
    """Log-normal lengths (median ~2.5 KB, mean ~5 KB) and 0.3% long documents
    of 100 KB to 2 MB; (characters, whether it is a long one)."""
    if rng.random() < 0.003:
        return int(min(2_000_000, 100_000 * (1 + rng.pareto(1.2)))), True
    return int(np.clip(rng.lognormal(np.log(2500), 1.1), 50, 90_000)), False


def make_corpus(
    folder: Path, size_mb: int, seed: int, files: int = 8, length: Any = _scale_length
) -> dict[str, Any]:
    """JSONL files of generated documents whose lengths `length(rng)` draws
    (default: `_scale_length`). Written once; reused while the parameters match."""
    meta_path = folder / "corpus.json"
    want = {"size_mb": size_mb, "seed": seed, "files": files, "version": 1}
    if length is not _scale_length:
        want["lengths"] = length.__name__
    if meta_path.exists() and json.loads(meta_path.read_text()).get("params") == want:
        return json.loads(meta_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("part-*.jsonl"):
        old.unlink()
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng)
    per_file = size_mb * 1_000_000 // files
    docs = longs = 0
    longest = 0
    t0 = time.perf_counter()
    for k in range(files):
        written = 0
        with open(folder / f"part-{k:03d}.jsonl", "w", encoding="utf-8") as f:
            while written < per_file:
                chars, long = length(rng)
                longs += long
                line = json.dumps({"text": _text(rng, vocab, chars)}) + "\n"
                f.write(line)
                written += len(line)
                docs += 1
                longest = max(longest, chars)
    meta = {
        "params": want,
        "documents": docs,
        "long_documents": longs,
        "longest_chars": longest,
        "bytes": sum(p.stat().st_size for p in folder.glob("part-*.jsonl")),
        "generate_s": time.perf_counter() - t0,
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def write_recipe(path: Path, data: str, lanes: int, flush: int, cache: Path) -> Path:
    path.write_text(
        f'[recipe]\nname = "scale"\nseed = 7\nlanes = {lanes}\n\n'
        f"[shuffle]\nblock_size = 64\n\n"
        f'[packing]\nalgorithm = "concat"\nflush_interval = {flush}\n\n'
        f'[execution]\nworkers = 2\nprefetch = 2\ncache_dir = "{cache}"\n\n'
        f'[[source]]\nname = "web"\npath = "{data}"\n'
    )
    return path


# -- children (one configuration per process) -----------------------------------


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_fresh(a: argparse.Namespace) -> dict[str, Any]:
    from zephon import ZephonLoader, merge_rank_states

    ld = ZephonLoader(a.recipe, str(TOKENIZER), a.seq_len, a.global_batch, trace=True)
    t0 = time.perf_counter()
    batch = ld.next_batch()
    first_s = time.perf_counter() - t0
    first = ld.stats()["first_batch"]
    first_rows = batch.num_rows + batch.num_valid_tokens()
    state = None
    while ld.step < a.restore_step:
        ld.next_batch()
    state = merge_rank_states([ld.state_dict()])
    Path(a.state).write_text(json.dumps(state))
    for _ in range(a.warm_steps):
        ld.next_batch()
    assert ld.traces is not None
    start = {lane: len(t) for lane, t in ld.traces.items()}
    t1 = time.perf_counter()
    for _ in range(a.steady_steps):
        ld.next_batch()
    window_s = time.perf_counter() - t1
    end = {lane: len(t) for lane, t in ld.traces.items()}
    docs = [d for lane, t in ld.traces.items() for _, d in t[start[lane] : end[lane]]]
    rss = _rss_mb()
    work = ld.stats()["work"]
    reader = ld.ctx.readers[0]
    ld.close()
    texts = [reader.read_range(d, d + 1)[0] for d in docs]
    tok = ld.tok.tokenizer
    t2 = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 1000):
        tokens += sum(
            len(e) for e in tok.encode_batch(texts[i : i + 1000], add_special_tokens=False)
        )
    raw_s = time.perf_counter() - t2
    return {
        "first_batch_s": first_s,
        "first_batch": first,
        "first_batch_row_tokens": first_rows,
        "peak_rss_mb": rss,
        "window_docs": len(docs),
        "window_tokens": tokens,
        "window_s": window_s,
        "raw_s": raw_s,
        "ratio": raw_s / window_s,
        "lookahead_budget": work["lookahead_budget"],
        "lookahead_peak_tokens": work["lookahead_peak_tokens"],
    }


def child_restore(a: argparse.Namespace) -> dict[str, Any]:
    from zephon import ZephonLoader

    state = json.loads(Path(a.state).read_text())
    ld = ZephonLoader(a.recipe, str(TOKENIZER), a.seq_len, a.global_batch)
    t0 = time.perf_counter()
    ld.load_state_dict(state)
    batch = ld.next_batch()
    out = {
        "restore_s": time.perf_counter() - t0,
        "first_batch": ld.stats()["first_batch"],
        "replay": ld.stats()["replay"],
        "first_batch_row_tokens": batch.num_rows + batch.num_valid_tokens(),
        "peak_rss_mb": _rss_mb(),
    }
    ld.close()
    return out


def child_idle(a: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: F401  (imported by a real run's first batch too)

    from zephon import ZephonLoader

    ld = ZephonLoader(a.recipe, str(TOKENIZER), a.seq_len, a.global_batch)
    out = {"peak_rss_mb": _rss_mb()}
    ld.close()
    return out


def child_steps(a: argparse.Namespace) -> dict[str, Any]:
    from zephon import ZephonLoader

    ld = ZephonLoader(a.recipe, str(TOKENIZER), a.seq_len, a.global_batch)
    t0 = time.perf_counter()
    for _ in range(a.steady_steps):
        ld.next_batch()
    out = {
        "steps": a.steady_steps,
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mb": _rss_mb(),
        "tokens_tokenized": ld.stats()["tokens_tokenized"],
    }
    ld.close()
    return out


CHILDREN = {
    "fresh": child_fresh,
    "restore": child_restore,
    "idle": child_idle,
    "steps": child_steps,
}


def run_child(kind: str, **kw: Any) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the parent -------------------------------------------------------------------


def long_doc_check(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The sample prose with and without one long single-line document."""
    prose = sorted((REPO / "data" / "sample" / "prose").glob("*.jsonl"))
    lines = [ln for p in prose for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    texts = [json.loads(ln)["text"] for ln in lines]
    big = ("\n".join(texts) * 8)[: a.long_doc_mb * 1_000_000]
    out = {}
    for name, extra in (("without", []), ("with", [json.dumps({"text": big})])):
        folder = work / f"long_{name}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prose.jsonl").write_text("\n".join(lines + extra) + "\n", encoding="utf-8")
        recipe = write_recipe(folder / "recipe.toml", "prose.jsonl", 8, 32, work / "cache")
        out[name] = run_child(
            "steps", recipe=recipe, seq_len=2048, global_batch=8, steady_steps=a.long_steps
        )
        print(f"[long] {name} a {a.long_doc_mb} MB document: {out[name]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--child", choices=sorted(CHILDREN))
    p.add_argument("--recipe", default="")
    p.add_argument("--state", default="")
    p.add_argument("--size-mb", type=int, default=100)
    p.add_argument("--lanes", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--flush-interval", type=int, default=40)
    p.add_argument("--restore-step", type=int, default=3, help="inside a flush interval")
    p.add_argument("--warm-steps", type=int, default=2)
    p.add_argument("--steady-steps", type=int, default=6)
    p.add_argument("--long-doc-mb", type=int, default=5)
    p.add_argument("--long-steps", type=int, default=200)
    p.add_argument("--work", default=str(REPO / "outputs" / "bench_scale"))
    p.add_argument("--out", default=str(REPO / "docs" / "results" / "bench_scale"))
    p.add_argument(
        "--render",
        action="store_true",
        help="only rewrite <out>.md and its quote in the docs from <out>.json",
    )
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(CHILDREN[a.child](a)))
        return 0
    out = Path(a.out)
    if a.render:
        publish(out, json.loads(out.with_suffix(".json").read_text()))
        return 0

    work = Path(a.work).resolve()
    corpus = make_corpus(work / "corpus", a.size_mb, seed=1)
    print(f"[corpus] {corpus}", flush=True)
    data = str(work / "corpus" / "part-*.jsonl")
    result: dict[str, Any] = {
        "config": {
            k: (os.path.relpath(v, REPO) if k in ("work", "out") else v)
            for k, v in vars(a).items()
            if k not in ("child", "recipe", "state")
        },
        "corpus": corpus,
        "cpus": len(os.sched_getaffinity(0)),
        "loadavg_start": os.getloadavg(),
        "lanes": {},
    }
    for lanes in a.lanes:
        recipe = write_recipe(
            work / f"recipe_{lanes}.toml", data, lanes, a.flush_interval, work / "cache"
        )
        common = {"recipe": recipe, "seq_len": a.seq_len, "global_batch": a.global_batch}
        state = work / f"state_{lanes}.json"
        idle = run_child("idle", **common)  # also builds the index cache on first use
        fresh = run_child(
            "fresh",
            state=state,
            restore_step=a.restore_step,
            warm_steps=a.warm_steps,
            steady_steps=a.steady_steps,
            **common,
        )
        restore = run_child("restore", state=state, **common)
        result["lanes"][str(lanes)] = {"idle": idle, "fresh": fresh, "restore": restore}
        print(f"[lanes {lanes}] idle {idle}\n  fresh {fresh}\n  restore {restore}", flush=True)
    if a.long_doc_mb:
        result["long_document"] = long_doc_check(a, work)
    result["loadavg_end"] = os.getloadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    publish(out, result)
    return 0


def publish(out: Path, result: dict[str, Any]) -> None:
    """Write the table; the committed one (docs/results) is also quoted in QUOTED_IN."""
    text = render(result)
    out.with_suffix(".md").write_text(text)
    print(text)
    if out.resolve() == (REPO / "docs" / "results" / "bench_scale").resolve():
        quote_in_page(QUOTED_IN, "bench_scale", text)


def render(r: dict[str, Any]) -> str:
    c, corpus = r["config"], r["corpus"]
    rows_per_step = c["global_batch"]
    lines = [
        f"Corpus: {corpus['bytes'] / 1e6:.0f} MB JSONL, {corpus['documents']:,} documents "
        f"({corpus['long_documents']} long, the longest {corpus['longest_chars'] / 1e6:.1f} M "
        f"characters); one source, concat, seq_len {c['seq_len']}, global batch "
        f"{rows_per_step} rows, all lanes on one rank, workers 2, prefetch 2, lookahead "
        f"default (two steps). Restore at step {c['restore_step']} (inside a flush interval "
        f"of {c['flush_interval']} rows). {r['cpus']} CPUs (load "
        f"{r['loadavg_start'][0]:.1f} at the start, {r['loadavg_end'][0]:.1f} at the end). The "
        f"last column is {c['steady_steps']} steps after a warm lookahead, raw time over "
        "pipeline time on the same documents: too short to say anything about sustained "
        "throughput, which `bench_throughput.py` measures over 16 M-token windows.",
        "",
        "| lanes | first batch | tokens tokenized before it / in it | restore (replay rows) "
        "| tokens tokenized before it / in it + replayed | peak RSS fresh / restore / idle "
        "| short window vs raw encode_batch |",
        "|---|---|---|---|---|---|---|",
    ]
    row = c["seq_len"] + 1
    for lanes, v in r["lanes"].items():
        f, s, i = v["fresh"], v["restore"], v["idle"]
        need_r = s["first_batch_row_tokens"] + s["replay"]["rows"] * row
        lines.append(
            f"| {lanes} | {f['first_batch_s']:.2f} s | {f['first_batch']['tokens_tokenized']:,} / "
            f"{f['first_batch_row_tokens']:,} | {s['restore_s']:.2f} s ({s['replay']['rows']}) | "
            f"{s['first_batch']['tokens_tokenized']:,} / {need_r:,} | "
            f"{f['peak_rss_mb']:.0f} / {s['peak_rss_mb']:.0f} / {i['peak_rss_mb']:.0f} MB | "
            f"{f['ratio']:.2f} |"
        )
    if "long_document" in r:
        lo = r["long_document"]
        lines += [
            "",
            f"Long document: {c['long_steps']} steps (seq_len 2048, 8 rows) over the sample prose, "
            f"without / with one {c['long_doc_mb']} MB single-line document: "
            f"{lo['without']['wall_s']:.1f} s / {lo['with']['wall_s']:.1f} s, peak RSS "
            f"{lo['without']['peak_rss_mb']:.0f} / {lo['with']['peak_rss_mb']:.0f} MB, tokens "
            f"tokenized {lo['without']['tokens_tokenized']:,} / {lo['with']['tokens_tokenized']:,}.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
