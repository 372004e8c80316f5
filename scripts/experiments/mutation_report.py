"""Mutation testing of the modules that carry the invariants, and its page.

Drives mutmut (pinned in requirements-mutation.txt, configured in
pyproject.toml `[tool.mutmut]`) one module at a time over the fast in-process
unit tests, then writes docs/results/mutation.json (the raw results) and
docs/results/mutation.md (the page): per module the score, killed / (killed +
survived), the counts and the wall time; and every surviving mutant with the
reason it cannot change any observable behaviour, read from the reviewed file
docs/results/mutation_equivalent.toml. A survivor without a reason there (or
whose reason was written for another change) is listed as unexplained and the
script exits 1: kill it with a test, or explain it.

    pip install -r requirements-mutation.txt
    python scripts/experiments/mutation_report.py --fresh        # every module (about 30 min on 2 cores)
    python scripts/experiments/mutation_report.py layout mixing  # these; the others keep their last results
    python scripts/experiments/mutation_report.py --again        # only the mutants not killed last time
    python scripts/experiments/mutation_report.py --page-only    # the page again, from mutation.json

Not run in CI (too slow). mutmut works in mutants/ (ignored by git) and keeps
its stats there between runs; --fresh starts from an empty one.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.train import quote_in_page

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
JSON_PATH = RESULTS / "mutation.json"
PAGE_PATH = RESULTS / "mutation.md"
EQUIVALENT_PATH = RESULTS / "mutation_equivalent.toml"
MUTANTS = REPO / "mutants"
MAX_CHILDREN = 2  # the machine's two cores, shared
TARGET_SCORE = 0.90
# The documentation page whose `<!-- mutation:begin/end -->` markers quote the summary.
QUOTED_IN = "docs/results.md"

# Label -> (file, which of its mutants count: a glob over mutmut's mutant names).
MODULES: dict[str, tuple[str, str]] = {
    "layout": ("zephon/recipe/layout.py", "zephon.recipe.layout.*"),
    "phases": ("zephon/recipe/phases.py", "zephon.recipe.phases.*"),
    "boundary": ("zephon/streams/segment_boundary.py", "zephon.streams.segment_boundary.*"),
    "deal": ("zephon/state/lane_count_deal.py", "zephon.state.lane_count_deal.*"),
    "packing": ("zephon/lanes/packing.py", "zephon.lanes.packing.*"),
    "shuffle": ("zephon/lanes/shuffle.py", "zephon.lanes.shuffle.*"),
    "mixing": ("zephon/lanes/mixing.py", "zephon.lanes.mixing.*"),
    "state": ("zephon/state/checkpoint_state.py", "zephon.state.checkpoint_state.*"),
    "flush_log": ("zephon/state/flush_log.py", "zephon.state.flush_log.*"),
    "digest": ("zephon/digest.py", "zephon.digest.*"),
    "resize": ("zephon/images/pixels/resize.py", "zephon.images.pixels.resize.*"),
    "patches": ("zephon/images/pixels/patches.py", "zephon.images.pixels.patches.*"),
    "image_digest": (
        "zephon/images/documents.py",
        "zephon.images.documents.x_image_digest__mutmut_*",
    ),
    "manifest": (
        "torchtitan/components/checkpoint/manifest.py",
        "torchtitan.components.checkpoint.manifest.*",
    ),
    "divergence": (
        "torchtitan/components/divergence.py",
        "torchtitan.components.divergence.*",
    ),
}

# How mutmut's outcomes count. A mutant no selected test reaches ("no tests")
# survives: nothing would notice it. A timeout is a detection (the tests hang or
# crawl). Anything else (suspicious, segfault, not checked) is shown as is.
DETECTED = {"killed", "timeout", "caught by type check"}
SURVIVED = {"survived", "no tests"}


def mutmut_bin() -> str:
    """The `mutmut` next to this Python (the console script, not `python -m`)."""
    path = Path(sys.executable).with_name("mutmut")
    return str(path) if path.exists() else "mutmut"


def prepare() -> None:
    """mutants/ is the tests' repository root: link it to the sample data."""
    MUTANTS.mkdir(exist_ok=True)
    link = MUTANTS / "data"
    if not link.exists() and (REPO / "data").exists():
        link.symlink_to(REPO / "data", target_is_directory=True)


