"""The README's table of claims, each row's figures read from its committed results JSON.

    .venv/bin/python scripts/experiments/claims.py            # rewrite the README's table
    .venv/bin/python scripts/experiments/claims.py --check    # exit 1 if it differs

The table stands between the `claims` markers of README.md; no figure in it is
typed by hand. tests/unit/test_results_pages.py renders it from the committed
JSON and compares. A script that writes new results changes the row here when
its JSON changes: run this after it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mutation_report

from harness.train import REPO, quote_in_page

RESULTS = REPO / "docs" / "results"
QUOTED_IN = "README.md"


def _e(x: float) -> str:
    """1.1e-6, not 1.1e-06."""
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


def _all(rows: list[dict[str, Any]], key: str, what: str) -> str:
    ok = sum(1 for r in rows if r[key])
    return (
        f"every {what} equal" if ok == len(rows) else f"{ok} of {len(rows)} with every {what} equal"
    )


def elastic_resume(doc: dict[str, Any]) -> str:
    zephon = [r for r in doc["rows"] if r["loader"] == "zephon"]
    hf = [r for r in doc["rows"] if r["loader"] == "hf"]
    steps = zephon[0]["steps_compared"]
    kept = min(r["digests_equal"] for r in zephon)
    if kept == steps and all(r["steps_compared"] == steps for r in zephon):
        ours = f"Zephon: {kept} of {steps} steps with the reference digest at every size"
    else:
        ours = f"Zephon: as few as {kept} of {steps} steps with the reference digest"
    return f"{ours}; conventional loader: {max(r['digests_equal'] for r in hf)} of {steps}"


def gpu_count_sensitivity(doc: dict[str, Any]) -> str:
    sizes = doc["config"]["sizes"]
    spread = doc["spread"]
    return (
        f"validation-loss spread over {min(sizes)}-{max(sizes)} processes: "
        f"{_e(spread['zephon'])} (Zephon) vs {_e(spread['hf'])} (conventional)"
    )


def gpu_count_sensitivity_moe(doc: dict[str, Any]) -> str:
    sizes, spread = doc["config"]["sizes"], doc["spread"]
    free = max(v for b, v in spread.items() if b != "micro_batch_aux")
    return (
        f"validation-loss spread over {min(sizes)}-{max(sizes)} processes with expert "
        f"parallelism: at most {_e(free)} (balance over the global batch) vs "
        f"{_e(spread['micro_batch_aux'])} (per micro-batch, the usual way)"
    )


def mesh_resume_matrix(rows: list[dict[str, Any]]) -> str:
    resumes = [r for r in rows if "from scratch" not in r["run"]]
    return (
        f"{len(resumes)} cross-mesh resumes (pipeline to and from FSDP, TP and another "
        f"degree), {_all(resumes, 'digests_equal', 'digest')}"
    )


def uneven_resume(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    return f"{len(rows)} runs (e.g. 12 lanes on 5 and 7 processes), {_all(rows, 'digests_equal', 'digest')}"


def two_node_resume(doc: dict[str, Any]) -> str:
    same = all(
        s["two_node_digest"] == s["one_node_digest"] and s["rel_dloss"] == 0 for s in doc["steps"]
    )
    return "digests and losses bit-identical" if same else "digests or losses differ"


def phases_demo(doc: dict[str, Any]) -> str:
    resumes = [r for r in doc["rows"] if "digests_equal" in r]
    ok = all(
        r["digests_equal"] and r["max_rel_dloss"] <= doc["config"]["loss_rtol"] for r in resumes
    )
    return (
        f"every branch resume matches its branch ({len(resumes)} resumes)"
        if ok
        else "a branch resume differs from its branch"
    )


def elastic_resume_vlm(doc: dict[str, Any]) -> str:
    rows = [r for r in doc["rows"] if r["loader"] == "zephon"]
    sizes = ", ".join(str(r["resume_size"]) for r in rows)
    kept = all(r["digests_equal"] == r["steps_compared"] for r in rows)
    return f"vlm resumes on {sizes} processes: {'every digest kept' if kept else 'digests lost'}"


def fault_injection(doc: dict[str, Any]) -> str:
    results = doc["results"]
    right = all(
        t["outcome"].startswith(("ok", "refused", "exited", "exit 2"))
        for r in results
        for t in r["trials"]
    )
    verdict = "each resume right or refused by name" if right else "not every fault handled"
    return f"{len(results)} kinds of kill and damage, {len(doc['seeds'])} seeds: {verdict}"


def live_recovery(doc: dict[str, Any]) -> str:
    runs = doc["runs"]
    ok = sum(1 for r in runs if r["verdict"] == "ok")
    return (
        f"{ok} of {len(runs)} fault runs with the data and the losses of a run without faults, "
        "at most one step redone; time lost against an elastic restart under "
        "[When a node is lost](#when-a-node-is-lost)"
    )


def elastic_scenarios(doc: dict[str, Any]) -> str:
    results = doc["results"]
    ok = sum(1 for r in results.values() if r.get("verdict") == "ok")
    what = "elastic, preemption and divergence scenarios"
    return (
        f"{len(results)} {what} pass"
        if ok == len(results)
        else f"{ok} of {len(results)} {what} pass"
    )


def soak(doc: dict[str, Any]) -> str:
    faults = doc["faults"]
    kinds = len({f["kind"] for f in faults})
    digests = "every digest right" if not doc["wrong_digests"] else "wrong digests"
    verified = (
        "every checkpoint verifies"
        if not doc["checkpoints"]["not_verified"]
        else "checkpoints that do not verify"
    )
    return (
        f"{len(faults)} faults of {kinds} kinds (node losses, signals, read-only folders, a "
        f"stale lock) in {doc['minutes']} minutes: {digests}, {verified}"
    )


def soak_live(doc: dict[str, Any]) -> str:
    faults = doc["faults"]
    kinds = len({f["kind"] for f in faults})
    digests = "every digest right" if not doc["wrong_digests"] else "wrong digests"
    changed = doc["checkpoints"]["changed_after_complete"]
    kept = (
        "no complete checkpoint changed" if not changed else f"{len(changed)} checkpoints changed"
    )
    elastic = doc["elastic"].get("time_lost_share")
    vs = f" ({100 * (1 - elastic):.1f}% in the elastic soak)" if elastic is not None else ""
    return (
        f"{len(faults)} faults of {kinds} kinds (groups killed and paused, the lighthouse "
        f"restarted, every group lost) in {doc['wall_s'] / 60:.0f} minutes: {digests}, {kept}; "
        f"{100 * (1 - doc['time_lost_share']):.1f}% of the time kept{vs}"
    )


def bench_throughput(doc: dict[str, Any]) -> str:
    ratios = [r["ratio"] for r in doc["results"].values()]
    return f"pipeline at {min(ratios):.2f}-{max(ratios):.2f}x raw `encode_batch` throughput"


def bench_images_rows(doc: dict[str, Any]) -> str:
    """Start to end at the rows a rank gets: the medians over rounds, per row count."""

    def med(rounds: list[dict[str, Any]], ref: str) -> float:
        return statistics.median(  # each round's ratio to 3 places, as its page rounds it
            round(r["pipeline"]["images"] / r["pipeline"]["wall_s"] / _rate(r, ref), 3)
            for r in rounds
        )

    parts = [
        f"{rows} rows a step {med(rounds, 'plain'):.2f} of a plain {doc['workers']}-thread "
        f"decode loop and {med(rounds, 'decode_only'):.2f}x a decode-only webdataset + DataLoader"
        for rows, rounds in doc["rounds"].items()
    ]
    return (
        f"photograph-like JPEGs, {doc['workers']} workers, start to end over "
        f"{doc['epochs']} epochs: " + "; ".join(parts)
    )


def _rate(r: dict[str, Any], ref: str) -> float:
    """A reference's images/s in a round (the plain loop: the mean of before and after)."""
    if ref == "plain":
        return statistics.mean(
            r[k]["images"] / r[k]["wall_s"] for k in ("plain_before", "plain_after")
        )
    return r[ref]["images"] / r[ref]["wall_s"]


