"""Smoke tests: the pipeline and throughput benchmarks run with --quick and write their figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from harness.train import ensure_sample_data
from zephon.stage_profile import STAGES

SCRIPT = REPO / "benchmarks" / "bench_pipeline.py"


def test_bench_pipeline_quick(tmp_path: Path) -> None:
    ensure_sample_data()  # build the sample corpus rather than skip without it
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    cfg, tp, restore = doc["config"], doc["throughput"], doc["restore"]
    assert cfg["quick"] is True
    # The figures printed are the JSON's, and they describe what was delivered.
    assert f"RATIO pipeline/raw = {tp['ratio']:.3f} " in proc.stdout
    assert tp["ratio"] > 0 and tp["raw_tok_s"] > 0 and tp["pipeline_tok_s"] > 0
    row = cfg["seq_len"] + 1
    assert tp["row_tokens"] == tp["batches_per_round"] * cfg["global_batch"] * row
    assert restore["state_check"].startswith("state at step 10 identical to a plain run's")
    assert sorted(map(int, restore["per_step"])) == cfg["restore_steps"]
    sizes = []
    for step, r in restore["per_step"].items():
        # Replay is what the state says was consumed since each lane's flush point.
        assert r["replay"]["rows"] == sum(r["rows_since_flush_per_lane"]), step
        assert len(r["rows_since_flush_per_lane"]) == cfg["lanes"]
        assert r["state_bytes"] == cfg["lanes"] * r["state_bytes_per_lane"]
        sizes.append(r["state_bytes"])
    assert max(sizes) < 1.1 * min(sizes)  # the state does not grow with the step


def test_bench_throughput_quick(tmp_path: Path) -> None:
    ensure_sample_data()
    out = tmp_path / "throughput"
    script = REPO / "benchmarks" / "bench_throughput.py"
    cmd = [sys.executable, str(script), "--quick", "--lanes", "1", "8"]
    # two corpora of the four: a plain one and a mixture (the others, long documents
    # and web text, run the same code; the benchmark itself runs all four)
    cmd += ["--corpora", "sample", "mix"]
    cmd += ["--work", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.with_suffix(".json").read_text())
    corpora = ("mix", "sample")
    assert sorted(doc["results"]) == [f"{c}/{n}" for c in corpora for n in (1, 8)]
    for key, r in doc["results"].items():
        assert r["raw_tokens"] > 0 and r["ratio"] > 0 and len(r["ratios"]) == 1
        # The per-stage breakdown: every stage, adding up to the pipeline's CPU.
        (run,) = r["pipeline"]
        profile = run["profile"]
        assert set(profile["cpu_ns"]) == set(STAGES), key
        assert sum(profile["cpu_ns"].values()) == profile["total_cpu_ns"] > 0, key
        assert profile["cpu_ns"]["tokenize"] > 0 and profile["tokens"] == r["row_tokens"], key
        # Everything the process spent while the loader ran is in some stage, give or
        # take the benchmark's own loop and the unswitched tail of threads still running.
        slack = profile["unswitched_ns"]
        process = profile["process_cpu_ns"]
        assert 0.8 * process <= profile["total_cpu_ns"] + slack <= 1.05 * process, key
        ns = r["stage_ns_per_token"]
        assert set(ns) == {*STAGES, "total"}, key
        assert abs(sum(ns[s] for s in STAGES) - ns["total"]) <= 1e-6 * ns["total"], key
    page = out.with_suffix(".md").read_text()
    assert "| sample | 8 |" in page and "| mix | 8 |" in page
    assert "| corpus | lanes | read | parse | plan | tokenize |" in page


def _images_per_s(run: dict) -> float:
    return run["images"] / run["wall_s"]


def test_bench_images_quick(tmp_path: Path) -> None:
    script = REPO / "benchmarks" / "bench_images.py"
    out = tmp_path / "images.json"
    # Thumbnails only: the web and photos corpora run the same code on larger images
    # (about 30 and 90 s of CPU more here); the benchmark itself runs all three.
    cmd = [sys.executable, str(script), "--quick", "--work", str(tmp_path / "work"),
           "--corpora", "thumbnails"]  # fmt: skip
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["quick"] is True and set(doc["corpora"]) == {"thumbnails"}
    for name, result in doc["corpora"].items():
        cfg, s, (r,) = result["config"], result["summary"], result["rounds"]
        assert cfg["rounds"] == 1 and cfg["epochs"] == 1, name
        # Every side worked on the whole corpus: the raw loops and the conventional
        # path each took every image once; the pipeline delivered as many (its last
        # step may overshoot by less than a step) and decoded at least those.
        kinds = ("plain_before", "hashed_before", "hashed_after", "plain_after", "plain_1_thread")
        for kind in (*kinds, "conventional"):
            assert r[kind]["images"] == cfg["images"], (name, kind)
        a = r["pipeline"]
        assert 0 <= a["images"] - cfg["images"] < a["images"] / a["steps"] + 1, name
        # and decoded no more than those plus the lookahead (four steps of tokens
        # with images, two batches prefetched, a call in flight)
        per_step = a["images"] / a["steps"]
        assert a["images"] <= a["images_decoded"] <= a["images"] + 8 * per_step, name
        assert a["steps"] * cfg["global_batch"] * (cfg["seq_len"] + 1) >= a["tokens"] > 0
        # The step marks are the run's own: one a step, in order, ending at its count
        # (the quick corpora give two steps at least: a window after the first).
        assert a["steps"] >= 2, name
        assert len(a["step_s"]) == len(a["step_images"]) == a["steps"], name
        assert a["step_s"] == sorted(a["step_s"]) and a["step_images"][-1] == a["images"]
        assert a["step_s"][0] == a["first_batch_s"] and a["step_s"][-1] <= a["wall_s"]

        # The ratios are against the plain loop (and the loop with the hash) on either
        # side of the pipeline run, and against the conventional path; the sustained
        # window is the steps after a fifth of the images.
        speed = _images_per_s
        w = r["sustained"]
        k = w["from_step"] - 1
        first = next(i for i, n in enumerate(a["step_images"]) if n >= 0.2 * a["images"])
        assert k == min(first, a["steps"] - 2), name
        assert w["images"] == a["images"] - a["step_images"][k], name
        assert w["seconds"] == pytest.approx(a["step_s"][-1] - a["step_s"][k]), name
        for ref in ("plain", "hashed", "conventional"):
            base = (
                speed(r["conventional"])
                if ref == "conventional"
                else (speed(r[f"{ref}_before"]) + speed(r[f"{ref}_after"])) / 2
            )
            assert s["ratios"][ref] == pytest.approx(speed(a) / base), (name, ref)
            sustained = w["images"] / w["seconds"] / base
            assert s["ratios"][f"{ref}_sustained"] == pytest.approx(sustained), (name, ref)
        assert f"RATIO {name} pipeline/plain = {s['ratios']['plain']:.3f}" in proc.stdout
        # The CPU table splits the profiled run's thread CPU, all of it, per image.
        run, per = result["profiled_run"], result["cpu_per_image"]["pipeline"]
        total = run["profile"]["total_cpu_ns"] / run["images"] / 1e3
        assert per["image work"] + per["own"] == pytest.approx(total), name
        assert min(per[k] for k in ("header plans", "decoding", "framing", "captions")) > 0
        assert per["decoding"] > per["header plans"], name
        for budget in result["memory"].values():
            assert 0 < budget["lookahead_peak_bytes"] and budget["rss_peak"] >= budget["rss_before"]
        e = cfg["encoded_bytes"]
        assert 0 < e["min"] <= e["mean"] <= e["max"], name
        assert e["mean"] * cfg["images"] == pytest.approx(cfg["corpus_bytes"]), name
        assert f"corpus {name}: {cfg['images']:,} images" in proc.stdout
        assert 0 < s["pipeline_cores_busy"] and 0 < s["plain_cores_busy"], name
    assert out.with_suffix(".md").read_text().startswith(f"# {doc['title']}")


def test_bench_image_work_quick(tmp_path: Path) -> None:
    script = REPO / "benchmarks" / "bench_image_work.py"
    out = tmp_path / "work.json"
    cmd = [sys.executable, str(script), "--images", "24", "--decode-images", "24", "--rounds", "1"]
    cmd += ["--work", str(tmp_path / "work"), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    for name, h in doc["headers"].items():
        # the generated JPEGs and PNGs are all plain enough for the scan
        assert h["images"] == h["scanned"] == 24, name
        assert h["pillow_us"] > 0 and h["scan_us"] > 0, name
    assert set(doc["decode_process"]) == {"web", "photos"}
    for name, d in doc["decode_process"].items():
        for run in d.values():
            assert run["images"] == 24 and run["cpu_us"] >= 0 and run["faults"] >= 0, name
    assert out.with_suffix(".md").read_text() == proc.stdout


def test_bench_gpu_runs_its_cases_and_writes_its_page_on_cpu(tmp_path: Path) -> None:
    """The GPU benchmark's path on 2 CPU processes (a GPU session runs the same code on
    the 1B shape): the shape it reports is the one the trainer ran, whatever the
    overrides say, and the page is its JSON rendered."""
    import bench_gpu

    ensure_sample_data()
    out = tmp_path / "bench_gpu.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_gpu.py"), "--cpu", "--cases",
           "zephon", "--steps", "3", "--warmup", "1", "--out", str(out), "--",
           "--training.seq_len", "128"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    (case,) = doc["cases"]
    assert (case["case"], case["seq_len"], case["rows"], case["steps_measured"]) == (
        "zephon",
        128,
        32,
        2,
    )
    assert case["tokens_per_s"] > 0 and 0 <= case["data_wait_share"] < 1
    assert case["matmul_mfu"] is None and case["upstream_mfu"] is None  # no GPU peak
    assert out.with_suffix(".md").read_text() == bench_gpu.page(doc)
    assert "| zephon | 32 x 128 |" in bench_gpu.page(doc)
