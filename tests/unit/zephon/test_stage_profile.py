"""The per-stage CPU breakdown: each stage is charged with its own work, and only when asked.

The thread clock is injected: it advances only inside one function of each
stage, by a known amount per call, so the breakdown must put exactly those
amounts in those stages, on whatever thread the work ran.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from helpers import REPO
from helpers.loader import step_digests
from helpers.train import ensure_sample_data

from zephon import ZephonLoader, stage_profile
from zephon import batch_production as production
from zephon.demand import executor as scheduler
from zephon.demand import planner as planner_module
from zephon.images import work
from zephon.lanes.packing import RowBuilder
from zephon.sources import jsonl
from zephon.sources.storage import LocalObject

SAMPLE = REPO / "data" / "sample"

# Fake CPU charged per call of one function of each stage (distinct powers of ten,
# so a call charged to the wrong stage cannot add up to the right total).
CHARGES = {
    "read": 10**3,  # LocalObject.pread
    "parse": 10**1,  # the JSON parser, per record
    "plan": 10**5,  # NeedPlanner.plan
    "tokenize": 10**7,  # the tokenizer call
    "convert": 10**9,  # encodings -> id arrays
    "pack": 10**2,  # RowBuilder.build, per row
    "assemble": 10**4,  # the digest of a lane's rows
    "image": 10**11,  # decoding one image
    "header": 10**13,  # one image's header plan, when read: image work too
}


class FakeCPU:
    """Per-thread CPU clocks that move only when `charge` says so."""

    def __init__(self) -> None:
        self.ns: dict[int, int] = {}
        self.calls: Counter[str] = Counter()

    def now(self) -> int:
        return self.ns.get(threading.get_native_id(), 0)

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def charged(*args: Any, **kwargs: Any) -> Any:
            tid = threading.get_native_id()
            self.ns[tid] = self.ns.get(tid, 0) + CHARGES[stage]
            self.calls[stage] += 1
            return fn(*args, **kwargs)

        return charged


def test_each_stage_is_charged_with_its_own_work(make_recipe, tokenizer_path, monkeypatch):
    recipe = make_recipe(workers=2, prefetch=2)
    # The sources' content fingerprints are start-up work, built once per node and
    # cached: build them now, so every read counted below is the pipeline's.
    ZephonLoader(recipe, tokenizer_path, 64, 16).close()
    cpu = FakeCPU()
    monkeypatch.setattr(stage_profile, "_thread_cpu_ns", cpu.now)
    monkeypatch.setattr(LocalObject, "pread", cpu.wrap("read", LocalObject.pread))
    monkeypatch.setattr(jsonl, "_fast_loads", cpu.wrap("parse", jsonl._fast_loads))
    planner = planner_module.NeedPlanner
    monkeypatch.setattr(planner, "plan", cpu.wrap("plan", planner.plan))
    monkeypatch.setattr(scheduler, "encode_raw", cpu.wrap("tokenize", scheduler.encode_raw))
    monkeypatch.setattr(scheduler, "frame_ids", cpu.wrap("convert", scheduler.frame_ids))
    monkeypatch.setattr(RowBuilder, "build", cpu.wrap("pack", RowBuilder.build))
    monkeypatch.setattr(production, "rows_digest", cpu.wrap("assemble", production.rows_digest))

    ld = ZephonLoader(recipe, tokenizer_path, 64, 16, profile=True)
    delivered = sum(int(ld.next_batch().source_tokens.sum()) for _ in range(6))
    ld.close()  # every thread stops: its clock holds all it did
    assert ld.profile is not None
    snap = ld.profile.snapshot()

    text = [s for s in CHARGES if s not in ("image", "header")]  # a text recipe: no images
    assert all(cpu.calls[s] > 0 for s in text), cpu.calls
    charged = dict(snap["cpu_ns"])
    charged["tokenize"] -= snap["native_tokenize_ns"]  # the native pool's real CPU, read apart
    expected = {s: cpu.calls[s] * CHARGES[s] for s in text}
    assert {s: charged[s] for s in text} == expected
    assert charged["other"] == charged["wait"] == charged["image"] == 0
    assert snap["total_cpu_ns"] == sum(expected.values()) + snap["native_tokenize_ns"]
    assert snap["native_tokenize_ns"] > 0  # the tokenizer's own threads, from /proc
    assert snap["tokens"] == delivered
    # Every thread of the pipeline has its clock, the trainer's thread included.
    assert {"plan", "tokenize", "prefetch", "consumer"} <= set(snap["threads"])


def test_profile_off_costs_no_clock_and_changes_no_byte(make_recipe, tokenizer_path, monkeypatch):
    recipe = make_recipe(workers=2, prefetch=2)
    made: Counter[str] = Counter()
    init = stage_profile.ThreadClock.__init__

    def counted(self: Any, name: str, stage: int = stage_profile.OTHER) -> None:
        made[name] += 1
        init(self, name, stage)

    monkeypatch.setattr(stage_profile.ThreadClock, "__init__", counted)
    runs = {}
    for on in (False, True):
        made.clear()
        with ZephonLoader(recipe, tokenizer_path, 64, 16, profile=on) as ld:
            runs[on] = step_digests([ld], 8)
            assert ("profile" in ld.stats()) is on
            assert (stage_profile._active > 0) is on
        assert (sum(made.values()) > 0) is on, made  # off: not one clock was made
    assert stage_profile._active == 0
    assert runs[True] == runs[False]


@pytest.mark.parametrize("workers", [0, 2])
def test_breakdown_adds_up_to_the_process_cpu(make_recipe, tokenizer_path, workers):
    """With real clocks the stages cover the pipeline's threads and the tokenizer's pool:
    nothing the process spent on the loader is left out, nothing counted twice."""
    recipe = make_recipe(workers=workers, prefetch=workers)
    with ZephonLoader(recipe, tokenizer_path, 128, 16, profile=True) as ld:
        for _ in range(40):
            ld.next_batch()
        snap = ld.stats()["profile"]
    assert snap["total_cpu_ns"] == sum(snap["cpu_ns"].values())
    # The test's own work between batches is the only process CPU outside the stages.
    assert 0.8 * snap["process_cpu_ns"] <= snap["total_cpu_ns"] <= 1.02 * snap["process_cpu_ns"]


def test_image_decoding_is_charged_to_image_and_text_never_enters_it(
    make_recipe, tokenizer_path, tmp_path, monkeypatch
):
    """Decoding images is the image stage's, only there, and so are the header
    plans made when a document is read (not the read stage's); a text-only run
    never enters it; and the profile changes no byte of a batch with images."""
    ensure_sample_data()
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "img.toml"
    path.write_text(
        '[recipe]\nname = "img"\nseed = 7\nlanes = 4\n[packing]\nalgorithm = "best_fit"\n'
        "[shuffle]\nblock_size = 16\n"
        "[image]\npatch_size = 8\nmerge = 2\nmin_pixels = 1024\nmax_pixels = 16384\n"
        f'[[source]]\nname = "captions"\npath = "{SAMPLE}/images/*.tar"\nweight = 0.5\n'
        f'[[source]]\nname = "prose"\npath = "{SAMPLE}/prose/*.jsonl"\nweight = 0.5\n'
    )
    cpu = FakeCPU()
    monkeypatch.setattr(stage_profile, "_thread_cpu_ns", cpu.now)
    monkeypatch.setattr(work, "prepare_image", cpu.wrap("image", work.prepare_image))
    monkeypatch.setattr(work, "size_image", cpu.wrap("header", work.size_image))
    runs = {}
    for on in (False, True):  # one worker: it decodes on its own thread
        cpu.calls.clear()
        with ZephonLoader(path, tokenizer_path, 96, 8, num_workers=1, profile=on) as ld:
            runs[on] = step_digests([ld], 4)
    snap = ld.profile.snapshot()
    assert cpu.calls["image"] > 0 and cpu.calls["header"] >= cpu.calls["image"]
    images = cpu.calls["image"] * CHARGES["image"] + cpu.calls["header"] * CHARGES["header"]
    assert snap["cpu_ns"]["image"] == images
    assert snap["cpu_ns"]["read"] == 0  # nothing charged to reading here
    assert runs[True] == runs[False]

    # Two workers: decode processes, whose CPU their tasks report; no decode here.
    cpu.calls.clear()
    with ZephonLoader(path, tokenizer_path, 96, 8, num_workers=2, profile=True) as ld:
        assert step_digests([ld], 4) == runs[False]
    snap = ld.profile.snapshot()
    assert cpu.calls["image"] == 0 and cpu.calls["header"] > 0
    assert snap["threads"]["zephon-decode-processes"]["image"] > 0
    assert set(snap["threads"]["zephon-decode-processes"]) == {"image"}

    with ZephonLoader(make_recipe(workers=2), tokenizer_path, 64, 16, profile=True) as ld:
        step_digests([ld], 4)
        assert ld.stats()["profile"]["cpu_ns"]["image"] == 0
