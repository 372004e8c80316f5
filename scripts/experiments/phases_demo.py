#!/usr/bin/env python
"""Data phases end to end: one recipe with a ramp, a main phase and an anneal; a
second anneal mix branched from the boundary checkpoint; every branch resumed at
other process counts.

Debug model on the sample data (`train_configs/data/sample_phases.toml`), CPU
processes (gloo), micro-batches of 512 tokens (8 rows of 64, then 4 of 128),
the LR decay spanning the anneal (`lr_scheduler.decay_phase`):

- `A`: the recipe as committed (anneal mix A), 2 processes, steps 1-60;
- `B`: the same recipe with another anneal mix (B), 2 processes, from scratch:
  its digests before the anneal boundary (step 40) must equal A's, after it
  they differ;
- `A@40 -> 1 proc`: A's step-40 boundary checkpoint resumed on 1 process;
- `B from A@40 -> 4 procs`: branch B started from A's boundary checkpoint on 4
  processes (the anneal phase was edited after that checkpoint: accepted);
- `A@50 -> 3 procs` and `B@50 -> 1 proc`: mid-anneal checkpoints resumed.

Every resumed or branched run must log its branch's uninterrupted digests at
every step, and losses within 1e-5 (relative). Writes
docs/results/phases_demo.json (raw), .md (generated from it), _curves.png (loss
per branch, realised mixture against the schedule per branch) and the summary
between the `phases_demo` markers of docs/phases.md (QUOTED_IN); `--render JSON` regenerates them
without training. Exits 1 if a digest or loss check fails.

    .venv/bin/python scripts/experiments/phases_demo.py [--out docs/results]
    .venv/bin/python scripts/experiments/phases_demo.py --render docs/results/phases_demo.json
"""

from __future__ import annotations

import argparse
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
    quote_in_page,
    read_metrics,
    read_validation,
    render_results,
    run_logged,
)

RECIPE = REPO / "train_configs" / "data" / "sample_phases.toml"
RESULTS = REPO / "docs" / "results" / "phases_demo.json"
# The documentation page whose `<!-- NAME:begin/end -->` markers quote this script's summary.
QUOTED_IN = "docs/phases.md"
STEPS, BOUNDARY, MID, LOSS_RTOL = 60, 40, 50, 1e-5
MIX_A = "{ prose = 0.3, code = 0.2, curated = 0.5 }"
MIX_B = "{ prose = 0.2, code = 0.6, curated = 0.2 }"
# name -> (branch, processes, (run and step it starts from) or None)
RUNS: dict[str, tuple[str, int, tuple[str, int] | None]] = {
    "A": ("A", 2, None),
    "B": ("B", 2, None),
    "A@40 -> 1 proc": ("A", 1, ("A", BOUNDARY)),
    "B from A@40 -> 4 procs": ("B", 4, ("A", BOUNDARY)),
    "A@50 -> 3 procs": ("A", 3, ("A", MID)),
    "B@50 -> 1 proc": ("B", 1, ("B from A@40 -> 4 procs", MID)),
}


def recipe_for(branch: str, folder: Path) -> Path:
    """The committed recipe (mix A), or a copy whose anneal has mix B; absolute paths."""
    text = RECIPE.read_text().replace("../../data/sample", str(REPO / "data" / "sample"))
    if branch == "B":
        assert MIX_A in text, f"{RECIPE}: the anneal weights are not mix A"
        text = text.replace(MIX_A, MIX_B)
    path = folder / f"sample_phases_{branch}.toml"
    path.write_text(text)
    return path


def train(nproc: int, dump: Path, recipe: Path) -> None:
    args = [
        "--job.config_file", str(REPO / "train_configs" / "llama3_debugmodel.toml"),
        "--data.recipe", str(recipe), "--training.seq_len", "64",
        "--training.global_batch_size", "8", "--training.local_batch_tokens", "512",
        "--training.steps", str(STEPS), "--checkpoint.interval", "10",
        "--lr_scheduler.warmup_steps", "5", "--lr_scheduler.decay_phase", "anneal",
        "--data.log_batch_digests", "true", "--validation.enable", "true",
        "--validation.recipe", str(REPO / "train_configs" / "data" / "sample_val.toml"),
        "--validation.steps", "4",
    ]  # fmt: skip
    run_logged(nproc, dump, args, timeout=3600)