def mutation(doc: dict[str, Any]) -> str:
    """As the mutation page counts them (mutation_report.score_of)."""
    killed = survived = explained = 0
    for mod in doc["modules"].values():
        k, s, _ = mutation_report.score_of(mod["counts"])
        killed, survived = killed + k, survived + s
        explained += sum(1 for m in mod["not_killed"].values() if "why" in m)
    unexplained = survived - explained
    survivors = (
        "every survivor explained" if not unexplained else f"{unexplained} survivors unexplained"
    )
    return (
        f"{killed / (killed + survived):.1%} of mutants killed ({killed:,} of "
        f"{killed + survived:,}), {survivors}; golden digests; property tests"
    )


# (claim, results JSON, its evidence from the JSON, the page)
CLAIMS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("A resume on 1, 2 or 8 processes trains on the original batches", "elastic_resume", elastic_resume),
    ("The trained model does not depend on the process count", "gpu_count_sensitivity", gpu_count_sensitivity),
    ("Mixtures of experts too", "gpu_count_sensitivity_moe", gpu_count_sensitivity_moe),
    ("Any mesh: FSDP, HSDP, tensor and pipeline parallel", "mesh_resume_matrix", mesh_resume_matrix),
    ("Sizes that do not divide the lanes", "uneven_resume", uneven_resume),
    ("Two nodes resumed on one", "two_node_resume", two_node_resume),
    ("Data phases, branched and resumed", "phases_demo", phases_demo),
    ("Image-text data too", "elastic_resume_vlm", elastic_resume_vlm),
    ("Faults never give wrong data", "fault_injection", fault_injection),
    ("A lost replica group costs one step, not a restart", "live_recovery", live_recovery),
    ("Unattended runs recover", "elastic_scenarios", elastic_scenarios),
    ("An hour of faults alone", "soak", soak),
    ("An hour of faults with live recovery", "soak_live", soak_live),
    ("Determinism is cheap", "bench_throughput", bench_throughput),
    ("Images keep up", "bench_images_rows", bench_images_rows),
    ("The tests catch broken rules", "mutation", mutation),
]  # fmt: skip


def table(results: Path = RESULTS) -> str:
    """The claims table, every row from its JSON under `results`."""
    lines = ["| claim | evidence | page |", "| --- | --- | --- |"]
    for claim, name, evidence in CLAIMS:
        doc = json.loads((results / f"{name}.json").read_text())
        lines.append(f"| {claim} | {evidence(doc)} | [{name}](docs/results/{name}.md) |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the README's table differs")
    a = p.parse_args()
    text = table()
    if a.check:
        body = (REPO / QUOTED_IN).read_text()
        ok = f"<!-- claims:begin -->\n{text}<!-- claims:end -->" in body
        print(
            "the README's claims are the JSON's"
            if ok
            else "the README's claims differ: run claims.py"
        )
        return 0 if ok else 1
    quote_in_page(QUOTED_IN, "claims", text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
