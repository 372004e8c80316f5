"""Decode processes (zephon/images/decode_processes.py): the same pixels as a decode on
the loader's own thread, written straight into the memory the batch hands the model."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.loader import step_digests
from helpers.train import ensure_sample_data

from zephon import ZephonLoader
from zephon.errors import ImageError
from zephon.images import image_digest, prepare_image, size_image
from zephon.images.decode_processes import DecodeProcesses, Task, decode_processes
from zephon.images.pixels.canary import CANARY_DIR, CANARY_FILES
from zephon.images.shared_patches import PatchArena
from zephon.schema.recipe import ImageSpec

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "data" / "sample"
SPEC = ImageSpec(patch_size=14, merge=2, min_pixels=3136, max_pixels=200_704)


def _decode(pool: DecodeProcesses, arena: PatchArena, docs: list[list[tuple[bytes, str]]]):
    slots = [
        [arena.take(size_image(d, n, SPEC).patch_bytes if d[:2] != b"no" else 64) for d, n in doc]
        for doc in docs
    ]
    task = Task(SPEC, [[(d, n, s) for (d, n), s in zip(doc, ss, strict=True)]
                       for doc, ss in zip(docs, slots, strict=True)], arena.segment_names())  # fmt: skip
    results, cpu_ns = pool.submit(task).result(timeout=60)
    return results, slots, cpu_ns


def _captions(folder: Path) -> Path:
    """The sample's captions on 4 lanes, best_fit, small images."""
    recipe = folder / "captions.toml"
    recipe.write_text(
        '[recipe]\nname = "captions"\nseed = 3\nlanes = 4\n[packing]\nalgorithm = "best_fit"\n'
        "[image]\npatch_size = 8\nmerge = 2\nmin_pixels = 1024\nmax_pixels = 16384\n"
        f'[[source]]\nname = "captions"\npath = "{SAMPLE}/images/*.tar"\n'
    )
    return recipe


def test_the_canary_images_decode_to_the_same_patches_in_a_process():
    """Every kind the pixel definition covers (baseline and progressive JPEG, a
    palette PNG with alpha, a WebP with alpha, an EXIF-rotated JPEG)."""
    files = [(CANARY_DIR / f).read_bytes() for f in CANARY_FILES]
    arena = PatchArena()
    try:
        results, slots, cpu_ns = _decode(
            decode_processes(2), arena, [[(d, f)] for d, f in zip(files, CANARY_FILES, strict=True)]
        )
        assert cpu_ns > 0
        for data, name, result, (slot,) in zip(files, CANARY_FILES, results, slots, strict=True):
            here = prepare_image(data, name, SPEC)
            ((grid, tokens),) = result  # no digest: a batch's is computed when read
            written = arena.view(slot).reshape(here.patches.shape)
            assert (tuple(grid), tokens) == (here.grid, here.num_tokens)
            assert np.array_equal(written, here.patches)
    finally:
        arena.close()


def test_a_bad_image_fails_its_document_only_naming_the_record():
    good = (CANARY_DIR / CANARY_FILES[0]).read_bytes()
    arena = PatchArena()
    try:
        results, _, _ = _decode(
            decode_processes(2), arena,
            [[(good, "a"), (b"not an image", "shard-3/key-9.jpg")], [(good, "b")]],
        )  # fmt: skip
        assert isinstance(results[0], ImageError) and "shard-3/key-9.jpg" in str(results[0])
        assert len(results[1]) == 1 and not isinstance(results[1], ImageError)
    finally:
        arena.close()


