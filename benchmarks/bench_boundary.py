"""What crossing a phase boundary costs, in tokens tokenized (counts, not time).

A recipe over the bundled sample corpus with four phases (a batch-size ramp,
a longer seq_len, new weights, a lane-count change) runs at D = 1 with no
worker threads and no prefetch, so the counts are exact and repeatable. For
every step it records the tokens the tokenizer produced (`stats()`), the
tokens of the step's rows and the documents read. A boundary step is compared
with the ordinary steps around it: crossing costs about a step's tokens (the
rows it needs, plus at most the document each lane carries or gave back),
with no replay, where a restart from a checkpoint replays up to a flush
interval per lane.

The lookahead budget is 1 token, so only the step being produced is tokenized
and each step's count is that step's own work (with the default budget the
work of a step lands in whichever earlier step had room for it). Also counted:
documents tokenized against documents picked plus those held in the feeds; a
difference is work done twice or thrown away.

    python benchmarks/bench_boundary.py --json docs/results/bench_boundary.json \\
        --md docs/results/bench_boundary.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from zephon import ZephonLoader, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"

PHASES = """
[[phase]]
name = "warmup"
start_step = 0
global_batch_size = 16
seq_len = 256
[[phase]]
name = "ramp"
start_step = {ramp}
global_batch_size = 32
[[phase]]
name = "long"
start_step = {long}
seq_len = 512
[[phase]]
name = "anneal"
start_step = {anneal}
weights = {{ prose = 0.3, code = 0.7 }}
lanes = 16
"""


def write_recipe(folder: Path, every: int) -> Path:
    recipe = folder / "phases.toml"
    recipe.write_text(
        '[recipe]\nname = "sample-phases"\nseed = 1234\nlanes = 8\n'
        '[packing]\nalgorithm = "concat"\nflush_interval = 32\n'
        f'[[source]]\nname = "prose"\npath = "{SAMPLE}/prose/*.jsonl"\nweight = 0.7\n'
        f'[[source]]\nname = "code"\npath = "{SAMPLE}/code/*.jsonl.gz"\nweight = 0.3\n'
        + PHASES.format(ramp=every, long=2 * every, anneal=3 * every)
    )
    return recipe


def count_steps(recipe: Path, tok: Any, steps: int) -> list[dict[str, Any]]:
    loader = ZephonLoader(
        recipe, tok, 256, 16, num_workers=0, prefetch=0, lookahead_tokens=1, trace=True
    )
    planner = loader.ctx.scheduler.planner
    out, before = [], 0
    for _ in range(steps):
        batch = loader.next_batch()
        stats = loader.stats()
        assert loader.traces is not None
        held = sum(s.ids is not None for ld in planner.lanes for f in ld.feeds for s in f.slots)
        out.append(
            {
                "step": batch.step + 1,
                "phase": batch.phase,
                "tokenized": stats["tokens_tokenized"] - before,
                "row_tokens": batch.num_rows + batch.num_valid_tokens(),
                "docs_tokenized": stats["docs_tokenized"],
                "docs_picked_or_held": sum(len(t) for t in loader.traces.values()) + held,
                "replayed_rows": loader.replay.get("rows", 0),
            }
        )
        before = stats["tokens_tokenized"]
    loader.close()
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Crossing steps against the median ordinary step, by tokens tokenized per row token."""
    ratio = [r["tokenized"] / r["row_tokens"] for r in rows]
    crossing = [i for i in range(1, len(rows)) if rows[i]["phase"] != rows[i - 1]["phase"]]
    ordinary = [ratio[i] for i in range(2, len(rows)) if i not in crossing]
    return {
        "ordinary_median_ratio": round(statistics.median(ordinary), 3),
        "ordinary_max_ratio": round(max(ordinary), 3),
        "crossings": [
            {
                "step": rows[i]["step"],
                "into": rows[i]["phase"],
                "tokenized": rows[i]["tokenized"],
                "row_tokens": rows[i]["row_tokens"],
                "ratio": round(ratio[i], 3),
            }
            for i in crossing
        ],
        "replayed_rows": max(r["replayed_rows"] for r in rows),
        "docs_done_twice_or_dropped": {
            r["phase"]: r["docs_tokenized"] - r["docs_picked_or_held"]
            for r in rows
            if r is rows[-1] or r["phase"] != rows[rows.index(r) + 1]["phase"]
        },
    }


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "# Crossing a phase boundary (benchmarks/bench_boundary.py)",
        "",
        f"Recipe: the sample corpus (prose, code), {result['steps']} steps at D = 1, no"
        " workers, no prefetch, lookahead 1 token; phases every"
        f" {result['every']} steps: warmup (G 16, seq_len 256, 8 lanes), ramp (G 32), long"
        " (seq_len 512), anneal (prose 0.3 / code 0.7, 16 lanes). Counts are exact, not"
        " timed. Ratio: tokens tokenized in the step / tokens of its rows (each lane's"
        " last document of a step is tokenized whole, so a ratio above 1 is work for the"
        " next step).",
        "",
        f"Ordinary steps (after the first two): median ratio {s['ordinary_median_ratio']},"
        f" max {s['ordinary_max_ratio']}.",
        "",
        "| crossing into | step | tokens tokenized | row tokens | ratio |",
        "|---|---|---|---|---|",
    ]
    for c in s["crossings"]:
        lines.append(
            f"| {c['into']} | {c['step']} | {c['tokenized']} | {c['row_tokens']} | {c['ratio']} |"
        )
    twice = ", ".join(f"{k} {v}" for k, v in s["docs_done_twice_or_dropped"].items())
    lines += [
        "",
        f"Rows replayed: {s['replayed_rows']} (a crossing replays nothing; a restart"
        " replays up to a flush interval per lane). Documents tokenized beyond those picked"
        f" or held in the feeds, by the end of each phase: {twice} (the lane-count change"
        " drops what the old lanes' feeds held; the other boundaries keep them).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=6, help="steps per phase")
    parser.add_argument("--json", default="")
    parser.add_argument("--md", default="")
    args = parser.parse_args()
    tok = load_tokenizer(REPO / "assets" / "tokenizer" / "tokenizer.json")
    steps = 4 * args.every
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("ZEPHON_CACHE_DIR", os.path.join(tmp, "cache"))
        recipe = write_recipe(Path(tmp), args.every)
        rows = count_steps(recipe, tok, steps)
    result = {"every": args.every, "steps": steps, "summary": summarise(rows), "per_step": rows}
    text = markdown(result)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
