#!/usr/bin/env python
"""Does the final model depend on how many processes trained it?

Trains the Llama 3 debugmodel from scratch for one fixed token budget on each
process count of ``--sizes`` (default 1, 2, 4, 8), once with each loader
(Zephon and the conventional per-rank ``hf`` baseline), with every other
setting equal (seed, global batch, steps, schedule), then evaluates each final
model on the held-out validation recipe with the trainer's own end-of-run
validation, read from the run's ``validation.jsonl`` (the loss at full float64
precision; the log line shows only 4 decimals).

The spread (max - min) of the validation loss over process counts is set
against a measured noise floor: one configuration (Zephon, ``--noise-procs``
processes) repeated with only the micro-batch size changed, which regroups the
fp32 gradient sums but feeds exactly the same data. The model computes in
fp32; the validation loss is summed and reported in float64, so the floor
measures fp32 reduction-order differences, not the precision of the reported
value. The floor keeps the process count fixed, so it does not include the
regrouping of gradient sums across ranks that a different process count also
brings (one process has no cross-rank reduction at all): Zephon's spread is
that arithmetic noise, a small multiple of the floor and orders of magnitude
below hf's, whose batches themselves depend on the process count.

Writes the raw results to ``--results`` (default
``docs/results/gpu_count_sensitivity.json``) and, generated from them, the table
beside it (``.md``), the figure (``_val_loss.png``) and, for the committed
results, the summary between the ``gpu_count_sensitivity`` markers of
``docs/results.md`` (``QUOTED_IN``);
``--render JSON`` regenerates all of it from a JSON without training. The runs'
folders go under ``--out``. Exits 1 if a run fails, or if the Zephon runs did not
all see the same global batches (digests), which is the invariant the
comparison rests on.

    .venv/bin/python scripts/experiments/gpu_count_sensitivity.py                 # defaults
    .venv/bin/python scripts/experiments/gpu_count_sensitivity.py --token-budget 100000 --sizes 1,2 \
        --results outputs/gcs/results.json
    .venv/bin/python scripts/experiments/gpu_count_sensitivity.py --render docs/results/gpu_count_sensitivity.json
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.train import (
    LOADERS,
    REPO,
    RunFailed,
    ensure_sample_data,
    overrides,
    parse_loaders,
    parse_sizes,
    quote_in_page,
    read_metrics,
    read_validation,
    render_results,
    run_logged,
)
from zephon import LayoutError, resolve_layout

CONFIG = REPO / "train_configs" / "llama3_debugmodel.toml"
MOE_CONFIG = REPO / "train_configs" / "moe_debugmodel.toml"
RESULTS = REPO / "docs" / "results" / "gpu_count_sensitivity.json"
MOE_RESULTS = REPO / "docs" / "results" / "gpu_count_sensitivity_moe.json"
BALANCES = ("bias", "global_aux", "micro_batch_aux")
# The documentation page whose `<!-- NAME:begin/end -->` markers quote this script's summary.
QUOTED_IN = "docs/results.md"


@dataclass
class Result:
    loader: str
    nproc: int
    local_batch: int
    val_loss: float
    """The end-of-run validation loss, float64 from `validation.jsonl`."""
    val_step: int
    final_train_loss: float | None
    digests: list[str | None]
    wall_s: float
    dump: Path
    balance: str | None = None
    """The mixture of experts' routing balance (`--moe`), else None."""

    @property
    def key(self) -> str:
        return f"{self.variant}-p{self.nproc}-mb{self.local_batch}"

    @property
    def variant(self) -> str:
        return self.balance or self.loader


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out", type=Path, default=REPO / "outputs" / "gpu_count_sensitivity", help="run folders"
    )
    p.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="raw results JSON; the table (.md) and figure (_val_loss.png) go beside it",
    )
    p.add_argument(
        "--render", type=Path, default=None, help="no runs: regenerate the pages of a results JSON"
    )
    p.add_argument(
        "--sizes",
        type=parse_sizes,
        default=None,
        help="process counts (default 1,2,4,8; --moe 1,2,4)",
    )
    p.add_argument("--loaders", type=parse_loaders, default=list(LOADERS), help="zephon,hf")
    p.add_argument("--steps", type=int, default=24, help="optimizer steps (default 24)")
    p.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="training tokens; sets --steps to budget // (global batch x seq len)",
    )
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=16, help="rows per step, all ranks")
    p.add_argument("--local-batch", type=int, default=2, help="rows per micro-batch")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise-procs", type=int, default=2, help="process count of the noise runs")
    p.add_argument(
        "--noise-local-batches",
        type=parse_sizes,
        default=[1, 4],
        help="other micro-batch sizes to repeat the noise configuration with (default 1,4)",
    )
    p.add_argument(
        "--val-steps", type=int, default=-1, help="validation batches (-1: the whole set)"
    )
    p.add_argument(
        "--recipe", type=Path, default=REPO / "train_configs" / "data" / "sample_mix.toml"
    )
    p.add_argument(
        "--val-recipe", type=Path, default=REPO / "train_configs" / "data" / "sample_val.toml"
    )
    p.add_argument("--timeout", type=int, default=900, help="seconds allowed per run")
    p.add_argument(
        "--moe",
        action="store_true",
        help="the mixture-of-experts debugmodel instead, expert parallelism over every "
        "process, one micro-batch a rank (as usual when the GPU count changes), once per "
        f"--balances; results in {MOE_RESULTS.relative_to(REPO)} unless --results",
    )
    p.add_argument(
        "--balances",
        default=",".join(BALANCES),
        help=f"--moe: routing balances to compare (default {','.join(BALANCES)})",
    )
    p.add_argument(
        "--aux-loss-coef",
        type=float,
        default=None,
        help="--moe: [moe] aux_loss_coef of the load-balance losses (default 0.05: five "
        "times the config's, so that what the balance does shows within the run's 24 steps)",
    )
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = [1, 2, 4] if args.moe else [1, 2, 4, 8]
    if args.moe and args.aux_loss_coef is None:
        args.aux_loss_coef = 0.05
    if args.moe:
        args.balances = [b for b in args.balances.split(",") if b]
        if not args.balances or any(b not in BALANCES for b in args.balances):
            p.error(f"--balances: expected some of {', '.join(BALANCES)}")
        args.loaders = ["zephon"]
        if args.results == RESULTS:
            args.results = MOE_RESULTS
    if args.token_budget is not None:
        args.steps = args.token_budget // (args.global_batch * args.seq_len)
    if args.steps < 1:
        p.error("the token budget must cover at least one step")
    args.noise_local_batches = [b for b in args.noise_local_batches if b != args.local_batch]
    if not args.noise_local_batches:
        p.error("--noise-local-batches needs a size other than --local-batch")
    return args