def test_a_killed_decode_process_fails_the_call_saying_so_and_the_next_pool_works():
    """The shared pool (`decode_processes`) with a killed process fails the calls it
    holds, and the next ask for a pool of that size starts a new one that decodes."""
    pool = decode_processes(1)
    arena = PatchArena()
    try:
        os.kill(pool._procs[0].pid, signal.SIGKILL)
        pool._procs[0].wait()
        data = (CANARY_DIR / CANARY_FILES[0]).read_bytes()
        with pytest.raises(RuntimeError, match=r"decode process \(pid \d+\) died"):
            _decode(pool, arena, [[(data, "a")]])
        assert pool.broken is not None
        with pytest.raises(RuntimeError, match="died"):  # and every later call too
            _decode(pool, arena, [[(data, "a")]])
        fresh = decode_processes(1)
        assert fresh is not pool and fresh.broken is None
        assert fresh._procs[0].pid != pool._procs[0].pid
        results, _, _ = _decode(fresh, arena, [[(data, "a")]])
        ((grid, tokens),) = results[0]
        here = prepare_image(data, "a", SPEC)
        assert (tuple(grid), tokens) == (here.grid, here.num_tokens)
        assert decode_processes(1) is fresh  # a working pool is kept
    finally:
        pool.close()
        arena.close()


def test_decode_processes_keep_freed_buffers_and_start_no_thread_pool(monkeypatch):
    """glibc's malloc settings in each decode process's environment (the user's own win):
    freed image buffers stay in the process instead of coming back as fresh pages; and
    numpy's import starts no BLAS threads in it (one thread, after a decode)."""
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    pool = DecodeProcesses(1)
    arena = PatchArena()
    try:
        data = (CANARY_DIR / CANARY_FILES[0]).read_bytes()
        _decode(pool, arena, [[(data, "a")]])  # (read before, a process still in its exec
        # can show an empty environment)
        environ = Path(f"/proc/{pool._procs[0].pid}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_MMAP_THRESHOLD_=%d" % (32 << 20) in environ
        assert b"MALLOC_TRIM_THRESHOLD_=12345" in environ
        assert os.listdir(f"/proc/{pool._procs[0].pid}/task") == [str(pool._procs[0].pid)]
    finally:
        pool.close()
        arena.close()


def test_the_loaders_batches_hold_views_of_what_the_processes_wrote(tmp_path, tokenizer_path):
    """Two workers: images decoded in processes, one batch part per image, each a
    view of the shared memory the process wrote (no copy made to assemble the
    batch), freed once the batches are dropped; digests as with one worker, which
    decodes on its own thread into its own memory."""
    ensure_sample_data()
    recipe = _captions(tmp_path)
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=1) as ld:
        inline = step_digests([ld], 3)
    batches: list = []
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=2) as ld:
        assert step_digests([ld], 3, batches) == inline
        arena = ld.ctx.images.arena
        maps = [np.frombuffer(s.map, np.uint8) for s in arena._segments.values()]
        spans = [(m.ctypes.data, m.ctypes.data + m.nbytes) for m in maps]
        del maps
        images = [b.images for step in batches for b in step if b.images is not None]
        assert images and all(len(im.parts) == im.num_images for im in images)
        for im in images:
            for part in im.parts:
                at = part.data_ptr()
                assert any(a <= at and at + part.numel() <= b for a, b in spans)
        assert arena.used_bytes() > 0
        del images, batches, part
        gc.collect()
        held = arena.used_bytes()  # only what the lookahead decoded ahead
    assert held < sum(b - a for a, b in spans)


