"""Images through the lanes (issue 18, the loader half): the same global batches,
pixels included, for any rank count, worker count and lookahead; no image ever
split across rows; labels ignored at image tokens; a byte budget that bounds
decoded pixels; bad images named or dropped; the decode canary on resume.

The corpus is the bundled sample (WebDataset captions, interleaved Parquet,
prose JSONL), small rows so that images often meet a row's end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import REPO
from helpers.images import jpeg, png, write_tar
from helpers.loader import close, make_ranks, save, step_digests
from helpers.train import ensure_sample_data

from zephon import StateError, ZephonLoader, load_recipe
from zephon.errors import DataError
from zephon.images import work
from zephon.images.prepare import prepare_image

SAMPLE = REPO / "data" / "sample"
TOKENIZER = str(REPO / "assets" / "tokenizer" / "tokenizer.json")
SEQ = 96  # blocks of up to 66 tokens: images often meet a row's end
IMAGE = "[image]\npatch_size = 8\nmerge = 2\nmin_pixels = 1024\nmax_pixels = 16384\n"


@pytest.fixture(autouse=True, scope="module")
def shared_index_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One index cache for the module: the sample's shards are indexed once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEPHON_CACHE_DIR", str(tmp_path_factory.mktemp("index-cache")))
        yield


def sources(captions: float = 0.4, interleaved: float = 0.3, prose: float = 0.3) -> str:
    """The sample's three sources at these weights (0: left out)."""
    tables = [
        (captions, f'name = "captions"\npath = "{SAMPLE}/images/*.tar"'),
        (
            interleaved,
            f'name = "interleaved"\npath = "{SAMPLE}/images_interleaved/*.parquet"\n'
            'texts_field = "texts"\nimages_field = "images"',
        ),
        (prose, f'name = "prose"\npath = "{SAMPLE}/prose/*.jsonl"'),
    ]
    return "".join(f"[[source]]\n{t}\nweight = {w}\n" for w, t in tables if w)


def recipe(
    tmp_path: Path,
    algorithm: str = "best_fit",
    lanes: int = 8,
    flush: int = 3,
    body: str = "",
    bad: str = "error",
    shuffle: bool = True,
) -> Path:
    ensure_sample_data()
    text = (
        f'[recipe]\nname = "img"\nseed = 7\nlanes = {lanes}\nbad_records = "{bad}"\n'
        f'[packing]\nalgorithm = "{algorithm}"\nopen_bins = 3\nflush_interval = {flush}\n'
        f"[shuffle]\nenabled = {str(shuffle).lower()}\nblock_size = 16\n"
        f"{IMAGE}{body or sources()}"
    )
    path = tmp_path / f"{algorithm}.toml"
    path.write_text(text)
    return path


def ranks(path: Path, dp: int, **kw: Any) -> list[ZephonLoader]:
    kw.setdefault("seq_len", SEQ)
    kw.setdefault("global_batch_size", 16)
    kw.setdefault("prefetch", 0)
    return make_ranks(path, TOKENIZER, dp, **kw)


def run(path: Path, dp: int, steps: int, **kw: Any) -> list[str]:
    loaders = ranks(path, dp, **kw)
    try:
        return step_digests(loaders, steps)
    finally:
        close(loaders)


