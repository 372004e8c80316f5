#!/usr/bin/env python
"""Data-parallel sizes that do not divide the lane count: every run must log the
even run's global-batch digests, and losses within 1e-5 (relative) of it.

Debug model, 6 steps, checkpoint at step 3, on CPU processes:

- 12 lanes (the sample mix with `lanes = 12`), global batch 24: the even run on
  4 processes (3 lanes each) is the reference; its step-3 checkpoint resumed on
  5 processes (2 or 3 lanes each) and on 7 (1 or 2); a run on 5 from scratch,
  and its own step-3 checkpoint resumed on 7 (uneven to uneven).
- 8 lanes (the sample mix), global batch 16: the even run on 4 processes is the
  reference; data-parallel 3 x tensor-parallel 2 (6 processes; 2, 3, 3 lanes)
  from scratch and resumed from the reference's checkpoint; HSDP replicate 3 x
  shard 2 (6 processes; 1 or 2 lanes) resumed from it.

Writes docs/results/uneven_resume.json (raw) and .md (generated from the JSON;
`--render JSON` regenerates it); exits 1 if any digest differs or a loss is
further than 1e-5 from the reference.

    .venv/bin/python scripts/experiments/uneven_resume.py [--out docs/results]
    .venv/bin/python scripts/experiments/uneven_resume.py --render docs/results/uneven_resume.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.train import (
    REPO,
    compare,
    copy_checkpoint,
    ensure_sample_data,
    read_metrics,
    render_results,
    results_args,
    run_logged,
)
from zephon import resolve_layout

STEPS, K, LOSS_RTOL, MICRO = 6, 3, 1e-5, 2
SAMPLE_MIX = REPO / "train_configs" / "data" / "sample_mix.toml"
# name -> (processes, (replicate, shard, tp))
MESHES = {
    "shard4": (4, (1, 4, 1)),
    "shard5": (5, (1, 5, 1)),
    "shard7": (7, (1, 7, 1)),
    "dp3xtp2": (6, (1, 3, 2)),
    "hsdp3x2": (6, (3, 2, 1)),
}
# (lanes, global batch) -> reference mesh, runs from scratch, (saved on, resumed on)
PLAN: dict[tuple[int, int], tuple[str, list[str], list[tuple[str, str]]]] = {
    (12, 24): (
        "shard4",
        ["shard5"],
        [("shard4", "shard5"), ("shard4", "shard7"), ("shard5", "shard7")],
    ),
    (8, 16): ("shard4", ["dp3xtp2"], [("shard4", "dp3xtp2"), ("shard4", "hsdp3x2")]),
}


def recipe_with_lanes(lanes: int, folder: Path) -> Path:
    """The sample mix with another lane count (paths made absolute)."""
    if lanes == 8:
        return SAMPLE_MIX
    text = SAMPLE_MIX.read_text()
    text = text.replace("lanes = 8", f"lanes = {lanes}").replace(
        "../../data/sample", str(REPO / "data" / "sample")
    )
    path = folder / f"sample_mix_{lanes}_lanes.toml"
    path.write_text(text)
    return path


def run(name: str, dump: Path, recipe: Path, global_batch: int) -> dict[int, dict]:
    nproc, (rep, shard, tp) = MESHES[name]
    args = [
        "--job.config_file", str(REPO / "train_configs" / "llama3_debugmodel.toml"),
        "--data.recipe", str(recipe), "--training.seq_len", "64",
        "--training.global_batch_size", str(global_batch),
        "--training.local_batch_size", str(MICRO), "--training.steps", str(STEPS),
        "--checkpoint.interval", str(K), "--lr_scheduler.warmup_steps", "2",
        "--data.log_batch_digests", "true",
        "--parallelism.data_parallel_replicate_degree", str(rep),
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--parallelism.tensor_parallel_degree", str(tp),
    ]  # fmt: skip
    run_logged(nproc, dump, args, timeout=1200)
    return read_metrics(dump)


def layout_note(name: str, lanes: int, global_batch: int) -> str:
    nproc, (rep, shard, tp) = MESHES[name]
    layout = resolve_layout(lanes, rep * shard, global_batch, MICRO)
    rows = ", ".join(f"{r} rows x {n}" for r, n in layout.rank_rows.items())
    return f"dp {rep * shard}: {rows}; idle {layout.idle_share:.1%}"


def main() -> int:
    a = results_args(__doc__)
    if a.render is not None:
        return render_results(a.render, page)
    ensure_sample_data()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (lanes, g), (ref_name, scratch, resumes) in PLAN.items():
            recipe = recipe_with_lanes(lanes, Path(tmp))
            folder = Path(tmp) / f"lanes{lanes}"
            full = {ref_name: run(ref_name, folder / ref_name, recipe, g)}
            ref = full[ref_name]
            for name in scratch:
                full[name] = run(name, folder / name, recipe, g)
                rows.append(
                    compare(f"{lanes} lanes: {name} (from scratch)", full[name], ref, range(1, 7))
                    | {"layout": layout_note(name, lanes, g)}
                )
                print(rows[-1], flush=True)
            for saved, target in resumes:
                dump = folder / f"{saved}-to-{target}"
                copy_checkpoint(folder / saved, K, dump)
                got = run(target, dump, recipe, g)
                rows.append(
                    compare(f"{lanes} lanes: {saved} -> {target}", got, ref, range(K + 1, 7))
                    | {"layout": layout_note(target, lanes, g)}
                )
                print(rows[-1], flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "uneven_resume.json"
    path.write_text(json.dumps({"loss_rtol": LOSS_RTOL, "rows": rows}, indent=1) + "\n")
    render_results(path, page)
    bad = [r for r in rows if not r["digests_equal"] or r["max_rel_dloss"] > LOSS_RTOL]
    return 1 if bad else 0


def page(doc: dict[str, Any]) -> str:
    """The results table, generated from the raw JSON."""
    lines = [
        f"Debug model, {STEPS} steps, checkpoint at step {K}, micro-batch {MICRO}, CPU "
        "processes (gloo). References: the even run on 4 processes (shard4) with the same "
        "lanes. shardN = FSDP on N processes, dp3xtp2 = data-parallel 3 x tensor-parallel 2, "
        "hsdp3x2 = replicate 3 x shard 2. Generated by `scripts/experiments/uneven_resume.py` from "
        "`uneven_resume.json`.",
        "",
        "| run | layout (real rows per rank x ranks) | steps compared | digests equal "
        "| max relative loss difference |",
        "|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['run']} | {r['layout']} | {r['steps']} | {r['digests_equal']} "
            f"| {r['max_rel_dloss']:.1e} |"
        )
    bad = sum(1 for r in doc["rows"] if not r["digests_equal"])
    lines += ["", f"{len(doc['rows'])} runs; {bad} with a differing digest; loss tolerance "
              f"{doc['loss_rtol']:.0e} relative."]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