def test_a_batchs_image_lanes_are_hashed_when_read_from_the_pixels_it_holds(
    tmp_path, tokenizer_path
):
    """No pixel is hashed to make a batch: each image lane's digest is computed when
    first read, from the patches the batch holds, even after later batches reused
    the shared memory of the ones dropped; the values are the inline loader's."""
    ensure_sample_data()
    recipe = _captions(tmp_path)
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=1) as ld:
        inline = [list(ld.next_batch().digests) for _ in range(8)]
    # (no prefetch: a producer ahead of its reader hashes while it waits)
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=2, prefetch=0) as ld:
        kept = []
        for step in range(8):
            batch = ld.next_batch()
            assert batch.images is not None
            per_lane = batch.num_rows // len(batch.digests)
            with_images = len(set((batch.images.rows // per_lane).tolist()))
            assert batch.digests.pending() == with_images > 0  # nothing hashed yet
            if step % 2 == 0:
                kept.append((step, batch))  # the others are dropped: their slots reused
            del batch
            gc.collect()
        for step, batch in reversed(kept):
            assert list(batch.digests) == inline[step]
            assert batch.digests.pending() == 0


def test_a_producer_ahead_of_its_reader_hashes_the_image_lanes_while_it_waits(
    tmp_path, tokenizer_path
):
    """With its prefetch queue full, the producer computes a batch's image lane
    digests before it hands the batch over, off the reader's thread."""
    ensure_sample_data()
    recipe = _captions(tmp_path)
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=1) as ld:
        inline = [list(ld.next_batch().digests) for _ in range(5)]
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=2, prefetch=1) as ld:
        ld.next_batch()
        for step in range(1, 5):
            deadline = time.monotonic() + 30
            while not ld._producer._queue.full() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)  # the producer has made the next batch and waits with it
            batch = ld.next_batch()
            if step > 1:  # (step 1 may have gone into an empty queue)
                assert batch.digests.pending() == 0, step
            assert list(batch.digests) == inline[step]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_next_step_is_packed_and_hurried_before_a_step_waits(
    tmp_path, tokenizer_path, monkeypatch, prefetch
):
    """With decode processes, once the first batch is out, a step's rows are taken
    from the lanes and its tasks hurried before the step before it waits for its
    pixels, so the processes go from one step's images to the next's; the first
    batch packs nothing ahead (its documents alone are planned); the batches are the
    ones a loader that decodes on its own thread gives."""
    from zephon.images import assembly

    ensure_sample_data()
    recipe = _captions(tmp_path)
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=1) as ld:
        inline = step_digests([ld], 6)
    events: list[tuple[str, int]] = []  # (what, step), steps numbered as packed
    real_hurry, real_wait = assembly.BatchImages.hurry, assembly.BatchImages.wait

    def hurry(self):  # noqa: ANN001, ANN202
        self.packed_as = sum(1 for what, _ in events if what == "packed") + 1
        events.append(("packed", self.packed_as))
        return real_hurry(self)

    def wait(self):  # noqa: ANN001, ANN202
        events.append(("waits", self.packed_as))
        return real_wait(self)

    monkeypatch.setattr(assembly.BatchImages, "hurry", hurry)
    monkeypatch.setattr(assembly.BatchImages, "wait", wait)
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=2, prefetch=prefetch) as ld:
        assert step_digests([ld], 6) == inline
    expected = [("packed", 1), ("waits", 1), ("packed", 2)]
    for step in range(2, 6):
        expected += [("packed", step + 1), ("waits", step)]
    assert events[: len(expected)] == expected, events


def test_a_task_holds_small_documents_together_and_a_large_one_alone(
    tmp_path, tokenizer_path, monkeypatch
):
    """After the first batch, a decode task holds documents up to a quarter
    megapixel (a few small ones together: a task costs Python of its own), and a
    larger one alone (a step that needs one document of a task waits for all of it,
    and decodes the others before their steps need them)."""
    from helpers.images import jpeg, write_tar

    from zephon.images.work import MAX_DOCS_PER_TASK, TASK_PIXELS

    tasks: list[list[int]] = []  # per task submitted: each document's decoded pixels
    real_submit = DecodeProcesses.submit

    def submit(self, task):  # noqa: ANN001, ANN202
        pixels = [sum(size_image(d, n, task.spec).header.pixels for d, n, _ in doc)
                  for doc in task.docs]  # fmt: skip
        tasks.append(pixels)
        return real_submit(self, task)

    monkeypatch.setattr(DecodeProcesses, "submit", submit)
    for side in (64, 600):
        members = []
        for i in range(48):
            members += [(f"s{i:03d}.jpg", jpeg(side, side - 8, seed=i)), (f"s{i:03d}.txt", b"a")]
        write_tar(tmp_path / f"{side}.tar", members)
        recipe = tmp_path / f"{side}.toml"
        recipe.write_text(
            f'[recipe]\nname = "r{side}"\nseed = 3\nlanes = 1\n[packing]\nalgorithm = "concat"\n'
            "[image]\npatch_size = 14\nmerge = 2\nmin_pixels = 3136\nmax_pixels = 200704\n"
            f'[[source]]\nname = "s"\npath = "{tmp_path}/{side}.tar"\n'
        )
        tasks.clear()
        with ZephonLoader(recipe, tokenizer_path, 1024, 1, num_workers=2, prefetch=0) as ld:
            for _ in range(6):
                ld.next_batch()
        assert tasks, side
        warm = [t for t in tasks if len(t) > 1]
        if side == 600:  # 600 x 592: 355,200 pixels each
            assert not warm and sum(len(t) for t in tasks) >= 6
        else:  # 64 x 56: 3,584 pixels each
            assert warm and max(len(t) for t in warm) <= MAX_DOCS_PER_TASK
            assert all(sum(t[:-1]) < TASK_PIXELS for t in tasks)