def check_rows(batch: Any, token_ids: Any, merge: int) -> int:
    """Every image of the batch whole inside one row's inputs, at its placeholders,
    with merge² patches per placeholder; no placeholder or image token elsewhere.
    Returns the number of images."""
    tokens = batch.input_ids.numpy()
    labels = batch.labels.numpy()
    start, pad, end = token_ids.start, token_ids.pad, token_ids.end
    im = batch.images
    n = 0 if im is None else im.num_images
    rows = np.zeros(0, dtype=np.int64) if im is None else im.rows.numpy()
    counts = np.zeros(0, dtype=np.int64) if im is None else im.tokens().numpy()
    if im is not None:
        offsets = im.patch_offsets().numpy()
        np.testing.assert_array_equal(np.diff(offsets), counts * merge * merge)
        assert im.patches.shape[0] == offsets[-1]
        for k in range(n):
            r, s, c = int(rows[k]), int(im.starts[k]), int(counts[k])
            assert s >= 1 and s + c <= tokens.shape[1], (k, r, s, c)  # inside the inputs
            assert tokens[r, s - 1] == start and (tokens[r, s : s + c] == pad).all()
            assert s + c == tokens.shape[1] or tokens[r, s + c] == end
            # targets start, placeholders and end are ignored
            assert (labels[r, max(s - 2, 0) : s + c] == -100).all()
    for r in range(tokens.shape[0]):
        mine = rows == r
        # a split image would leave placeholders or an end token at a row's start,
        # or a start token without its image
        assert tokens[r, 0] not in (pad, end), r
        assert (tokens[r] == start).sum() == mine.sum(), r
        assert (tokens[r] == pad).sum() == counts[mine].sum(), r
    return n


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_digests_equal_across_ranks_workers_lookahead_and_resume(tmp_path, algorithm, monkeypatch):
    """Neither D, workers, prefetch nor the token and byte budgets change a digest;
    a resume at another D gives every later digest (concat resumes mid-document at
    flush points); and one pixel changed changes the digest of its step."""
    path = recipe(tmp_path, algorithm)
    ref = run(path, 1, 6, num_workers=0)
    assert len(set(ref)) == 6
    assert run(path, 2, 6, num_workers=2, prefetch=2) == ref
    assert run(path, 4, 6, num_workers=2, lookahead_tokens=1, lookahead_bytes=1) == ref
    assert run(path, 4, 6, num_workers=0, lookahead_tokens=10**6, lookahead_bytes=8 << 20) == ref
    two = ranks(path, 2, num_workers=2)
    assert step_digests(two, 4) == ref[:4]
    state = save(two)
    close(two)
    assert "decode_canary" in state["fingerprint"]
    for dp in (1, 4):
        resumed = ranks(path, dp, num_workers=2)
        for loader in resumed:
            loader.load_state_dict(state)
        assert step_digests(resumed, 2) == ref[4:], dp
        close(resumed)

    def one_pixel_off(data: bytes, name: str, spec: Any, plan: Any = None) -> Any:
        out = prepare_image(data, name, spec, plan)
        out.patches[0, 0] ^= 1  # the same tokens, grid and rows; one pixel differs
        return out

    monkeypatch.setattr(work, "prepare_image", one_pixel_off)
    other = run(path, 1, 6, num_workers=0)
    assert all(a != b for a, b in zip(other, ref, strict=True))


def test_workers_decode_images_in_processes_and_free_their_memory(tmp_path, monkeypatch):
    """With 2 workers a call's documents go to the decode processes once each, when
    the call is planned (not when the tokenizer thread reaches it); no image is
    decoded on a loader thread; the shared memory they wrote into is unlinked
    when the loader closes. The bytes are the inline loader's (test above)."""
    import os
    from collections import Counter

    from zephon.images.shared_patches import SHM_DIR

    count: Counter[str] = Counter()
    submitted: list[Any] = []  # kept alive, so that ids are not reused
    real_start, real_submit = work.ImageWork.start, work.ImageWork._submit
    real_claim, real_prepare = work.ImageWork._claim, work.prepare_image

    def start(self: Any, values: list[Any], cold: bool = False) -> None:
        count["started"] += sum(map(work._decodable, values))
        real_start(self, values, cold)

    def submit(self: Any, chunk: list[Any]) -> None:
        submitted.extend(chunk)
        real_submit(self, chunk)

    def claim(self: Any, v: Any, result: Any, slots: Any) -> Any:
        count["claimed"] += 1
        return real_claim(self, v, result, slots)

    def prepare(*args: Any, **kwargs: Any) -> Any:
        count["decoded here"] += 1
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(work.ImageWork, "start", start)
    monkeypatch.setattr(work.ImageWork, "_submit", submit)
    monkeypatch.setattr(work.ImageWork, "_claim", claim)
    monkeypatch.setattr(work, "prepare_image", prepare)
    path = recipe(tmp_path, body=sources(0.5, 0.5, 0.0))
    (loader,) = ranks(path, 1, num_workers=2, prefetch=2)
    for _ in range(20):
        loader.next_batch()
    segments = loader.ctx.images.arena.segment_names()
    assert segments and all(os.path.exists(f"{SHM_DIR}/{n}") for n in segments)
    loader.close()
    assert count["decoded here"] == 0, count
    # every decode was sent with its call, none twice (calls still queued at close
    # may not have been taken)
    assert 0 < count["claimed"] <= count["started"] == len(submitted), count
    assert len({id(v) for v in submitted}) == len(submitted)
    assert not [n for n in segments if os.path.exists(f"{SHM_DIR}/{n}")]


