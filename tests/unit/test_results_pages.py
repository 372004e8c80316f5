"""Every table under docs/results (and its copy on a documentation page) is
generated from the raw JSON committed beside it.

Rendering each committed JSON with the function of the script that wrote it
gives the committed page byte for byte, so a table edited by hand, a JSON
replaced without its table, or a renderer changed without re-rendering fails
here. No training run: each page is rendered from its JSON alone."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_boundary
import bench_gpu
import bench_grad_memory
import bench_image_work
import bench_images
import bench_images_rows
import bench_index
import bench_loader_cpu
import bench_scale
import bench_throughput
import claims
import elastic_resume_demo
import elastic_scenarios
import fault_injection
import gpu_checks
import gpu_count_sensitivity
import live_recovery
import mesh_resume_matrix
import mutation_report
import phases_demo
import preempt_save_time
import pytest
import soak
import soak_live
import two_node_resume
import uneven_resume
import vlm_caption_probe
from helpers import REPO

RESULTS = REPO / "docs" / "results"

PAGES: dict[str, Callable[[Any], str]] = {
    "bench_boundary": bench_boundary.markdown,
    "bench_gpu": bench_gpu.page,
    "bench_grad_memory": bench_grad_memory.page,
    "bench_image_work": bench_image_work.page,
    "bench_images": bench_images.page,
    "bench_images_rows": bench_images_rows.page,
    "bench_index": bench_index.markdown,
    "bench_loader_cpu": bench_loader_cpu.render,
    "bench_scale": bench_scale.render,
    "bench_throughput": bench_throughput.render,
    "elastic_resume": lambda doc: f"{doc['title']}\n\n{elastic_resume_demo.markdown_table(doc)}\n",
    "elastic_resume_vlm": lambda doc: (
        f"{doc['title']}\n\n{elastic_resume_demo.markdown_table(doc)}\n"
    ),
    "elastic_scenarios": elastic_scenarios.report,
    "fault_injection": fault_injection.report,
    "gpu_checks": gpu_checks.page,
    "gpu_count_sensitivity": gpu_count_sensitivity.markdown,
    "gpu_count_sensitivity_moe": gpu_count_sensitivity.markdown,
    "live_recovery": live_recovery.page,
    "mesh_resume_matrix": mesh_resume_matrix.page,
    "mutation": mutation_report.page,
    "phases_demo": phases_demo.page,
    "preempt_save_time": preempt_save_time.report,
    "soak": soak.report,
    "soak_live": soak_live.report,
    "two_node_resume": two_node_resume.page,
    "uneven_resume": uneven_resume.page,
    "vlm_caption_probe": vlm_caption_probe.page,
}
# docs/results name -> PAGES key, where the page is not named after its script.
NAMES = {"grad_memory": "bench_grad_memory"}


def test_every_table_has_its_raw_json_and_a_renderer() -> None:
    pages = sorted(p.stem for p in RESULTS.glob("*.md"))
    assert pages, RESULTS
    for name in pages:
        assert (RESULTS / f"{name}.json").is_file(), f"{name}.md has no raw JSON beside it"
        assert NAMES.get(name, name) in PAGES, f"no renderer known for {name}.md"


@pytest.mark.parametrize("name", sorted(p.stem for p in RESULTS.glob("*.md")))
def test_page_is_its_json_rendered(name: str) -> None:
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    assert PAGES[NAMES.get(name, name)](doc) == (RESULTS / f"{name}.md").read_text()


def quoted_block(page: str, marker: str) -> str:
    body = (REPO / page).read_text()
    found = re.search(f"<!-- {marker}:begin -->\n(.*?)<!-- {marker}:end -->", body, re.S)
    assert found, f"{page} has no {marker} markers"
    return found.group(1)


# marker -> (the script's module, whose QUOTED_IN names the page, and its summary)
QUOTED: dict[str, tuple[Any, Callable[[Any], str]]] = {
    "bench_throughput": (bench_throughput, bench_throughput.render),
    "bench_scale": (bench_scale, bench_scale.render),
    "fault_injection": (fault_injection, lambda doc: fault_injection.table(doc["results"]) + "\n"),
    "gpu_count_sensitivity": (gpu_count_sensitivity, gpu_count_sensitivity.quoted_summary),
    "gpu_count_sensitivity_moe": (gpu_count_sensitivity, gpu_count_sensitivity.quoted_summary),
    "phases_demo": (phases_demo, phases_demo.table),
    "elastic_scenarios": (elastic_scenarios, elastic_scenarios.quoted_summary),
    "vlm_caption_probe": (vlm_caption_probe, vlm_caption_probe.table),
    "bench_images": (bench_images, bench_images.table),
    "bench_images_rows": (bench_images_rows, bench_images_rows.table),
    "live_recovery": (live_recovery, live_recovery.summary),
    "mutation": (mutation_report, mutation_report.summary),
    "elastic_resume": (elastic_resume_demo, elastic_resume_demo.quoted),
}


@pytest.mark.parametrize("marker", sorted(QUOTED))
def test_quoted_figures_are_generated(marker: str) -> None:
    """The copy between a page's markers is the script's summary of the committed
    JSON, on the page the script writes to (its QUOTED_IN), and on no other page."""
    module, summary = QUOTED[marker]
    doc = json.loads((RESULTS / f"{marker}.json").read_text())
    assert quoted_block(module.QUOTED_IN, marker) == summary(doc)
    elsewhere = [
        str(p.relative_to(REPO))
        for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        if f"<!-- {marker}:begin -->" in p.read_text() and p != REPO / module.QUOTED_IN
    ]
    assert not elsewhere, f"{marker} is quoted outside {module.QUOTED_IN}: {elsewhere}"


def doc_pages() -> dict[Path, str]:
    return {p: p.read_text() for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")]}


def test_render_commands_rewrite_the_page(tmp_path: Path) -> None:
    """The scripts' --render entry points write the same page beside a JSON copy
    (and leave the README and docs pages alone for a JSON that is not the committed
    one)."""
    pages = doc_pages()
    entry = {
        "bench_images_rows": bench_images_rows.publish,
        "elastic_resume": elastic_resume_demo.render,
        "fault_injection": fault_injection.render,
        "gpu_count_sensitivity": gpu_count_sensitivity.publish,
        "phases_demo": phases_demo.publish,
        "vlm_caption_probe": vlm_caption_probe.publish,
    }
    for name, render in entry.items():
        copy = tmp_path / f"{name}.json"
        copy.write_text((RESULTS / f"{name}.json").read_text())
        assert render(copy) == 0
        assert copy.with_suffix(".md").read_text() == (RESULTS / f"{name}.md").read_text()
    assert (tmp_path / "gpu_count_sensitivity_val_loss.png").stat().st_size > 10_000
    assert (tmp_path / "phases_demo_curves.png").stat().st_size > 10_000
    assert doc_pages() == pages


def test_the_readmes_claims_are_the_results_json():
    """Every figure of the README's claims table is computed from its committed JSON
    (scripts/experiments/claims.py), and nothing else stands between its markers."""
    assert quoted_block("README.md", "claims") == claims.table()
    assert "97.6% of mutants killed (3,138 of 3,214)" in claims.table()  # as mutation.md


def test_claims_follow_a_changed_json(tmp_path: Path):
    """The table is the JSON's: a run whose digests differ reads so in the README."""
    for f in RESULTS.glob("*.json"):
        (tmp_path / f.name).write_text(f.read_text())
    doc = json.loads((RESULTS / "elastic_resume.json").read_text())
    doc["rows"][0]["digests_equal"] = 4
    (tmp_path / "elastic_resume.json").write_text(json.dumps(doc))
    assert "Zephon: as few as 4 of 6 steps with the reference digest" in claims.table(tmp_path)