def test_the_tasks_a_step_needs_go_first_in_the_order_steps_asked():
    """`hurry` moves the queued tasks a step needs ahead of every task not hurried,
    in their queue order, and behind the tasks hurried before them that are still
    queued (the step after it, packed while it waits, asks second); one already
    sent, or unknown, changes nothing; a sender's end stays last."""
    from concurrent.futures import Future

    from zephon.images.decode_processes import _TaskQueue

    queue, futures = _TaskQueue(), [Future() for _ in range(7)]
    for k, f in enumerate(futures):
        queue.put((k, f))  # (the task's place: anything)
    queue.put(None)
    queue.hurry([futures[4], futures[2]])
    queue.hurry([Future()])
    queue.hurry([futures[5]])
    assert queue.get()[0] == 2
    queue.hurry([futures[1], futures[5]])  # (5: already hurried, keeps its place)
    assert [queue.get()[0] for _ in range(6)] == [4, 5, 1, 0, 3, 6]
    queue.hurry([futures[0]])  # sent: nothing moves
    assert queue.get() is None


def test_lanes_pack_on_the_headers_while_the_processes_decode(tmp_path, tokenizer_path):
    """With decode processes (bad_records = "error"), a document reaches its lane
    sized from its images' headers: with both processes stopped (SIGSTOP), the
    lanes still take every document the first batch needs (counted as framed, none
    as decoded), and that batch, once the processes go on, has the digest of a
    loader that decodes on its own thread."""

    ensure_sample_data()
    recipe = _captions(tmp_path)
    batches: list = []
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=1) as ld:
        inline = step_digests([ld], 2, batches)
    needed = batches[0][0].images.num_images
    ld = ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=2, prefetch=0)
    pids = [p.pid for p in decode_processes(2)._procs]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        got: list = []
        first = threading.Thread(target=lambda: got.append(step_digests([ld], 1)))
        first.start()
        deadline = time.monotonic() + 30
        framed = 0  # images of documents taken by the lanes (counted when framed)
        while framed < needed and time.monotonic() < deadline:
            time.sleep(0.05)
            framed = ld.stats()["work"]["images_framed"]
        assert framed >= needed, (framed, needed)  # no pixel decoded yet:
        assert ld.stats()["work"]["images_decoded"] == 0
        assert first.is_alive() and not got  # the first batch waits for its own
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    first.join(timeout=60)
    assert got and got[0] == inline[:1]
    assert ld.stats()["work"]["images_decoded"] >= needed  # decoded, now
    assert step_digests([ld], 1) == inline[1:]
    ld.close()