@pytest.mark.parametrize("workers", [0, 1])
def test_each_image_header_is_parsed_once(tmp_path, monkeypatch, workers):
    """A decode on a loader thread (fewer than 2 workers) uses the opened image its
    read-time plan kept: Pillow opens each image once, not once for the header and
    again to decode it. (A decode process opens the bytes it was sent: an opened
    image cannot cross to it.)"""
    import sys
    from collections import Counter

    from zephon.images import header, prepare
    from zephon.images.pixels import canary

    decode = sys.modules[
        "zephon.images.pixels.decode"
    ]  # the package exports a function of that name

    count: Counter[str] = Counter()
    real_open, real_plan, real_prepare = header.open_image, work.size_image, work.prepare_image

    def opening(data: bytes, name: str, limit: int) -> Any:
        if not name.startswith(str(canary.CANARY_DIR)):  # the loader's own check, at start
            count["opened"] += 1
        return real_open(data, name, limit)

    def planning(*args: Any, **kwargs: Any) -> Any:
        count["planned"] += 1
        return real_plan(*args, **kwargs)

    def preparing(*args: Any, **kwargs: Any) -> Any:
        count["decoded"] += 1
        return real_prepare(*args, **kwargs)

    for module in (prepare, decode):  # where images are opened
        monkeypatch.setattr(module, "open_image", opening)
    monkeypatch.setattr(work, "size_image", planning)
    monkeypatch.setattr(work, "prepare_image", preparing)
    path = recipe(tmp_path, body=sources(0.5, 0.5, 0.0))
    (loader,) = ranks(path, 1, num_workers=workers, prefetch=workers * 2)
    for _ in range(8):
        loader.next_batch()
    loader.close()
    assert count["decoded"] > 20, count
    assert count["opened"] == count["planned"], count


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_no_image_is_split_and_placeholders_match_patches(tmp_path, algorithm):
    """Every row of a long run (1,920 rows): each image whole in one row's inputs,
    placeholders = patches / merge², image-token targets ignored."""
    path = recipe(tmp_path, algorithm, body=sources(0.5, 0.4, 0.1))
    (loader,) = ranks(path, 1, num_workers=2, prefetch=2)
    ids = loader.ctx.images.ids
    images = sum(check_rows(loader.next_batch(), ids, 2) for _ in range(120))
    work = loader.stats()["work"]
    loader.close()
    assert images > 1500
    assert work["images_decoded"] >= images


def test_image_token_targets_are_the_only_extra_ignored_labels(tmp_path):
    """Labels are the next tokens except where the next token is padding or an
    image token (start, placeholder, end); the text after an image is a target."""
    path = recipe(tmp_path, "concat")
    (loader,) = ranks(path, 1, num_workers=0)
    ids, pad_id = loader.ctx.images.ids, loader.tok.pad_id
    for _ in range(4):
        b = loader.next_batch()
        tokens, labels = b.input_ids.numpy(), b.labels.numpy()[:, :-1]
        nxt = tokens[:, 1:]  # the targets of all but the last input
        image = np.isin(nxt, [ids.start, ids.pad, ids.end])
        padding = nxt == pad_id  # concat pads only where an image would cross a row's end
        assert image.any() and (nxt == ids.end).any()
        np.testing.assert_array_equal(labels, np.where(image | padding, -100, nxt))
    loader.close()