def check_layout(args: argparse.Namespace) -> None:
    """Refuse combinations the trainer would refuse, before any run."""
    lanes = []
    for recipe in (args.recipe, args.val_recipe):
        with open(recipe, "rb") as f:
            lanes.append(int(tomllib.load(f)["recipe"]["lanes"]))
    g = args.global_batch
    combos = [(n, local_batch_of(args, n)) for n in args.sizes]
    noise = [local_batch_of(args, args.noise_procs), *args.noise_local_batches]
    combos += [(args.noise_procs, b) for b in noise]
    for n, mb in combos:
        try:  # Zephon: the trainer's own planner (any n up to the lanes)
            for lane in lanes:
                resolve_layout(lane, n, g, mb)
        except LayoutError as exc:
            sys.exit(f"error: {n} processes with micro-batch {mb} do not fit: {exc}")
        if g % n or (g // n) % mb:  # the hf baseline splits the global batch evenly
            sys.exit(
                f"error: {n} processes with micro-batch {mb} do not fit the hf baseline: need "
                f"--global-batch ({g}) % n == 0 and (global batch / n) % micro-batch == 0"
            )


def local_batch_of(args: argparse.Namespace, nproc: int) -> int:
    """Rows per micro-batch on `nproc` processes: `--local-batch`; with `--moe`, a rank's
    whole share of the global batch (no accumulation, as a run on more GPUs goes)."""
    return args.global_batch // nproc if args.moe else args.local_batch


def noise_variant(args: argparse.Namespace) -> str:
    """The configuration the noise floor repeats: Zephon, or a layout-free balance."""
    return (
        next((b for b in args.balances if b != "micro_batch_aux"), "bias") if args.moe else "zephon"
    )


def train_args(
    args: argparse.Namespace, loader: str, local_batch: int, nproc: int = 1,
    balance: str | None = None,
) -> list[str]:  # fmt: skip
    moe = {"moe.balance": balance, "parallelism.expert_parallel_degree": nproc} if balance else {}
    if balance and args.aux_loss_coef is not None:
        moe["moe.aux_loss_coef"] = args.aux_loss_coef
    return overrides(
        {
            **moe,
            "job.config_file": MOE_CONFIG if balance else CONFIG,
            "training.seq_len": args.seq_len,
            "training.global_batch_size": args.global_batch,
            "training.local_batch_size": local_batch,
            "training.steps": args.steps,
            "training.seed": args.seed,
            "lr_scheduler.warmup_steps": args.warmup_steps,
            "checkpoint.enable": False,
            "metrics.log_freq": 1,
            "validation.enable": True,
            "validation.recipe": args.val_recipe,
            "validation.freq": 0,
            "validation.steps": args.val_steps,
            "data.log_batch_digests": True,
            "data.loader": loader,
            "data.recipe": args.recipe,
        }
    )


def run_one(
    args: argparse.Namespace,
    loader: str,
    nproc: int,
    local_batch: int,
    runs_dir: Path,
    balance: str | None = None,
) -> Result:
    variant = balance or loader
    dump = runs_dir / f"{variant}-p{nproc}-mb{local_batch}"
    if dump.exists():
        shutil.rmtree(dump)
    dump.mkdir(parents=True)
    print(
        f"[{variant}] {nproc} processes, micro-batch {local_batch}, {args.steps} steps", flush=True
    )
    cli = train_args(args, loader, local_batch, nproc, balance)
    _, wall = run_logged(nproc, dump, cli, args.timeout)
    validations = read_validation(dump)
    if not validations:
        raise RunFailed(
            f"{dump}: no record in validation.jsonl (the trainer logs one at the end of a "
            "run with validation enabled)"
        )
    val_step = max(validations)
    val = validations[val_step]
    records = read_metrics(dump)
    digests = [records.get(s, {}).get("digest") for s in range(1, args.steps + 1)]
    final = records.get(args.steps, {}).get("loss")
    print(f"  validation loss {val:.10f} (step {val_step}) in {wall:.0f}s", flush=True)
    return Result(loader, nproc, local_batch, val, val_step, final, digests, wall, dump, balance)


def spread(values: list[float]) -> float:
    return max(values) - min(values) if values else float("nan")


def settings_line(args: argparse.Namespace) -> str:
    tokens = args.steps * args.global_batch * args.seq_len
    if args.moe:
        coef = args.aux_loss_coef
        if coef is None:
            with open(MOE_CONFIG, "rb") as f:
                coef = tomllib.load(f)["moe"]["aux_loss_coef"]
        return (
            f"MoE debugmodel (8 experts, top 2, one shared) from scratch, CPU/gloo, expert "
            f"parallelism over every process, {args.steps} steps x global batch "
            f"{args.global_batch} x seq {args.seq_len} = {tokens:,} tokens, one micro-batch a "
            f"rank, load-balance loss coefficient {coef:g}, seed {args.seed}, recipe "
            f"{args.recipe.name}; validation on {args.val_recipe.name}"
        )
    return (
        f"Llama 3 debugmodel from scratch, CPU/gloo, {args.steps} steps x global batch "
        f"{args.global_batch} x seq {args.seq_len} = {tokens:,} tokens, micro-batch "
        f"{args.local_batch}, seed {args.seed}, recipe {args.recipe.name}; validation on "
        f"{args.val_recipe.name}"
    )


def results_doc(
    args: argparse.Namespace,
    main_runs: dict[str, dict[int, Result]],
    noise_runs: list[Result],
    wall: float,
) -> dict[str, Any]:
    """The raw results: every run's figures and digests; every page is made from this."""
    every = [r for runs in main_runs.values() for r in runs.values()]
    every += [r for r in noise_runs if all(r is not x for x in every)]
    main_ids = {id(r) for runs in main_runs.values() for r in runs.values()}
    floor_ids = {id(r) for r in noise_runs}
    zephon_seqs = {tuple(r.digests) for r in [*main_runs.get("zephon", {}).values(), *noise_runs]}
    return {
        "settings": settings_line(args),
        "config": {
            "model": "moe/debugmodel" if args.moe else "llama3/debugmodel",
            "sizes": args.sizes,
            "loaders": args.loaders,
            **({"balances": args.balances} if args.moe else {}),
            **({"aux_loss_coef": args.aux_loss_coef} if args.aux_loss_coef is not None else {}),
            "steps": args.steps,
            "tokens": args.steps * args.global_batch * args.seq_len,
            "seq_len": args.seq_len,
            "global_batch": args.global_batch,
            "local_batch": args.local_batch,
            "warmup_steps": args.warmup_steps,
            "seed": args.seed,
            "recipe": args.recipe.name,
            "val_recipe": args.val_recipe.name,
            "val_steps": args.val_steps,
            "noise_procs": args.noise_procs,
            "noise_local_batches": args.noise_local_batches,
        },
        "value_source": "validation.jsonl (float64; the model computes in fp32)",
        "spread": {
            ld: spread([runs[n].val_loss for n in args.sizes]) for ld, runs in main_runs.items()
        },
        "noise_floor": spread([r.val_loss for r in noise_runs]),
        "zephon_same_batches_at_every_size": len(zephon_seqs) == 1
        and None not in next(iter(zephon_seqs)),
        "runs": [
            {
                "loader": r.loader,
                **({"balance": r.balance} if r.balance else {}),
                "nproc": r.nproc,
                "local_batch": r.local_batch,
                # main: one of the process-count runs; noise_floor: one of the runs
                # of the noise-floor configuration (a run can be both).
                "main": id(r) in main_ids,
                "noise_floor": id(r) in floor_ids,
                "val_loss": r.val_loss,
                "val_step": r.val_step,
                "final_train_loss": r.final_train_loss,
                "digests": r.digests,
                "wall_s": round(r.wall_s, 1),
            }
            for r in every
        ],
        "wall_s": round(wall, 1),
    }


def main_table(doc: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """loader -> process count -> its run, for the process-count runs."""
    table: dict[str, dict[int, dict[str, Any]]] = {}
    for r in doc["runs"]:
        if r["main"]:
            table.setdefault(r.get("balance") or r["loader"], {})[r["nproc"]] = r
    return table


def float64_step(values: list[float]) -> float:
    """The spacing of float64 numbers at the largest of `values` (the reported precision)."""
    return math.ulp(max(abs(v) for v in values))


def _fmt(x: float | None, digits: int = 8) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _vs_floor(a: float, floor: float) -> str:
    if floor > 0:
        r = a / floor
        return f"{r:,.1f}x the noise floor" if r < 100 else f"{r:,.0f}x the noise floor"
    return "equal to the noise floor (0)" if a == 0 else "above the noise floor (0)"


def markdown(doc: dict[str, Any]) -> str:
    """The results page (docs/results/gpu_count_sensitivity.md), from the raw results."""
    cfg, floor = doc["config"], doc["noise_floor"]
    sizes, table = cfg["sizes"], main_table(doc)
    axis = "balance" if "balances" in cfg else "loader"
    head = [axis, *[f"{n} proc" for n in sizes], "spread (max - min)", "vs. noise floor"]
    head.append("distinct batch sequences")
    lines = [
        "# Validation loss vs. process count",
        "",
        doc["settings"] + ".",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for loader, runs in table.items():
        vals = [runs[n]["val_loss"] for n in sizes]
        s = spread(vals)
        distinct = len({tuple(runs[n]["digests"]) for n in sizes})
        cells = [loader, *[_fmt(v) for v in vals], f"{s:.2e}", _vs_floor(s, floor)]
        cells.append(f"{distinct} of {len(sizes)}")
        lines.append("| " + " | ".join(cells) + " |")
    noise_desc = ", ".join(
        f"micro-batch {r['local_batch']}: {_fmt(r['val_loss'], 10)}"
        for r in doc["runs"]
        if r["noise_floor"]
    )
    noise_name = _noise_name(doc)
    lines += [
        "",
        f"**Noise floor: {floor:.2e}** = spread of the validation loss over one "
        f"configuration ({noise_name}, {cfg['noise_procs']} processes) repeated with only the "
        f"micro-batch size changed, i.e. the same data with the fp32 sums regrouped "
        f"({noise_desc}). It is measured on the float64 value the trainer reports, so it "
        "is the model's own fp32 reduction-order noise, not a limit of the reading.",
        "",
    ]
    if "zephon" in table and "hf" in table:
        z, h = doc["spread"]["zephon"], doc["spread"]["hf"]
        lines.append(
            f"Zephon: spread {z:.2e}, {_vs_floor(z, floor)}; it feeds the same global "
            f"batches at every process count. hf: spread {h:.2e}, {_vs_floor(h, floor)}; "
            "its batches, and so the trained model, depend on the process count."
        )
        lines.append("")
    lines += _moe_reading(doc)
    step = float64_step([r["val_loss"] for runs in table.values() for r in runs.values()])
    lines.append(
        "Values are the trainer's end-of-run validation loss, read at full precision from "
        f"each run's `validation.jsonl`: float64 (one float64 step at these losses is "
        f"{step:.1e}), summed in float64 over the model's fp32 per-batch losses."
    )
    lines.append(
        "Generated by `scripts/experiments/gpu_count_sensitivity.py` from the raw results in the JSON "
        "beside this page (`--render JSON` regenerates it)."
    )
    return "\n".join(lines) + "\n"


def _noise_name(doc: dict[str, Any]) -> str:
    """The configuration the noise floor repeats, in words."""
    noise_of = next(r.get("balance") or r["loader"] for r in doc["runs"] if r["noise_floor"])
    return "Zephon" if noise_of == "zephon" else f"balance {noise_of}"


def _moe_reading(doc: dict[str, Any]) -> list[str]:
    """The mixture-of-experts runs' reading: layout-free balances against the usual one."""
    spreads, floor = doc["spread"], doc["noise_floor"]
    if "micro_batch_aux" not in spreads:
        return []
    free = {b: v for b, v in spreads.items() if b != "micro_batch_aux"}
    worst = max(free.values()) if free else 0.0
    usual = spreads["micro_batch_aux"]
    ratio = f", {usual / worst:,.0f}x the largest of those" if worst > 0 else ""
    each = "; ".join(f"{b} {v:.2e} ({_vs_floor(v, floor)})" for b, v in free.items())
    return [
        f"Layout-free balances, expert loads counted over the global batch: {each}. "
        f"micro_batch_aux, the load-balance loss per micro-batch: spread {usual:.2e}{ratio}: "
        "the same batches train another model on another number of processes.",
        "",
    ]


def quoted_summary(doc: dict[str, Any]) -> str:
    """The short table and its reading that QUOTED_IN quotes, every figure taken from
    the results."""
    cfg, floor = doc["config"], doc["noise_floor"]
    sizes, table = cfg["sizes"], main_table(doc)
    axis = "balance" if "balances" in cfg else "loader"
    lines = [
        f"| {axis} | " + " | ".join(f"{n} proc" for n in sizes) + " | spread |",
        "| --- | " + " | ".join("---" for _ in sizes) + " | --- |",
    ]
    for loader, runs in table.items():
        vals = [runs[n]["val_loss"] for n in sizes]
        lines.append(
            f"| {loader} | " + " | ".join(_fmt(v) for v in vals) + f" | {spread(vals):.2e} |"
        )
    lines.append("")
    text = (
        f"{doc['settings']}; {doc['wall_s'] / 60:.0f} min of runs on a shared 2-core machine. "
        "The noise floor, "
        f"the same {cfg['noise_procs']}-process {_noise_name(doc)} run with only the "
        "micro-batch size "
        f"changed, is {floor:.1e}; it keeps the process count, so it cannot include the "
        "regrouping of gradient sums across ranks that another process count brings."
    )
    if "zephon" in table:
        z = doc["spread"]["zephon"]
        same = "saw the same global batches (one digest sequence)"
        if not doc["zephon_same_batches_at_every_size"]:
            same = "did NOT all see the same global batches"
        text += f" With Zephon all {len(sizes)} runs {same}; their spread is {z:.1e}"
        multi = [table["zephon"][n]["val_loss"] for n in sizes if n > 1]
        if 1 in sizes and len(multi) > 1:
            text += (
                f" ({spread(multi):.0e} among the runs on more than one process; one process "
                "has no cross-rank reduction at all)"
            )
        text += f", {_vs_floor(z, floor)}."
    if "zephon" in table and "hf" in table:
        z, h = doc["spread"]["zephon"], doc["spread"]["hf"]
        ratio = f", {h / z:,.0f}x Zephon's" if z > 0 else ""
        text += (
            " The conventional loader trains on different batches at every process count: "
            f"its spread is {h:.2e}{ratio}."
        )
    if "balances" in cfg:
        same = (
            "saw the same global batches"
            if doc["zephon_same_batches_at_every_size"]
            else ("did NOT all see the same global batches")
        )
        text += f" Every run {same}. " + " ".join(_moe_reading(doc)).strip()
    return "\n".join(lines) + "\n" + text + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, noise_floor, table = doc["config"], doc["noise_floor"], main_table(doc)
    loaders, sizes = list(table), cfg["sizes"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12.5, 5.2), gridspec_kw={"width_ratios": [2.2, 1]})
    width = 0.8 / len(sizes)
    colors = plt.get_cmap("viridis")([i / max(len(sizes) - 1, 1) * 0.85 for i in range(len(sizes))])
    all_vals = [table[ld][n]["val_loss"] for ld in loaders for n in sizes]
    for j, n in enumerate(sizes):
        xs = [i + (j - (len(sizes) - 1) / 2) * width for i in range(len(loaders))]
        vals = [table[ld][n]["val_loss"] for ld in loaders]
        bars = ax.bar(xs, vals, width * 0.92, color=colors[j], label=f"{n}")
        for b, v in zip(bars, vals, strict=True):
            ax.text(
                b.get_x() + b.get_width() / 2,
                v,
                f"{v:.4f}",
                ha="center",
                va="bottom",
                fontsize=7.5,
                rotation=90,
            )
    lo, hi = min(all_vals), max(all_vals)
    pad = max(hi - lo, 1e-3)
    ax.set_ylim(lo - 0.6 * pad, hi + 0.9 * pad)
    ax.set_xticks(range(len(loaders)))
    moe = "balances" in cfg
    ax.set_xticklabels([ld if moe else f"{ld} loader" for ld in loaders])
    ax.set_ylabel("final validation loss (held-out set)")
    what = "routing balance" if moe else "loader"
    ax.set_xlabel(f"{what} (bars: process count that trained the model)")
    ax.legend(title="processes", fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("validation loss by process count (y axis zoomed)", fontsize=10)

    # Spreads on a log scale, next to the noise floor; a zero is drawn a decade
    # below the smallest nonzero value.
    names = [f"{ld}\nspread" for ld in loaders] + ["noise\nfloor"]
    vals = [doc["spread"][ld] for ld in loaders] + [noise_floor]
    positive = [v for v in vals if v > 0]
    floor_draw = 10 ** (math.floor(math.log10(min(positive))) - 1) if positive else 1e-12
    layout_free = {"zephon", "bias", "global_aux"}
    bar_colors = ["tab:blue" if ld in layout_free else "tab:orange" for ld in loaders] + ["0.5"]
    bars = ax2.bar(names, [max(v, floor_draw) for v in vals], color=bar_colors)
    for b, v in zip(bars, vals, strict=True):
        ax2.text(
            b.get_x() + b.get_width() / 2,
            max(v, floor_draw),
            f"{v:.1e}" if v > 0 else f"0 (drawn at {floor_draw:.0e})",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax2.axhline(max(noise_floor, floor_draw), color="0.4", ls="--", lw=1, label="noise floor")
    ax2.legend(fontsize=7.5, loc="upper right")
    ax2.set_yscale("log")
    ax2.set_ylim(floor_draw / 2, max(max(vals), floor_draw) * 20)
    ax2.set_ylabel("max - min of validation loss over process counts")
    ax2.set_xlabel(f"noise floor: {cfg['noise_procs']} proc., other micro-batch size")
    ax2.set_title("spread vs. fp32 reduction-order noise (log)", fontsize=10)
    ax2.grid(axis="y", alpha=0.3)

    sizes_txt = ", ".join(str(n) for n in sizes)
    fig.suptitle(
        f"Final validation loss vs. process count ({sizes_txt}): {cfg['model']} from "
        f"scratch, {cfg['tokens']:,} tokens\n({cfg['steps']} steps x global batch "
        f"{cfg['global_batch']} x seq {cfg['seq_len']}, "
        f"{'one micro-batch a rank' if moe else 'micro-batch ' + str(cfg['local_batch'])}, "
        f"seed {cfg['seed']}, same settings for every run; CPU/gloo)",
        fontsize=10.5,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def publish(path: Path) -> int:
    """Every page of a results JSON: the table beside it, the figure, and for the
    committed results the summary in QUOTED_IN. Exit status 2 if the JSON is unreadable."""
    code = render_results(path, markdown)
    if code:
        return code
    doc = json.loads(path.read_text())
    plot(doc, path.with_name(path.stem + "_val_loss.png"))
    for committed in (RESULTS, MOE_RESULTS):
        if path.resolve() == committed.resolve():
            quote_in_page(QUOTED_IN, committed.stem, quoted_summary(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        return publish(args.render)
    args.recipe, args.val_recipe = args.recipe.resolve(), args.val_recipe.resolve()
    args.out, args.results = args.out.resolve(), args.results.resolve()
    check_layout(args)
    ensure_sample_data()
    runs_dir = args.out / "runs"
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    main_runs: dict[str, dict[int, Result]] = {}
    noise_runs: list[Result] = []
    try:
        variants = [(b, "zephon", b) for b in args.balances] if args.moe else [
            (ld, ld, None) for ld in args.loaders
        ]  # fmt: skip
        for name, loader, balance in variants:
            main_runs[name] = {
                n: run_one(args, loader, n, local_batch_of(args, n), runs_dir, balance)
                for n in args.sizes
            }
        noise = noise_variant(args)
        balance = noise if args.moe else None
        base = main_runs.get(noise, {}).get(args.noise_procs)
        if base is None:
            lb = local_batch_of(args, args.noise_procs)
            base = run_one(args, "zephon", args.noise_procs, lb, runs_dir, balance)
        noise_runs = [base] + [
            run_one(args, "zephon", args.noise_procs, b, runs_dir, balance)
            for b in args.noise_local_batches
        ]
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    doc = results_doc(args, main_runs, noise_runs, time.perf_counter() - t0)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(doc, indent=1) + "\n")
    print()
    publish(args.results)
    print(f"wrote {args.results} and the pages beside it ({doc['wall_s']:.0f}s of runs)")
    if "zephon" in main_runs and not doc["zephon_same_batches_at_every_size"]:
        print("FAIL: the Zephon runs did not all see the same global batches", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