def test_a_step_moves_every_task_it_needs_ahead_before_it_waits(
    tmp_path, tokenizer_path, monkeypatch
):
    """Before the first batch a task holds one document; when the lanes have taken
    the step's rows, every task the step needs goes to the front of the decode
    queue at once, before its first lane waits for pixels: no task the step does not
    need is then queued ahead of one it needs (a lane-by-lane hurry leaves later
    lanes' documents behind others, which the processes decode first). The
    processes are stopped meanwhile, so the queue holds still; the batch is the
    one a loader that decodes on its own thread gives."""
    from zephon.images import assembly, work

    ensure_sample_data()
    recipe = _captions(tmp_path)
    with ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=1) as ld:
        inline = step_digests([ld], 1)
    pool = decode_processes(2)
    first_tasks: list = []  # the docs of each task submitted before the first batch
    real_submit = DecodeProcesses.submit

    def submit(self, task):  # noqa: ANN001, ANN202
        first_tasks.append(len(task.docs))
        return real_submit(self, task)

    needed: list = []  # the decode tasks of the first step's images
    real_add = assembly.BatchImages.add_row

    def add_row(self, row, placed):  # noqa: ANN001, ANN202
        if not seen:  # (the first step only)
            late = [im.patches for _, im in placed if not isinstance(im.patches, np.ndarray)]
            needed.extend(p._doc._future for p in late)
        return real_add(self, row, placed)

    seen: list = []  # the queue's futures, in order, when the first wait began
    real_get = work._LateDoc.get

    def get(self, i):  # noqa: ANN001, ANN202
        if not seen:
            with pool._tasks._ready:
                seen.append([x[1] for x in pool._tasks._items if x is not None])
        return real_get(self, i)

    monkeypatch.setattr(DecodeProcesses, "submit", submit)
    monkeypatch.setattr(assembly.BatchImages, "add_row", add_row)
    monkeypatch.setattr(work._LateDoc, "get", get)
    pids = [p.pid for p in pool._procs]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        ld = ZephonLoader(recipe, tokenizer_path, 256, 8, num_workers=2, prefetch=0)
        got: list = []
        first = threading.Thread(target=lambda: got.append(step_digests([ld], 1)))
        first.start()
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen, "the first step never waited for a decode"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    first.join(timeout=60)
    ld.close()
    assert got == [inline]
    queued = seen[0]
    wanted = {id(f) for f in needed}
    flags = [id(f) in wanted for f in queued]
    assert sum(flags) >= 2 and not flags[-1], flags  # the step's tasks, and others behind
    assert flags == sorted(flags, reverse=True), flags  # needed ones first, all of them
    assert first_tasks and set(first_tasks[: len(queued)]) == {1}, first_tasks


def test_a_call_planned_before_the_first_batch_gives_a_task_each_document(tokenizer_path):
    """The tasks of a planned call: one document each before the first batch (so a
    step can move exactly its own documents ahead), a few after it (fewer pickles
    and wake-ups); the same pixels either way."""
    from zephon.images.work import MAX_DOCS_PER_TASK, ImageWork
    from zephon.sources.multimodal import ImageSegment, MultimodalDoc, TextSegment
    from zephon.tokenize.tokenizer import load_tokenizer

    files = [(CANARY_DIR / f).read_bytes() for f in CANARY_FILES]
    docs = [
        MultimodalDoc(f"doc{i}", (TextSegment("a photo"), ImageSegment(files[i % 2], f"doc{i}")))
        for i in range(32)
    ]
    work = ImageWork(SPEC, load_tokenizer(tokenizer_path), decoders=2)
    sizes: dict[bool, list[int]] = {}
    digests: dict[bool, list[bytes]] = {}
    for cold in (True, False):
        values = [work.size(d) for d in docs]
        work.start(values, cold)
        started = [work._started[id(v)] for v in values]
        tasks = {id(future): future for _, future, _, _ in started}
        sizes[cold] = [sum(1 for s in started if s[1] is f) for f in tasks.values()]
        digests[cold] = [
            image_digest(p.grid, p.patches) for v in values for p in work._take_started(v)
        ]
    assert sizes[True] == [1] * 32
    assert sizes[False] == [MAX_DOCS_PER_TASK] * 4
    assert digests[True] == digests[False]