def run_mutmut(patterns: list[str], max_children: int) -> float:
    """One `mutmut run` over the mutants these names or globs match; its wall seconds."""
    for old in MUTANTS.glob("mutmut-debug.log*"):
        old.unlink()  # the fork server's log of this run alone (mutant_seconds)
    cmd = [mutmut_bin(), "run", "--max-children", str(max_children), *patterns]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)  # the worktree's packages, not an installed copy
    log = MUTANTS / "mutmut-run.log"
    shown = " ".join(cmd) if len(cmd) < 20 else " ".join(cmd[:19]) + f" ... ({len(cmd)} args)"
    print(shown, f"(output: {log})", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"mutmut exited {proc.returncode}; see {log}")
    print(f"{wall:.0f} s", flush=True)
    return wall


def mutant_seconds() -> dict[str, float]:
    """Wall seconds of each mutant's tests, from the fork server's log (log_to_file)."""
    done = re.compile(r"Completed (\S+): exit=-?\d+ \(([\d.]+)s\)")
    out = {}
    for path in MUTANTS.glob("mutmut-debug.log*"):
        for m in done.finditer(path.read_text(errors="replace")):
            out[m.group(1)] = float(m.group(2))
    return out


def changed_lines(diff: str) -> str:
    """The mutated lines of a `mutmut show` diff, stripped: what an explanation names."""
    lines = diff.splitlines()
    plus = [ln[1:].strip() for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    if plus:
        return "\n".join(plus)
    # A removed statement or argument line: name what went.
    return "\n".join(
        "removed: " + ln[1:].strip()
        for ln in lines
        if ln.startswith("-") and not ln.startswith("---")
    )


def collect(label: str, seconds: dict[str, float]) -> dict[str, Any]:
    """One module's results from mutmut's metadata in mutants/; `seconds`: each
    mutant's test time (mutant_seconds)."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    path, pattern = MODULES[label]
    data = SourceFileMutationData(path=path)
    data.load()
    statuses = {
        name: status_by_exit_code[code]
        for name, code in sorted(data.exit_code_by_key.items())
        if fnmatch.fnmatch(name, pattern)
    }
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    others = {}
    for name, status in statuses.items():
        if status in DETECTED:
            continue
        diff = get_diff_for_mutant(name, path=path)
        others[name] = {"status": status, "change": changed_lines(diff), "diff": diff}
    test_s = sum(seconds.get(name, 0.0) for name in statuses)
    return {
        "file": path,
        "pattern": pattern,
        "counts": counts,
        "test_s": round(test_s, 1),
        "not_killed": others,
    }


def score_of(counts: dict[str, int]) -> tuple[int, int, float | None]:
    killed = sum(n for s, n in counts.items() if s in DETECTED)
    survived = sum(n for s, n in counts.items() if s in SURVIVED)
    total = killed + survived
    return killed, survived, (killed / total if total else None)


def load_equivalents() -> dict[str, dict[str, str]]:
    if not EQUIVALENT_PATH.exists():
        return {}
    with open(EQUIVALENT_PATH, "rb") as f:
        return tomllib.load(f)


def attach_reasons(results: dict[str, Any]) -> None:
    """Copy each survivor's reviewed reason into the results (`why`), if its entry
    names the same change; list the reasons no survivor uses (`stale_reasons`)."""
    reasons = load_equivalents()
    used = set()
    for mod in results["modules"].values():
        for name, m in mod["not_killed"].items():
            m.pop("why", None)
            entry = reasons.get(name)
            if m["status"] in SURVIVED and entry and entry.get("change", "").strip() == m["change"]:
                m["why"] = " ".join(entry["why"].split())
                used.add(name)
    run = [MODULES[label][1] for label in results["modules"]]
    results["stale_reasons"] = sorted(
        name for name in reasons if name not in used and any(fnmatch.fnmatch(name, p) for p in run)
    )


def by_number(name: str) -> tuple[str, int]:
    """Sort key: a function's mutants in mutmut's order (2 before 10)."""
    function, _, number = name.partition("__mutmut_")
    return function, int(number) if number.isdigit() else 0


def unexplained(results: dict[str, Any]) -> list[str]:
    return sorted(
        (
            name
            for mod in results["modules"].values()
            for name, m in mod["not_killed"].items()
            if m["status"] in SURVIVED and "why" not in m
        ),
        key=by_number,
    )


def fmt_time(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s"


def code(text: str) -> str:
    return "`" + text.replace("`", "'").replace("\n", " ⏎ ") + "`"


def page(results: dict[str, Any]) -> str:
    """The page, from the results alone (reasons attached)."""
    mods = results["modules"]
    missing = unexplained(results)
    rows, tk, ts, teq = [], 0, 0, 0
    for label in MODULES:
        if label not in mods:
            continue
        mod = mods[label]
        killed, survived, score = score_of(mod["counts"])
        n = sum(mod["counts"].values())
        eq = sum(1 for m in mod["not_killed"].values() if "why" in m)
        other = n - killed - survived
        tk, ts, teq = tk + killed, ts + survived, teq + eq
        rows.append(
            f"| `{mod['file']}`{' (`image_digest`)' if label == 'image_digest' else ''} "
            f"| {n} | {killed} | {survived} | {eq} | {survived - eq} | {other} "
            f"| {'-' if score is None else f'{score:.1%}'} | {fmt_time(mod['test_s'])} |"
        )
    total_score = tk / (tk + ts) if tk + ts else 0.0
    run = results["run"]
    run_n = sum(sum(mods[label]["counts"].values()) for label in run["modules"])
    out = [
        "# Mutation testing of the invariant-carrying modules",
        "",
        "Generated by `scripts/experiments/mutation_report.py` from `mutation.json`, with the reviewed "
        "reasons of `mutation_equivalent.toml`; do not edit by hand.",
        "",
        f"mutmut {results['mutmut']} changes one thing at a time in the modules below "
        "(an operator, a constant, a call's argument, an assignment) and runs the fast "
        "in-process unit tests that reach the changed function against each such "
        "*mutant*. A mutant is **killed** when a test fails (or hangs: a timeout counts "
        "as killed); it **survives** when every test passes, or when no test reaches it "
        "at all. Score = killed / (killed + survived).",
        "",
        f"**{tk} of {tk + ts} mutants killed: {total_score:.1%}** (target "
        f"{TARGET_SCORE:.0%}). Of the {ts} survivors, {teq} are explained below as "
        f"equivalent (no observable behaviour can tell them from the code); "
        f"{len(missing)} are not.",
        "",
        f"Wall time: {fmt_time(run['wall_s'])} for the {run_n} mutants of "
        f"{'every module' if len(run['modules']) == len(MODULES) else ', '.join(run['modules'])}"
        f" in one `mutmut run` (generating the mutants, mapping tests to functions, the "
        f"clean run, then the mutants), on {results['machine']} with `--max-children "
        f"{results['max_children']}`, {results['date']}, commit `{results['commit']}`.",
        "",
        "| module | mutants | killed | survived | equivalent | unexplained | other "
        "| score | test time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "*other*: outcomes that are neither (suspicious, segfault, not checked); "
        "*test time*: the module's mutants' test runs, summed (two run at a time).",
        "",
    ]
    if missing:
        out += ["## Unexplained survivors", ""]
        out += [f"- `{name}`: {code(find(mods, name)['change'])}" for name in missing] + [""]
    if results.get("stale_reasons"):
        out += [
            "## Stale reasons",
            "",
            "Reasons kept for mutants that no longer survive, or whose change moved:",
            "",
        ]
        out += [f"- `{name}`" for name in results["stale_reasons"]] + [""]
    out += ["## Surviving mutants, and why each is equivalent", ""]
    for label in MODULES:
        if label not in mods:
            continue
        names = sorted(
            (n for n, m in mods[label]["not_killed"].items() if "why" in m), key=by_number
        )
        if not names:
            continue
        out += [f"### `{mods[label]['file']}`", ""]
        for name in names:
            m = mods[label]["not_killed"][name]
            out.append(f"- `{name.rpartition('.')[2]}` {code(m['change'])}: {m['why']}")
        out.append("")
    out += [
        "## How to run it",
        "",
        "```",
        "pip install -r requirements-mutation.txt                   # mutmut, pinned",
        "python scripts/experiments/mutation_report.py --fresh      # every module: the wall time above",
        "python scripts/experiments/mutation_report.py packing      # one module (the others keep theirs)",
        "python scripts/experiments/mutation_report.py --again      # only what survived last time",
        "python scripts/experiments/mutation_report.py --page-only  # this page again after editing reasons",
        "mutmut show <mutant name>                                  # a mutant's diff, from the repo root",
        "```",
        "",
        "The configuration is `[tool.mutmut]` in `pyproject.toml`: the mutated files, and "
        "the tests run against them (listed test files, minus slow-marked tests, tests "
        "that start processes and those over about a second: every surviving mutant runs "
        "all the tests that reach its function). A new surviving mutant fails the script "
        "(exit 1) until a test kills it or `docs/results/mutation_equivalent.toml` says, "
        "under the mutant's name and with its changed line, why no behaviour can tell it "
        "apart. While writing tests, `--again` reruns only the mutants not killed last "
        "time (adding tests kills, it never revives). Objects a test module builds at "
        "import escape the mutants (mutmut switches them on per test): build what is "
        "under test inside the test. Not run in CI: it takes the time above on two cores.",
        "",
    ]
    return "\n".join(out)


def summary(results: dict[str, Any]) -> str:
    """The sentence QUOTED_IN quotes: the last full run's score."""
    killed = survived = 0
    for mod in results["modules"].values():
        k, s, _ = score_of(mod["counts"])
        killed, survived = killed + k, survived + s
    return (
        f"The last full run ({results['date']}, commit {results['commit']}) killed "
        f"{killed:,} of {killed + survived:,} mutants ({killed / (killed + survived):.1%}); "
        "each survivor is explained on [its page](results/mutation.md).\n"
    )


def find(mods: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m["not_killed"][name] for m in mods.values() if name in m["not_killed"])


def git_commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help=f"some of: {', '.join(MODULES)} (default all)")
    ap.add_argument("--max-children", type=int, default=MAX_CHILDREN)
    ap.add_argument("--fresh", action="store_true", help="delete mutants/ first")
    ap.add_argument(
        "--again",
        action="store_true",
        help="only the mutants not killed in mutation.json (while writing tests; the "
        "others keep their results, and the page its last full run's times)",
    )
    ap.add_argument("--page-only", action="store_true", help="no run: the page from the JSON")
    args = ap.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {unknown}; known: {', '.join(MODULES)}")

    results: dict[str, Any] = (
        json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {"modules": {}}
    )
    if not args.page_only:
        os.chdir(REPO)  # mutmut reads its configuration from the working directory
        from importlib.metadata import version

        if args.fresh and MUTANTS.exists():
            shutil.rmtree(MUTANTS)
        prepare()
        labels = args.modules or list(MODULES)
        if args.again:
            names = [
                name
                for label in labels
                for name, m in results["modules"].get(label, {}).get("not_killed", {}).items()
            ]
            if not names:
                print("nothing to run again")
                return 0
            run_mutmut(names, args.max_children)
            for label in labels:
                results["modules"][label] = {
                    **collect(label, {}),
                    "test_s": results["modules"][label]["test_s"],
                }
        else:
            wall = run_mutmut([MODULES[label][1] for label in labels], args.max_children)
            seconds = mutant_seconds()
            for label in labels:
                results["modules"][label] = collect(label, seconds)
            results.update(
                mutmut=version("mutmut"),
                max_children=args.max_children,
                commit=git_commit(),
                machine=f"{os.cpu_count()} CPU cores ({platform.machine()})",
                date=datetime.now(UTC).strftime("%Y-%m-%d"),
                run={"modules": labels, "wall_s": round(wall, 1)},
            )
    attach_reasons(results)
    JSON_PATH.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    PAGE_PATH.write_text(page(results))
    quote_in_page(QUOTED_IN, "mutation", summary(results))
    missing = unexplained(results)
    if missing:
        print(f"{len(missing)} unexplained survivor(s); see {PAGE_PATH}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