def test_byte_budget_bounds_decoded_pixels_in_flight(tmp_path):
    """Image bytes reserved ahead (patches queued or held, the decode peaks of
    as many documents as decode at once) stay within the byte budget plus what
    the step being produced needs, measured with a budget of 1 byte (nothing
    speculative). The token budget is huge, so only the byte budget can hold
    lookahead back: ignoring it peaks at about 40 MB here."""

    def peak(budget_bytes: int) -> int:
        (loader,) = ranks(
            path, 1, seq_len=128, global_batch_size=8, num_workers=2, prefetch=2,
            lookahead_tokens=10**6, lookahead_bytes=budget_bytes,
        )  # fmt: skip
        for _ in range(30):
            loader.next_batch()
        work = loader.stats()["work"]
        loader.close()
        assert work["lookahead_bytes_budget"] == budget_bytes
        return int(work["lookahead_peak_bytes"])

    path = recipe(tmp_path)
    floor = peak(1)
    # one step's documents' patches and two decode peaks (of at most a megabyte:
    # images up to 256 x 256): a few megabytes
    assert floor < 8 << 20
    bound = 8 << 20
    got = peak(bound)
    assert bound // 2 <= got <= bound + floor, (got, floor)


def _bad_shard(root: Path, kind: str) -> Path:
    good = [jpeg(40 + 8 * i, 48, seed=i) for i in range(5)]
    bad = {
        "truncated": good[0][: len(good[0]) // 2],
        "not_an_image": b"hello, these bytes are no image at all",
        "zero_size": b"",
        "huge": png(9000, 8000, 8, 2, None),  # the header claims 72 megapixels
    }[kind]
    members = []
    for i, data in enumerate([good[0], bad, *good[1:]]):
        members += [(f"s{i:03d}.jpg", data), (f"s{i:03d}.txt", f"caption {i}".encode())]
    return write_tar(root / f"{kind}.tar", members)


BAD_KINDS = {
    "truncated": "cannot decode the JPEG image",
    "not_an_image": "not an image",
    "zero_size": "zero-size",
    "huge": "exceeds max_decoded_pixels",
}


@pytest.mark.parametrize("kind", list(BAD_KINDS))
def test_bad_images_name_shard_and_key_or_are_dropped(tmp_path, kind):
    shard = _bad_shard(tmp_path, kind)
    body = f'[[source]]\nname = "c"\npath = "{shard}"\non_exhausted = "stop"\n'
    path = recipe(tmp_path, "concat", lanes=1, body=body, shuffle=False)
    text = path.read_text()
    kw = {"seq_len": 64, "global_batch_size": 1, "num_workers": 2}
    (loader,) = ranks(path, 1, **kw)
    with pytest.raises(DataError, match=BAD_KINDS[kind]) as err:
        for _ in range(20):
            loader.next_batch()
    loader.close()
    assert f"{shard}: key s001" in str(err.value)
    # under "drop": the record is an empty document, counted; every good image arrives
    path.write_text(text.replace('bad_records = "error"', 'bad_records = "drop"'))
    (loader,) = ranks(path, 1, **kw)
    images = 0
    for batch in loader:
        images += 0 if batch.images is None else batch.images.num_images
    assert loader.dropped_records() == 1
    assert loader.state_dict()["dropped_records"] == {"c": [1]}
    loader.close()
    assert images == 5


@pytest.mark.parametrize("kind", ["not_an_image", "truncated"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_bad_image_stops_the_run_at_its_own_step_with_decode_processes(tmp_path, kind, prefetch):
    """With decode processes, a step is packed while the one before it waits for its
    pixels: a bad image met doing so (a bad header, when its lane takes it; or its
    body, when the step waits for it) is raised at the step whose rows hold it, as
    on the calling thread, after every batch before it."""
    good = [jpeg(40 + 8 * (i % 5), 48, seed=i) for i in range(24)]
    bad = {"not_an_image": b"no image at all", "truncated": good[3][: len(good[3]) // 2]}[kind]
    members = []
    for i, data in enumerate([*good[:16], bad, *good[16:]]):
        members += [(f"s{i:03d}.jpg", data), (f"s{i:03d}.txt", f"caption {i}".encode())]
    shard = write_tar(tmp_path / "late.tar", members)
    body = f'[[source]]\nname = "c"\npath = "{shard}"\non_exhausted = "stop"\n'
    path = recipe(tmp_path, "concat", lanes=1, body=body, shuffle=False)

    def delivered(workers: int) -> int:
        (loader,) = ranks(path, 1, seq_len=64, global_batch_size=1, num_workers=workers,
                          prefetch=prefetch if workers > 1 else 0)  # fmt: skip
        steps = 0
        try:
            with pytest.raises(DataError, match=BAD_KINDS[kind]):
                for _ in range(60):
                    loader.next_batch()
                    steps += 1
        finally:
            loader.close()
        return steps

    inline = delivered(1)
    assert inline >= 4  # past the first batch: a step packed ahead meets it
    assert delivered(2) == inline


def test_an_image_longer_than_a_row_is_an_error_or_left_out(tmp_path):
    """Rows of 49 tokens hold image blocks of up to 49 tokens: a longer one is an
    error naming its record, or under "drop" left out of its document (the text
    stays), counted; the same data at every D."""
    path = recipe(tmp_path, "best_fit", body=sources(0.6, 0.4, 0.0))
    with pytest.raises(DataError, match=r"key train-\d+ .*does not fit in a row of 49 tokens"):
        run(path, 1, 4, seq_len=48)
    path.write_text(path.read_text().replace('"error"', '"drop"'))
    (loader,) = ranks(path, 1, seq_len=48, num_workers=2)
    longest = 0
    for _ in range(6):
        b = loader.next_batch()
        if b.images is not None:
            check_rows(b, loader.ctx.images.ids, 2)
            longest = max(longest, int(b.images.tokens().max()) + 2)
    dropped = loader.dropped_records()
    loader.close()
    assert 0 < longest <= 49 and dropped > 0
    assert run(path, 2, 6, seq_len=48) == run(path, 4, 6, seq_len=48, num_workers=0)


def test_phase_boundary_carries_image_documents_and_resumes_exactly(tmp_path):
    """concat at a seq_len change: a document cut at the boundary is carried at a
    token offset outside any image block; the next phase, with rows too short for
    some images, leaves them out from that offset on. A resume from the boundary
    checkpoint (carried documents read again) at another D gives the same digests."""
    phases = (
        '[[phase]]\nname = "a"\nstart_step = 0\nseq_len = 128\n'
        '[[phase]]\nname = "b"\nstart_step = 3\nseq_len = 48\n'
    )
    path = recipe(tmp_path, "concat", flush=2, bad="drop", body=sources(0.6, 0.4, 0.0) + phases)
    ref = run(path, 1, 7)
    two = ranks(path, 2)
    assert step_digests(two, 3) == ref[:3]
    boundary = save(two)
    assert step_digests(two, 1) == ref[3:4]
    inside = save(two)  # lanes may still be emitting what they carried
    ctx = two[0].ctx
    carried = [c for e in boundary["lanes"].values() for c in e["flush"].get("carry", [])]
    assert carried, "expected documents cut at the boundary"
    for name, doc, off in carried:
        ids = ctx.fetch([s.name for s in ctx.recipe.sources].index(name), doc)
        assert not any(a < off < b for a, b in ids.blocks()), (name, doc, off)
    close(two)
    for state, dp in ((boundary, 1), (boundary, 4), (inside, 1)):
        resumed = ranks(path, dp)
        for loader in resumed:
            loader.load_state_dict(state)
        assert step_digests(resumed, 7 - state["step"]) == ref[state["step"] :], dp
        assert sum(loader.dropped_records() for loader in resumed) > 0
        close(resumed)


def test_resume_on_another_decoder_is_refused_naming_both_machines(tmp_path):
    path = recipe(tmp_path)
    (loader,) = ranks(path, 1)
    loader.next_batch()
    state = loader.state_dict()
    loader.close()
    canary = state["fingerprint"]["decode_canary"]
    canary["digest"] = "0" * 64
    canary["decoders"]["libjpeg_turbo"] = "1.0.0-elsewhere"
    other = ranks(path, 2)  # another size: the canary is checked whatever the layout
    with pytest.raises(StateError, match="decode to other pixels") as err:
        other[1].load_state_dict(state)
    close(other)
    assert "1.0.0-elsewhere there" in str(err.value)  # the checkpoint's machine
    assert "This machine: " in str(err.value)


def test_text_only_recipes_have_no_canary(make_recipe, tokenizer_path):
    (loader,) = make_ranks(make_recipe(), tokenizer_path, 1)
    assert "decode_canary" not in loader.fingerprint
    assert loader.ctx.images is None
    loader.close()
    assert load_recipe(make_recipe()).execution.lookahead_bytes == 0


class _Lane:
    """A stand-in lane for one packer: hands out documents, records rows and points."""

    def __init__(self, docs: list[Any]):
        self.docs, self.rows, self.points, self.rows_emitted = list(docs), [], [], 0

    def pick(self) -> Any:
        return self.docs.pop(0) if self.docs else None

    def snapshot(self) -> tuple:
        return ()

    def emit(self, pieces: list[Any]) -> None:
        self.rows.append(pieces)
        self.rows_emitted += 1

    def flush_point(self, snapshot: tuple, skip: int, carry: Any) -> None:
        self.points.append((self.rows_emitted, skip, list(carry)))


class _Drops:
    def __init__(self) -> None:
        self.dropped: dict[int, str] = {}

    def drop(self, i: int, exc: Exception) -> None:
        self.dropped[i] = str(exc)


def _document(parts: list[Any]) -> Any:
    """An ImageDocIds of text runs (ints: that many text tokens) and images (tuples:
    placeholders), ids counting up so that every token is distinct."""
    from zephon.images.documents import DocImage, ImageDoc, ImageDocIds

    ids, images, at = [], [], 0
    for p in parts:
        n = p[0] + 2 if isinstance(p, tuple) else p
        if isinstance(p, tuple):
            grid = (2, 2 * p[0])
            patches = np.zeros((4 * p[0], 12), dtype=np.uint8)
            images.append(DocImage(at, p[0], grid, patches, f"img@{at}"))
        ids += range(1000 + at, 1000 + at + n)
        at += n
    return ImageDocIds.make(np.array(ids), ImageDoc(tuple(images)))


def test_concat_carries_offsets_of_the_workers_document_across_a_boundary():
    """A concat document cut at a phase boundary after an image its rows left out
    (too long for rows of 16) continues, in rows of 30 that could hold that image,
    exactly after the tokens already emitted: the carry's offset is in the worker's
    document, which the next segment refits whether it kept it or reads it again."""
    from zephon.images.documents import fit_row
    from zephon.lanes.packing import ConcatPacker

    whole = _document([5, (3,), 3, (20,), 1, (4,), 9, 11])
    drops = _Drops()
    first = fit_row(whole, 16, drops, 7)
    assert len(first) == len(whole) - 22 and list(drops.dropped) == [7]
    lane = _Lane([(first, 0, 7)])
    packer = ConcatPacker(16, flush_interval=100, end_row=2)
    while lane.rows_emitted < 2:
        packer.fill(lane)
    (_, _, carry), *_ = lane.points
    (source, doc, off) = carry[0]
    emitted = [int(t) for pieces in lane.rows for ids, _, _ in pieces for t in ids]
    # the 6-token image that would cross the end of row 1 starts row 2: row 1 is padded
    assert [len(ids) for ids, _, _ in lane.rows[0]] == [14]
    assert off == 30 + 22  # in the worker's document, past the image left out
    rest = fit_row(whole, 30, None, doc, after=off)  # what a resumed lane reads again
    lane2 = _Lane([])
    nxt = ConcatPacker(30, flush_interval=100, carry=[(rest, source, doc, off)])
    nxt.fill(lane2)
    emitted += [int(t) for pieces in lane2.rows for ids, _, _ in pieces for t in ids]
    assert emitted == [int(t) for t in first]  # every token once, the long image left out


def test_validate_scan_decodes_images_and_preview_shows_them(tmp_path, capsys):
    from zephon.tools.cli import main

    members = []
    for kind in BAD_KINDS:
        for name, data in write_tar_members(_bad_shard(tmp_path, kind)):
            members.append((f"{kind}-{name}", data))
    shard = write_tar(tmp_path / "all.tar", members)
    body = f'[[source]]\nname = "c"\npath = "{shard}"\n'
    path = recipe(tmp_path, "concat", lanes=1, body=body)
    assert main(["validate", str(path), "--scan", "--scan-workers", "1"]) == 2
    out = capsys.readouterr()
    assert "24 records read, 4 bad" in out.out
    for kind, why in BAD_KINDS.items():
        (line,) = [s for s in out.out.splitlines() if f"key {kind}-s001" in s]
        assert why in line and str(shard) in line
    # preview: each image of a row shown in place of its tokens
    sample = recipe(tmp_path, "concat", lanes=2)
    argv = ["preview", str(sample), "--seq-len", str(SEQ), "--lane", "1", "--rows", "4"]
    assert main([*argv, "--chars", "400"]) == 0
    lines = capsys.readouterr().out.splitlines()
    heads = [s for s in lines if s.startswith("--- lane 1 row ")]
    said = sum(int(s.split(", ")[-1].split(" image")[0]) for s in heads if "image(s)" in s)
    shown = sum(s.count("<image ") for s in lines)
    assert said > 0 and shown == said, lines


def write_tar_members(path: Path) -> list[tuple[str, bytes]]:
    import tarfile

    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]


def test_the_hf_baseline_refuses_sources_with_images(tmp_path):
    from torchtitan.datasets.hf_baseline.corpus import _load_source

    spec = load_recipe(recipe(tmp_path)).sources[0]
    with pytest.raises(DataError, match="source 'captions'.*holds images.*reads text only"):
        _load_source(spec, str(tmp_path))


def test_reduced_decode_keeps_its_batches_at_any_size_and_is_refused_across(tmp_path):
    """`[image] decode = "reduced"` on JPEGs over twice their target a side: other
    pixels than the exact decode, the same on one rank in this process and on two
    ranks with decode processes; a checkpoint of the exact run is refused by name."""
    members = []
    for i in range(24):
        members += [(f"{i:04d}.jpg", jpeg(300 + 20 * i, 420, seed=i)), (f"{i:04d}.txt", b"a photo")]
    tar = write_tar(tmp_path / "photos.tar", members)
    body = f'[[source]]\nname = "photos"\npath = "{tar}"\n'
    exact = recipe(tmp_path, body=body)
    reduced = tmp_path / "reduced.toml"
    reduced.write_text(exact.read_text().replace("[image]\n", '[image]\ndecode = "reduced"\n'))
    ref = run(reduced, 1, 3)
    assert run(reduced, 2, 3, num_workers=2) == ref
    assert run(exact, 1, 3) != ref
    (loader,) = ranks(exact, 1)
    loader.next_batch()
    state = loader.state_dict()
    loader.close()
    other = ranks(reduced, 2)
    with pytest.raises(StateError) as err:
        other[1].load_state_dict(state)
    close(other)
    assert "image.decode: checkpoint has 'exact', this run has 'reduced'" in str(err.value)