def phase_mixture(records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per phase: its steps, scheduled shares and realised shares over the phase."""
    out: dict[str, Any] = {}
    for step in sorted(records):
        r = records[step]
        entry = out.setdefault(r["phase"], {"first": step, "scheduled": r["scheduled_shares"]})
        entry["last"], entry["realised"] = step, r["phase_shares"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS.parent)
    p.add_argument("--render", type=Path, default=None, help="no runs: results JSON -> pages")
    a = p.parse_args()
    if a.render is not None:
        return publish(a.render)
    ensure_sample_data()
    got: dict[str, dict[int, dict[str, Any]]] = {}
    val: dict[str, float] = {}
    dumps: dict[str, Path] = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        recipes = {b: recipe_for(b, folder) for b in ("A", "B")}
        for name, (branch, nproc, start) in RUNS.items():
            dump = folder / name.replace(" ", "_").replace(">", "").replace("@", "_at_")
            if start is not None:
                copy_checkpoint(dumps[start[0]], start[1], dump)
            train(nproc, dump, recipes[branch])
            dumps[name] = dump
            got[name] = read_metrics(dump)
            val[name] = read_validation(dump)[STEPS]
            first = 1 if start is None else start[1] + 1
            row = {"run": name, "branch": branch, "processes": nproc,
                   "start": "scratch" if start is None else f"{start[0]} step {start[1]}",
                   "first_step": first, "val_loss": val[name],
                   "final_loss": got[name][STEPS]["loss"]}  # fmt: skip
            if start is not None:
                row |= compare(name, got[name], got[branch], range(first, STEPS + 1))
            rows.append(row)
            print(row, flush=True)
    a_run, b_run = got["A"], got["B"]
    before = all(a_run[s]["digest"] == b_run[s]["digest"] for s in range(1, BOUNDARY + 1))
    after = sum(a_run[s]["digest"] != b_run[s]["digest"] for s in range(BOUNDARY + 1, STEPS + 1))
    doc = {
        "title": "Data phases: a ramp, a main phase and two anneal mixes branched from the "
        f"step-{BOUNDARY} boundary checkpoint",
        "config": {"steps": STEPS, "boundary": BOUNDARY, "mid": MID, "mix_a": MIX_A,
                   "mix_b": MIX_B, "loss_rtol": LOSS_RTOL,
                   "recipe": str(RECIPE.relative_to(REPO)), "local_batch_tokens": 512},
        "rows": rows,
        "prefix": {"steps": BOUNDARY, "digests_equal": before, "after_differ": after,
                   "after": STEPS - BOUNDARY},
        "mixture": {b: phase_mixture(got[b]) for b in ("A", "B")},
        "curves": {b: {str(s): got[b][s]["loss"] for s in sorted(got[b])} for b in ("A", "B")},
        "shares": {b: {str(s): [got[b][s]["phase"], got[b][s]["scheduled_shares"],
                                got[b][s]["phase_shares"]] for s in sorted(got[b])}
                   for b in ("A", "B")},
    }  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / RESULTS.name
    path.write_text(json.dumps(doc, indent=1) + "\n")
    publish(path)
    bad = [r for r in rows if "digests_equal" in r and not r["digests_equal"]]
    bad += [r for r in rows if r.get("max_rel_dloss", 0.0) > LOSS_RTOL]
    return 1 if bad or not before or after != STEPS - BOUNDARY else 0


def _mix(shares: dict[str, float]) -> str:
    return " / ".join(f"{v:.2f}" for v in shares.values())


def table(doc: dict[str, Any]) -> str:
    """The runs table and the mixture per phase (QUOTED_IN quotes these)."""
    cfg, prefix = doc["config"], doc["prefix"]
    lines = [
        "| run | processes | starts from | steps | digests equal to its branch "
        "| max relative loss difference | validation loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        same = "reference" if "digests_equal" not in r else str(r["digests_equal"])
        diff = "" if "max_rel_dloss" not in r else f"{r['max_rel_dloss']:.1e}"
        lines.append(
            f"| {r['run']} | {r['processes']} | {r['start']} | {r['first_step']}-{cfg['steps']} "
            f"| {same} | {diff} | {r['val_loss']:.4f} |"
        )
    names = list(next(iter(doc["mixture"]["A"].values()))["scheduled"])
    lines += [
        "",
        f"Digests of A and B at steps 1-{prefix['steps']} equal: {prefix['digests_equal']}; "
        f"after the boundary {prefix['after_differ']} of {prefix['after']} differ.",
        "",
        f"| branch | phase | steps | scheduled ({' / '.join(names)}) | realised over the phase |",
        "|---|---|---|---|---|",
    ]
    for branch, phases in doc["mixture"].items():
        for phase, m in phases.items():
            lines.append(
                f"| {branch} | {phase} | {m['first']}-{m['last']} | {_mix(m['scheduled'])} "
                f"| {_mix(m['realised'])} |"
            )
    return "\n".join(lines) + "\n"


def page(doc: dict[str, Any]) -> str:
    """The results page (docs/results/phases_demo.md), generated from the raw JSON."""
    cfg = doc["config"]
    head = (
        f"Debug model, `{cfg['recipe']}`, {cfg['steps']} steps on CPU processes (gloo), "
        f"micro-batches of {cfg['local_batch_tokens']} tokens, LR decay over the anneal. "
        f"Anneal mix A {cfg['mix_a']}, mix B {cfg['mix_b']} (prose / code / curated). "
        f"Resumed and branched runs are compared with their branch's uninterrupted run "
        f"(loss tolerance {cfg['loss_rtol']:.0e} relative). Generated by "
        "`scripts/experiments/phases_demo.py` from `phases_demo.json`; figure: `phases_demo_curves.png`."
    )
    return f"# {doc['title']}\n\n{head}\n\n{table(doc)}"


def plot(doc: dict[str, Any], path: Path) -> None:
    """Loss per branch; each branch's realised mixture over the phase so far
    (solid) against the schedule (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = doc["config"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for branch, curve in doc["curves"].items():
        steps = [int(s) for s in curve]
        axes[0].plot(steps, list(curve.values()), label=f"branch {branch}")
    for r in doc["rows"]:
        if r["start"] != "scratch":
            curve = doc["curves"][r["branch"]]
            steps = range(r["first_step"], cfg["steps"] + 1)
            axes[0].plot(steps, [curve[str(s)] for s in steps], ls="none", marker=".",
                         ms=3, color="k" if r["branch"] == "A" else "grey")  # fmt: skip
    axes[0].axvline(cfg["boundary"] + 0.5, color="grey", lw=0.8)
    axes[0].set(xlabel="step", ylabel="training loss", title="loss (dots: resumed runs' steps)")
    axes[0].legend()
    for ax, (branch, shares) in zip(axes[1:], doc["shares"].items(), strict=True):
        steps = [int(s) for s in shares]
        names = list(next(iter(shares.values()))[1])
        for k, name in enumerate(names):
            ax.step(steps, [v[1][name] for v in shares.values()], where="mid", ls="--",
                    color=f"C{k}")  # fmt: skip
            ax.plot(steps, [v[2][name] for v in shares.values()], color=f"C{k}", label=name)
        for s, prev in zip(steps[1:], steps, strict=False):
            if shares[str(s)][0] != shares[str(prev)][0]:
                ax.axvline(s - 0.5, color="grey", lw=0.8)
        ax.set(xlabel="step", ylabel="token share", ylim=(0, 1),
               title=f"branch {branch}: realised over the phase (dashed: schedule)")  # fmt: skip
        ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def publish(path: Path) -> int:
    """The page and figure beside a results JSON, and for the committed results
    the summary in QUOTED_IN. Exit status 2 if the JSON is unreadable."""
    code = render_results(path, page)
    if code:
        return code
    doc = json.loads(path.read_text())
    plot(doc, path.with_name(path.stem + "_curves.png"))
    if path.resolve() == RESULTS.resolve():
        quote_in_page(QUOTED_IN, "phases_demo", table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
