#!/usr/bin/env python
"""The headline, reproduced: resume a checkpoint on other process counts and
compare every global batch with the run that never moved.

For each loader (Zephon, and the conventional per-rank ``hf`` baseline):

1. a reference run of the model of ``--config`` (default: the Llama 3
   debugmodel) on ``--ref-procs`` processes for ``--steps`` steps,
   checkpointing at step ``--ckpt-step`` (k);
2. for every size in ``--resume-sizes``: the step-k checkpoint copied into a
   fresh dump folder and resumed there on that many processes (the hf loader
   with ``--data.hf_resume skip``, its only way to continue at another size);
3. the per-step global-batch digests and losses after k compared with the
   reference.

Prints a table, writes ``loss_curves.png``, ``results.json`` (raw) and
``results.md`` (the table docs/results.md shows, generated from the JSON) into ``--out``
and exits 1 if any Zephon resume logged a different global batch than the
reference at any step after k (2 for unusable arguments). Runs go one at a
time on CPU (gloo, ``OMP_NUM_THREADS=1`` per process).

    .venv/bin/python scripts/experiments/elastic_resume_demo.py            # defaults
    .venv/bin/python scripts/experiments/elastic_resume_demo.py --steps 4 --ckpt-step 2 \\
        --ref-procs 2 --resume-sizes 1,4 --seq-len 32 --global-batch 16
    .venv/bin/python scripts/experiments/elastic_resume_demo.py --render docs/results/elastic_resume.json

The vision-language model on the sample image-text recipe (images in every
digest; the hf baseline reads no images):

    .venv/bin/python scripts/experiments/elastic_resume_demo.py --config train_configs/vlm_debugmodel.toml \\
        --recipe train_configs/data/sample_vlm.toml --loaders zephon --out outputs/elastic_demo_vlm
"""

from __future__ import annotations

import argparse
import json
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
    copy_checkpoint,
    ensure_sample_data,
    overrides,
    parse_loaders,
    parse_sizes,
    quote_in_page,
    read_metrics,
    render_results,
    run_logged,
)
from zephon import LayoutError, resolve_layout

CONFIG = REPO / "train_configs" / "llama3_debugmodel.toml"
MODEL_NAMES = {"llama3": "Llama 3", "vlm": "VLM"}
# The documentation page whose `<!-- elastic_resume:begin/end -->` markers quote the table.
QUOTED_IN = "docs/results.md"


@dataclass
class Run:
    """One finished training run and what it logged."""

    loader: str
    role: str  # "reference" or "resume"
    nproc: int
    dump: Path
    wall_s: float
    steps: dict[int, dict[str, Any]]  # step -> {"loss", "grad_norm", "digest"}


@dataclass
class Row:
    """One resume compared with its loader's reference, steps k+1..S."""

    loader: str
    nproc: int
    compared: int
    matched: int
    first_diff: int | None
    max_abs_dloss: float

    @property
    def all_match(self) -> bool:
        return self.compared > 0 and self.matched == self.compared


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "elastic_demo")
    p.add_argument("--config", type=Path, default=CONFIG, help="job config (the model)")
    p.add_argument("--steps", type=int, default=12, help="training steps S (default 12)")
    p.add_argument("--ckpt-step", type=int, default=6, help="checkpoint step k (default 6)")
    p.add_argument("--ref-procs", type=int, default=4, help="reference process count P")
    p.add_argument("--resume-sizes", type=parse_sizes, default=[1, 2, 8], help="e.g. 1,2,8")
    p.add_argument(
        "--hf-resume-sizes",
        type=parse_sizes,
        default=None,
        help="resume sizes for the hf loader (default: --resume-sizes)",
    )
    p.add_argument("--loaders", type=parse_loaders, default=list(LOADERS), help="zephon,hf")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=32, help="rows per step, all ranks")
    p.add_argument("--local-batch", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--recipe", type=Path, default=REPO / "train_configs" / "data" / "sample_mix.toml"
    )
    p.add_argument("--timeout", type=int, default=900, help="seconds allowed per run")
    p.add_argument(
        "--keep-checkpoints", action="store_true", help="keep the runs' checkpoint folders"
    )
    p.add_argument(
        "--render",
        type=Path,
        default=None,
        help="no runs: print the markdown table of a results.json and write it beside (.md)",
    )
    return p.parse_args(argv)


