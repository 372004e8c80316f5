"""scripts/experiments/elastic_resume_demo.py without training: its comparison, table and
plot, from the committed raw results (docs/results/elastic_resume.json, and
elastic_resume_vlm.json: the vision-language model on the image-text sample).

The resumes themselves are checked where they are cheaper: at the trainer level
in test_train_elastic.py (Zephon at another process count) and
test_train_validation.py (the hf loader's skip mode), at the loader level in
zephon/test_resume.py and trainer/test_hf_baseline.py. What only the demo adds is
tested here: that each table row is the comparison of the raw per-step digests
and losses it was made from, and that the figure is drawn from them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import elastic_resume_demo as demo
import pytest
from helpers import REPO

RESULTS = REPO / "docs" / "results" / "elastic_resume.json"
# The vision-language model on the image-text sample (`--config`, Zephon only).
VLM_RESULTS = REPO / "docs" / "results" / "elastic_resume_vlm.json"


def committed_runs(
    path: Path = RESULTS,
) -> tuple[dict, dict[str, demo.Run], dict[str, list[demo.Run]]]:
    doc = json.loads(path.read_text())
    refs: dict[str, demo.Run] = {}
    resumes: dict[str, list[demo.Run]] = {}
    for r in doc["runs"]:
        steps = {s["step"]: {k: s[k] for k in ("loss", "grad_norm", "digest")} for s in r["steps"]}
        run = demo.Run(r["loader"], r["role"], r["nproc"], Path(r["dump"]), r["wall_s"], steps)
        if r["role"] == "reference":
            refs[r["loader"]] = run
        else:
            resumes.setdefault(r["loader"], []).append(run)
    return doc, refs, resumes


@pytest.mark.parametrize("path", [RESULTS, VLM_RESULTS], ids=["llama3", "vlm"])
def test_rows_are_the_comparison_of_the_raw_digests(path: Path) -> None:
    doc, refs, resumes = committed_runs(path)
    k, total = doc["config"]["ckpt_step"], doc["config"]["steps"]
    rows = [demo.compare(refs[ld], run, k, total) for ld in refs for run in resumes[ld]]
    assert [
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
    ] == doc["rows"]
    # What the README states: every Zephon resume matched, no hf resume did.
    assert doc["zephon_all_match"] and all(r.all_match for r in rows if r.loader == "zephon")
    assert all(r.matched == 0 and r.first_diff == k + 1 for r in rows if r.loader == "hf")


def test_a_differing_digest_is_found_and_located() -> None:
    doc, refs, resumes = committed_runs()
    k, total = doc["config"]["ckpt_step"], doc["config"]["steps"]
    run = resumes["zephon"][0]
    run.steps[k + 2] = {**run.steps[k + 2], "digest": "0" * 64}
    row = demo.compare(refs["zephon"], run, k, total)
    assert (row.matched, row.first_diff, row.all_match) == (total - k - 1, k + 2, False)
    del run.steps[total]  # a step the resume never logged
    row = demo.compare(refs["zephon"], run, k, total)
    assert row.matched == total - k - 2 and row.max_abs_dloss == float("inf")


@pytest.mark.parametrize("path", [RESULTS, VLM_RESULTS], ids=["llama3", "vlm"])
def test_plot_is_drawn_from_the_runs(tmp_path: Path, path: Path) -> None:
    doc, refs, resumes = committed_runs(path)
    cfg = doc["config"]
    args = argparse.Namespace(
        config=REPO / cfg.get("job_config", demo.CONFIG),
        **{k: cfg[k] for k in ("steps", "ckpt_step", "ref_procs", "resume_sizes", "seq_len")},
        hf_resume_sizes=cfg["hf_resume_sizes"],
        global_batch=cfg["global_batch"],
        loaders=cfg["loaders"],
        seed=cfg["seed"],
        recipe=Path(cfg["recipe"]),
    )
    k, total = cfg["ckpt_step"], cfg["steps"]
    rows = [demo.compare(refs[ld], run, k, total) for ld in refs for run in resumes[ld]]
    assert demo.title(args) == doc["title"]
    demo.plot(args, refs, resumes, rows, tmp_path / "loss_curves.png")
    assert (tmp_path / "loss_curves.png").stat().st_size > 10_000