def markdown_table(results: dict[str, Any]) -> str:
    """The table of the results page, from the raw results (never assembled by hand)."""
    lines = [
        "| loader | resume size | steps after k with the reference digest "
        "| first differing step | max abs loss difference |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results["rows"]:
        first = r["first_differing_step"]
        lines.append(
            f"| {r['loader']} | {r['resume_size']} | {r['digests_equal']}/{r['steps_compared']} "
            f"| {'-' if first is None else first} | {r['max_abs_loss_diff']:.1e} |"
        )
    return "\n".join(lines)


def render(path: Path) -> int:
    """The page beside a results JSON and, for the committed one, the table in QUOTED_IN."""
    code = render_results(
        path, lambda results: f"{results['title']}\n\n{markdown_table(results)}\n"
    )
    if code == 0 and path.resolve() == (REPO / "docs" / "results" / "elastic_resume.json"):
        quote_in_page(QUOTED_IN, "elastic_resume", quoted(json.loads(path.read_text())))
    return code


def quoted(results: dict[str, Any]) -> str:
    """The table QUOTED_IN quotes."""
    return markdown_table(results) + "\n"


def check_layout(args: argparse.Namespace) -> None:
    """Refuse sizes the trainer would refuse, before spending minutes on runs."""
    if not 1 <= args.ckpt_step < args.steps:
        sys.exit(f"error: need 1 <= --ckpt-step ({args.ckpt_step}) < --steps ({args.steps})")
    with open(args.recipe, "rb") as f:
        lanes = int(tomllib.load(f)["recipe"]["lanes"])
    g, mb = args.global_batch, args.local_batch
    for n in sorted({args.ref_procs, *args.resume_sizes}):
        try:  # Zephon: the trainer's own planner (any n up to the lanes)
            resolve_layout(lanes, n, g, mb)
        except LayoutError as exc:
            sys.exit(f"error: {n} processes do not fit: {exc}")
    for n in sorted({args.ref_procs, *args.hf_resume_sizes}):
        if g % n or (g // n) % mb:  # the hf baseline splits the global batch evenly
            sys.exit(
                f"error: {n} processes do not fit the hf baseline: need --global-batch ({g}) "
                f"% n == 0 and (global batch / n) % --local-batch ({mb}) == 0"
            )


def sizes_for(args: argparse.Namespace, loader: str) -> list[int]:
    return args.hf_resume_sizes if loader == "hf" else args.resume_sizes


def train_args(args: argparse.Namespace, loader: str) -> list[str]:
    """Everything but the process count: identical for a reference and its resumes."""
    fields = {
        "job.config_file": args.config,
        "training.seq_len": args.seq_len,
        "training.global_batch_size": args.global_batch,
        "training.local_batch_size": args.local_batch,
        "training.steps": args.steps,
        "training.seed": args.seed,
        "lr_scheduler.warmup_steps": args.warmup_steps,
        "checkpoint.enable": True,
        "checkpoint.interval": args.ckpt_step,
        "checkpoint.load_step": -1,
        "metrics.log_freq": 1,
        "data.log_batch_digests": True,
        "data.loader": loader,
        "data.recipe": args.recipe,
    }
    if loader == "hf":
        fields["data.hf_resume"] = "skip"
    return overrides(fields)


def logged_steps(dump: Path) -> dict[int, dict[str, Any]]:
    """step -> {"loss", "grad_norm", "digest"} from the run's metrics.jsonl."""
    keep = ("loss", "grad_norm", "digest")
    return {s: {k: r.get(k) for k in keep} for s, r in read_metrics(dump).items()}


def fresh(dump: Path) -> Path:
    if dump.exists():
        shutil.rmtree(dump)
    dump.mkdir(parents=True)
    return dump


def run_reference(args: argparse.Namespace, loader: str, runs_dir: Path) -> Run:
    dump = fresh(runs_dir / loader / f"reference-p{args.ref_procs}")
    print(f"[{loader}] reference: {args.ref_procs} processes, steps 1..{args.steps}", flush=True)
    _, wall = run_logged(args.ref_procs, dump, train_args(args, loader), args.timeout)
    steps = logged_steps(dump)
    if sorted(steps) != list(range(1, args.steps + 1)):
        raise RunFailed(f"{dump}: logged steps {sorted(steps)}, expected 1..{args.steps}")
    ckpt = dump / "checkpoint" / f"step-{args.ckpt_step}"
    if not (ckpt / "COMPLETE.json").is_file():
        raise RunFailed(f"{ckpt}: no complete checkpoint")
    print(f"[{loader}]   done in {wall:.0f}s", flush=True)
    return Run(loader, "reference", args.ref_procs, dump, wall, steps)


def run_resume(args: argparse.Namespace, ref: Run, nproc: int, runs_dir: Path) -> Run:
    dump = fresh(runs_dir / ref.loader / f"resume-p{nproc}")
    k = args.ckpt_step
    copy_checkpoint(ref.dump, k, dump)
    print(f"[{ref.loader}] resume step-{k} on {nproc} processes", flush=True)
    stdout, wall = run_logged(nproc, dump, train_args(args, ref.loader), args.timeout)
    expected = f"resumed from step {k} on {nproc} data-parallel rank(s)"
    if expected not in stdout:
        raise RunFailed(f"{dump}: the trainer did not report '{expected}'")
    steps = logged_steps(dump)
    print(f"[{ref.loader}]   done in {wall:.0f}s", flush=True)
    return Run(ref.loader, "resume", nproc, dump, wall, steps)


def compare(ref: Run, run: Run, k: int, total: int) -> Row:
    matched, first_diff, max_d = 0, None, 0.0
    for step in range(k + 1, total + 1):
        got, want = run.steps.get(step), ref.steps[step]
        same = got is not None and got["digest"] is not None and got["digest"] == want["digest"]
        matched += same
        if not same and first_diff is None:
            first_diff = step
        if got is not None and got["loss"] is not None and want["loss"] is not None:
            max_d = max(max_d, abs(got["loss"] - want["loss"]))
        else:
            max_d = float("inf")
    return Row(run.loader, run.nproc, total - k, matched, first_diff, max_d)


def format_table(rows: list[Row]) -> str:
    head = ("loader", "resume size", "digests = ref after k", "first differing step", "max |dloss|")
    body = [
        (
            r.loader,
            str(r.nproc),
            f"{r.matched}/{r.compared}",
            "-" if r.first_diff is None else str(r.first_diff),
            f"{r.max_abs_dloss:.3e}",
        )
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in body]
    return "\n".join(lines)


def portable(path: Path, base: Path) -> str:
    """`path` relative to `base` when it lies inside it (results JSON is committed)."""
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def model_of(config: Path) -> tuple[str, str]:
    """(model name, flavor) of a job config."""
    with open(config, "rb") as f:
        model = tomllib.load(f)["model"]
    return model["name"], model["flavor"]


def title(args: argparse.Namespace) -> str:
    sizes = ", ".join(str(n) for n in args.resume_sizes)
    if "hf" in args.loaders and args.hf_resume_sizes != args.resume_sizes:
        sizes += " (hf: " + ", ".join(str(n) for n in args.hf_resume_sizes) + ")"
    name, flavor = model_of(getattr(args, "config", CONFIG))
    model = f"{MODEL_NAMES.get(name, name)} {flavor}"
    return (
        f"Elastic resume: {model} trained on P={args.ref_procs} processes, "
        f"checkpoint at step k={args.ckpt_step}, resumed on {sizes} processes\n"
        f"(CPU/gloo, {args.steps} steps, global batch {args.global_batch} x {args.seq_len} "
        f"tokens, recipe {args.recipe.name}, seed {args.seed})"
    )


def plot(
    args: argparse.Namespace,
    refs: dict[str, Run],
    resumes: dict[str, list[Run]],
    rows: list[Row],
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    loaders = list(refs)
    k, total = args.ckpt_step, args.steps
    fig, axes = plt.subplots(
        2,
        len(loaders),
        figsize=(max(6.2 * len(loaders), 10.4), 7.6),  # room for the title
        squeeze=False,
        sharex=True,
        gridspec_kw={"height_ratios": [3, 2]},
    )
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    by_key = {(r.loader, r.nproc): r for r in rows}
    label = {"zephon": "Zephon loader", "hf": "hf loader (per-rank baseline, hf_resume=skip)"}
    bottom_axes = []
    for col, loader in enumerate(loaders):
        ref = refs[loader]
        top, bottom = axes[0][col], axes[1][col]
        ref_steps = sorted(ref.steps)
        top.plot(
            ref_steps,
            [ref.steps[s]["loss"] for s in ref_steps],
            color="0.35",
            lw=5,
            alpha=0.35,
            label=f"reference, {ref.nproc} processes",
        )
        bottom.axhline(0.0, color="0.35", lw=5, alpha=0.35)
        for i, run in enumerate(resumes[loader]):
            row = by_key[(loader, run.nproc)]
            steps = [s for s in sorted(run.steps) if s > k and run.steps[s]["loss"] is not None]
            lab = (
                f"resumed on {run.nproc}: digests {row.matched}/{row.compared} equal, "
                f"max |dloss| {row.max_abs_dloss:.1e}"
            )
            kw = {"marker": markers[i % len(markers)], "ms": 5, "lw": 1.3, "ls": "--"}
            top.plot(steps, [run.steps[s]["loss"] for s in steps], label=lab, **kw)
            deltas = [run.steps[s]["loss"] - ref.steps[s]["loss"] for s in steps]
            bottom.plot(steps, deltas, **kw)
        for ax in (top, bottom):
            ax.axvline(k, color="crimson", lw=1.2, ls=":")
            ax.grid(alpha=0.3)
        top.text(
            k,
            0.98,
            f" checkpoint (step {k})",
            color="crimson",
            va="top",
            transform=top.get_xaxis_transform(),
            fontsize=8,
        )
        top.set_title(label.get(loader, loader), fontsize=11)
        top.set_ylabel("training loss")
        top.legend(fontsize=7.5, loc="lower left")
        bottom.set_ylabel("loss - reference loss")
        bottom.set_xlabel("step")
        bottom.set_xlim(0.5, total + 0.5)
        bottom_axes.append(bottom)
    # One scale for the differences, so a flat Zephon panel is comparable with hf.
    lo = min(a.get_ylim()[0] for a in bottom_axes)
    hi = max(a.get_ylim()[1] for a in bottom_axes)
    for a in bottom_axes:
        a.set_ylim(lo, hi)
    for a in axes[0]:
        a.tick_params(labelbottom=True)
        a.set_xlabel("step")
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title(args), fontsize=10.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        return render(args.render)
    if args.hf_resume_sizes is None:
        args.hf_resume_sizes = args.resume_sizes
    args.recipe = args.recipe.resolve()
    args.config = args.config.resolve()
    args.out = args.out.resolve()
    check_layout(args)
    ensure_sample_data()
    runs_dir = args.out / "runs"
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    refs: dict[str, Run] = {}
    resumes: dict[str, list[Run]] = {}
    rows: list[Row] = []
    try:
        for loader in args.loaders:
            refs[loader] = ref = run_reference(args, loader, runs_dir)
            resumes[loader] = []
            for n in sizes_for(args, loader):
                run = run_resume(args, ref, n, runs_dir)
                resumes[loader].append(run)
                rows.append(compare(ref, run, args.ckpt_step, args.steps))
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep_checkpoints:
            for path in runs_dir.glob("*/*/checkpoint"):
                shutil.rmtree(path, ignore_errors=True)
    wall = time.perf_counter() - t_start

    table = format_table(rows)
    print()
    print(title(args))
    print(table)
    plot(args, refs, resumes, rows, args.out / "loss_curves.png")
    zephon_ok = all(r.all_match for r in rows if r.loader == "zephon")
    results = {
        "title": title(args),
        "config": {
            "model": "/".join(model_of(args.config)),
            "job_config": portable(args.config, REPO),
            "steps": args.steps,
            "ckpt_step": args.ckpt_step,
            "ref_procs": args.ref_procs,
            "resume_sizes": args.resume_sizes,
            "hf_resume_sizes": args.hf_resume_sizes,
            "seq_len": args.seq_len,
            "global_batch": args.global_batch,
            "local_batch": args.local_batch,
            "warmup_steps": args.warmup_steps,
            "seed": args.seed,
            "recipe": portable(args.recipe, REPO),
            "loaders": args.loaders,
        },
        "rows": [
            {
                "loader": r.loader,
                "resume_size": r.nproc,
                "steps_compared": r.compared,
                "digests_equal": r.matched,
                "all_match": r.all_match,
                "first_differing_step": r.first_diff,
                "max_abs_loss_diff": r.max_abs_dloss,
            }
            for r in rows
        ],
        "runs": [
            {
                "loader": run.loader,
                "role": run.role,
                "nproc": run.nproc,
                "wall_s": round(run.wall_s, 2),
                "dump": portable(run.dump, args.out),
                "steps": [{"step": s, **run.steps[s]} for s in sorted(run.steps)],
            }
            for loader in refs
            for run in [refs[loader], *resumes[loader]]
        ],
        "zephon_all_match": zephon_ok,
        "wall_s": round(wall, 1),
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "results.md").write_text(f"{results['title']}\n\n{markdown_table(results)}\n")
    print(
        f"\nwrote {args.out / 'loss_curves.png'} and {args.out / 'results.json'} "
        f"({wall:.0f}s of runs)"
    )
    if "zephon" in refs and not zephon_ok:
        print(
            "FAIL: a Zephon resume saw a different global batch than the reference", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
