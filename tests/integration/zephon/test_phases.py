"""Recipe phases: the batch of every step stays a pure function of (recipe, step)
across batch-size ramps, mixture changes, a new source, a longer seq_len and a
lane-count change; at any data-parallel size, worker and prefetch setting, and
across resumes inside each phase and exactly at each boundary."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.corpus import COMMITTED_TOKENIZER
from helpers.loader import close, make_ranks, save, step_digests
from helpers.packing import DOCS, PAD, ROW, ListLane
from helpers.packing import SOURCES as KINDS

from zephon import LayoutError, RecipeError, StateError, ZephonLoader, load_recipe, load_tokenizer
from zephon.lanes.documents import ShuffledLaneDocs
from zephon.lanes.packing import BestFitPacker, ConcatPacker, RowBuilder
from zephon.lanes.shuffle import SourceShuffle
from zephon.recipe.phases import resolve_phases
from zephon.state.checkpoint_state import boundary_of, started_phases
from zephon.state.lane_count_deal import build_lane_docs, deal_source
from zephon.tools.cli import main

SOURCES = [("prose", 300, 0.7), ("code", 200, 0.3), ("math", 150, 1.0)]
# Four phases: a ramp 12 -> 24 -> 48 rows, seq_len 128 -> 256, a new source with
# new weights, and 12 -> 24 lanes.
FOUR = """
[[phase]]
name = "warmup"
start_step = 0
global_batch_size = 12
seq_len = 128
weights = { prose = 0.7, code = 0.3 }

[[phase]]
name = "ramp"
start_step = 2
global_batch_size = 24

[[phase]]
name = "long"
start_step = 4
global_batch_size = 48
seq_len = 256

[[phase]]
name = "anneal"
start_step = 6
weights = { prose = 0.2, code = 0.3, math = 0.5 }
lanes = 24
"""
STEPS = 9
SHAPES = [(12, 128)] * 2 + [(24, 128)] * 2 + [(48, 256)] * 5
NAMES = ["warmup"] * 2 + ["ramp"] * 2 + ["long"] * 2 + ["anneal"] * 3


def four_phases(make_recipe: Any, algorithm: str = "concat", **kw: Any) -> Path:
    kw.setdefault("sources", SOURCES)
    return make_recipe(
        lanes=12, algorithm=algorithm, flush_interval=3, block_size=8, extra=FOUR, **kw
    )


def run(recipe: Path, tok: str, dp: int, steps: int, **kw: Any) -> list[str]:
    loaders = make_ranks(recipe, tok, dp, **kw)
    try:
        return step_digests(loaders, steps)
    finally:
        close(loaders)


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_four_phases_same_digests_for_every_dp_workers_and_prefetch(
    make_recipe, tokenizer_path, algorithm
):
    recipe = four_phases(make_recipe, algorithm)
    loader = ZephonLoader(recipe, tokenizer_path, 64, 8, num_workers=0, prefetch=0)
    batches = [loader.next_batch() for _ in range(STEPS)]
    loader.close()
    assert [b.phase for b in batches] == NAMES
    assert [tuple(b.input_ids.shape) for b in batches] == SHAPES
    assert [len(b.digests) for b in batches] == [12] * 6 + [24] * 3
    reference = run(recipe, tokenizer_path, 1, STEPS, num_workers=0, prefetch=0)
    assert len(set(reference)) == STEPS
    for dp in (2, 4):
        for workers, prefetch, lookahead in ((1, 1, 1), (2, 3, None)):
            got = run(
                recipe,
                tokenizer_path,
                dp,
                STEPS,
                num_workers=workers,
                prefetch=prefetch,
                lookahead_tokens=lookahead,
            )
            assert got == reference, (dp, workers, prefetch, lookahead)


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_resume_inside_each_phase_and_at_each_boundary_at_another_dp(
    make_recipe, tokenizer_path, algorithm
):
    recipe = four_phases(make_recipe, algorithm)
    reference = run(recipe, tokenizer_path, 1, STEPS)
    # One run at D = 2 saves after every step: 2, 4, 6 are boundaries, the rest inside.
    first = make_ranks(recipe, tokenizer_path, 2, num_workers=2, prefetch=2)
    states = {}
    for k in range(1, STEPS - 1):
        assert step_digests(first, 1) == reference[k - 1 : k]
        states[k] = json.loads(json.dumps(save(first)))
    close(first)
    assert states[6]["boundary_of"] == "anneal" and states[6]["num_lanes"] == 12
    for k, state in states.items():
        dp = (1, 4, 3)[k % 3] if k >= 6 else (1, 4)[k % 2]
        resumed = make_ranks(recipe, tokenizer_path, dp)
        for loader in resumed:
            loader.load_state_dict(state)
        assert step_digests(resumed, STEPS - k) == reference[k:], (k, dp)
        close(resumed)


def test_through_the_lane_change_at_dp3_then_resumed_at_dp8(make_recipe, tokenizer_path):
    recipe = four_phases(make_recipe)
    reference = run(recipe, tokenizer_path, 1, STEPS)
    three = make_ranks(recipe, tokenizer_path, 3)
    assert step_digests(three, 7) == reference[:7]  # crossed with the merged state
    assert list(three[0].lane_ids) == list(range(8))
    state = save(three)
    close(three)
    assert state["deals"] and state["num_lanes"] == 24
    eight = make_ranks(recipe, tokenizer_path, 8)
    for loader in eight:
        loader.load_state_dict(state)
    assert step_digests(eight, STEPS - 7) == reference[7:]
    close(eight)
    # Uneven lanes (docs/design.md §2): 8 ranks run the 12-lane phases too, from
    # step 0 and from a checkpoint before the lane change, with the same digests.
    fresh = make_ranks(recipe, tokenizer_path, 8)
    assert step_digests(fresh, STEPS) == reference
    early = make_ranks(recipe, tokenizer_path, 4)
    step_digests(early, 5)
    resumed = make_ranks(recipe, tokenizer_path, 8)
    for loader in resumed:
        loader.load_state_dict(save(early))
    assert step_digests(resumed, STEPS - 5) == reference[5:]
    # More ranks than a phase has lanes are refused, naming the phase, before a batch.
    too_many = make_ranks(recipe, tokenizer_path, 13)
    with pytest.raises(
        LayoutError, match="phase 'warmup' \\(from step 0\\): data-parallel size 13"
    ):
        too_many[0].next_batch()
    close(fresh + early + resumed + too_many)


def test_a_rank_without_every_lane_waits_for_the_merged_state(make_recipe, tokenizer_path):
    recipe = four_phases(make_recipe)
    two = make_ranks(recipe, tokenizer_path, 2, num_workers=2, prefetch=3)
    for _ in range(6):
        for loader in two:
            loader.next_batch()
    assert all(loader.needs_boundary_state for loader in two)
    with pytest.raises(Exception, match="needs the merged loader state of step 6"):
        two[0].next_batch()
    close(two)


def _drain(loader: ZephonLoader) -> None:
    """Consume every row every lane has left (a `stop` recipe ends lane by lane)."""
    try:
        while True:
            loader.next_batch()
    except StopIteration:
        pass
    for lane in loader.lanes:
        while lane.next_row() is not None:
            pass


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_every_document_drawn_exactly_once_through_the_lane_change(
    make_recipe, tokenizer_path, algorithm
):
    lanes = "\n[[phase]]\nname = 'a'\nstart_step = 0\n[[phase]]\nname = 'b'\nstart_step = 3\n"
    extra = lanes + "lanes = 12\nglobal_batch_size = 24\n"
    recipe = make_recipe(
        sources=[("prose", 150, 0.7), ("code", 100, 0.3)],
        lanes=8,
        algorithm=algorithm,
        on_exhausted="stop",
        block_size=5,
        extra=extra,
    )
    kw = {"seq_len": 32, "global_batch_size": 16, "trace": True, "prefetch": 0}
    first = ZephonLoader(recipe, tokenizer_path, **kw)
    for _ in range(3):
        first.next_batch()
    state = first.state_dict()
    drawn = Counter(doc for trace in first.traces.values() for doc in trace)
    first.close()
    for rank in range(2):  # the new lanes, on two ranks
        loader = ZephonLoader(recipe, tokenizer_path, dp_rank=rank, dp_size=2, **kw)
        loader.load_state_dict(state)
        _drain(loader)
        drawn.update(doc for trace in loader.traces.values() for doc in trace)
        loader.close()
    assert set(drawn) == {(0, i) for i in range(150)} | {(1, i) for i in range(100)}
    assert set(drawn.values()) == {1}


def _epoch_list(docs: Any, epoch: int) -> list[int]:
    """A lane's documents of one epoch, in visiting order."""
    out: list[int] = []
    for j in range(docs.num_blocks(epoch)):
        part = docs.block(epoch, j)
        out += (part.start + part.order).tolist()
    assert len(out) == docs.epoch_docs(epoch)
    return out


def _draws(docs: list[Any], cursors: list[Any], epochs: range) -> dict[int, list[int]]:
    """What lanes standing at `cursors` drew of each epoch of `epochs`."""
    out: dict[int, list[int]] = {e: [] for e in epochs}
    for lane, (at, pos, _) in enumerate(cursors):
        for e in epochs:
            if e <= at:
                docs_e = _epoch_list(docs[lane], e)
                out[e] += docs_e if e < at else docs_e[:pos]
    return out


def test_deal_draws_each_document_once_per_epoch_and_chains():
    """Old lanes stand in different epochs; what they drew plus what the new lanes
    draw is every document exactly once per epoch, through two chained changes."""
    n, epochs = 53, range(1, 6)
    plans = {lanes: SourceShuffle("s", n, lanes, 4, 9, True) for lanes in (4, 6, 3)}
    old: list[Any] = [ShuffledLaneDocs(plans[4], lane, True) for lane in range(4)]
    cursors: list[Any] = [(2, 3, False), (1, 10, False), (1, 0, False), (2, 11, False)]
    drawn = _draws(old, cursors, epochs)
    chain, starts = deal_source([], cursors, False, 6, "b")
    assert starts == [(1, 0, False)] * 6 and len(chain) == 1
    new = build_lane_docs(chain, plans.__getitem__, True, 9, "s", True)
    for e in epochs:
        seen = Counter(drawn[e] + [d for lane in new for d in _epoch_list(lane, e)])
        assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}, e
    # The six new lanes walk on to different places (some still in dealt epochs).
    walked = [(1, 2), (2, 0), (1, 0), (2, 3), (3, 1), (1, 4)]
    cursors = [(*new[lane].position(e, p), False) for lane, (e, p) in enumerate(walked)]
    more = _draws(new, cursors, epochs)
    drawn = {e: drawn[e] + more[e] for e in epochs}
    chain, starts = deal_source(chain, cursors, False, 3, "c")
    assert len(chain) == 2  # the second change deals epochs the first one dealt
    last = build_lane_docs(chain, plans.__getitem__, True, 9, "s", True)
    for e in range(starts[0][0], 6):
        seen = Counter(drawn[e] + [d for lane in last for d in _epoch_list(lane, e)])
        assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}, e


class BoundaryLane(ListLane):
    """The packing tests' stand-in lane, recording what a flush point carries."""

    def flush_point(self, snapshot: tuple, skip_tokens: int, carry: Any = ()) -> None:
        self.flushes.append((self.rows_emitted, snapshot[0], skip_tokens, list(carry)))


def _flat(rows: list[Any]) -> list[int]:
    return [t for tokens, positions in rows for t in tokens[positions >= 0].tolist()]


@pytest.mark.parametrize("end", [1, 2, 5, 9, 13, 20])
def test_best_fit_stops_exactly_at_the_boundary_row(end):
    lane = BoundaryLane(DOCS)
    packer = BestFitPacker(ROW, 4, flush_interval=5, end_row=end)
    while lane.rows_emitted < end:
        assert packer.fill(lane)
    assert len(lane.rows) == end  # no row crosses the boundary
    row, at, skip, carry = lane.flushes[-1]
    assert (row, skip, carry) == (end, 0, []) and lane.at == at  # the un-picked one is next
    # Everything picked before the boundary is in its rows, once; nothing else.
    assert sorted(_flat(lane.rows)) == sorted(t for ids, _ in DOCS[:at] for t in ids.tolist())
    with pytest.raises(RuntimeError, match="past its boundary row"):
        packer.fill(lane)
    # Restarted from any earlier flush point, knowing the boundary: the same rows.
    for row0, at0, _, _ in lane.flushes[:-1]:
        again = BoundaryLane(DOCS, at0, row0)
        redo = BestFitPacker(ROW, 4, 5, start_row=row0, end_row=end)
        while again.rows_emitted < end:
            redo.fill(again)
        assert [r[0].tolist() for r in again.rows] == [r[0].tolist() for r in lane.rows[row0:]]
        assert again.flushes[-1] == lane.flushes[-1]


@pytest.mark.parametrize("end", [1, 4, 7, 12])
def test_concat_cuts_at_the_boundary_row_and_carries_the_document(end):
    lane = BoundaryLane(DOCS)
    packer = ConcatPacker(ROW, flush_interval=3, end_row=end)
    while lane.rows_emitted < end:
        packer.fill(lane)
    row, at, skip, carry = lane.flushes[-1]
    assert (row, skip) == (end, 0) and len(lane.rows) == end
    assert all((pos >= 0).all() for _, pos in lane.rows)  # cut, not padded
    # The next segment (another row length) emits the carried rest first.
    tails = [(DOCS[d][0], s, d, off) for s, d, off in carry]
    assert all(d == at - 1 for _, _, d, _ in tails)  # the cut document was the last picked
    after = BoundaryLane(DOCS, at, 0)
    after.builder = RowBuilder(ROW + 5, PAD, KINDS)
    nxt = ConcatPacker(ROW + 5, flush_interval=3, carry=tails)
    while nxt.fill(after):
        pass
    assert _flat(lane.rows) + _flat(after.rows) == [t for ids, _ in DOCS for t in ids.tolist()]


def _keep(recipe: Path, name: str) -> Path:
    """A copy of a recipe under its own name, beside its data (make_recipe rewrites
    one file)."""
    out = recipe.with_name(f"{name}.toml")
    out.write_text(recipe.read_text())
    return out


def _lane_rows(recipe: Path, tok: str, steps: int, lane: int) -> list[Any]:
    """Lane `lane`'s rows over the first `steps` steps at D = 1, in order."""
    loader = ZephonLoader(recipe, tok, 32, 8, prefetch=0)
    rows = []
    for _ in range(steps):
        batch = loader.next_batch()
        r = batch.num_rows // len(batch.digests)
        ids = batch.input_ids[lane * r : (lane + 1) * r].numpy()
        pos = batch.positions[lane * r : (lane + 1) * r].numpy()
        labels = batch.labels[lane * r : (lane + 1) * r].numpy()
        rows += list(zip(ids.tolist(), pos.tolist(), labels.tolist(), strict=True))
    loader.close()
    return rows


RAMP = """
[[phase]]
name = "small"
start_step = 0
[[phase]]
name = "double"
start_step = 3
global_batch_size = 16
[[phase]]
name = "large"
start_step = 5
global_batch_size = 32
"""


@pytest.mark.parametrize("algorithm", ["concat", "best_fit"])
def test_a_batch_size_ramp_changes_no_lane_rows(make_recipe, tokenizer_path, algorithm):
    """Rows 0..14 of each lane: 3 steps of 1, 2 of 2 and 2 of 4 rows, or 15 steps of 1."""
    kw = {"algorithm": algorithm, "flush_interval": 3}
    plain = _keep(make_recipe(**kw), "plain")
    ramp = make_recipe(**kw, extra=RAMP)
    for lane in (0, 5):
        assert _lane_rows(ramp, tokenizer_path, 7, lane) == _lane_rows(
            plain, tokenizer_path, 15, lane
        )


def _tokens(recipe: Path, tok: str, steps: int, lane: int) -> list[int]:
    """Lane `lane`'s tokens over the first `steps` steps, row after row (concat
    pads nothing: a row is its inputs and its last label)."""
    out: list[int] = []
    for ids, _, labels in _lane_rows(recipe, tok, steps, lane):
        out += [*ids, labels[-1]]
    return out


def _phase(name: str, step: int, body: str) -> str:
    return f"[[phase]]\nname = 'a'\nstart_step = 0\n[[phase]]\nname = '{name}'\nstart_step = {step}\n{body}\n"


def test_seq_len_boundary_continues_the_cut_document(make_recipe, tokenizer_path):
    """Only seq_len changes at step 3: each lane cuts at its boundary row and goes on
    with longer rows from the same document, the same mixer: the same token stream."""
    plain = _keep(make_recipe(), "plain")
    longer = make_recipe(extra=_phase("long", 3, "seq_len = 48"))
    for lane in (1, 6):
        a, b = _tokens(plain, tokenizer_path, 12, lane), _tokens(longer, tokenizer_path, 8, lane)
        assert len(b) == 3 * 33 + 5 * 49
        assert a[: len(b)] == b


def test_mixture_boundary_carries_the_cut_document_first(make_recipe, tokenizer_path):
    """New weights at step 3: the rows before the boundary are unchanged, and the
    next phase starts with the rest of the document cut there."""
    tok = load_tokenizer(tokenizer_path)
    plain = _keep(make_recipe(), "plain")
    mixed = make_recipe(extra=_phase("mix", 3, "weights = { prose = 0.2, code = 0.8 }"))
    carried = 0
    for lane in range(8):
        a, b = _tokens(plain, tokenizer_path, 6, lane), _tokens(mixed, tokenizer_path, 6, lane)
        cut = 3 * 33
        end = a.index(tok.eos_id, cut - 1) + 1  # the end of the document cut at row 3
        assert b[:end] == a[:end]
        carried += end > cut
    assert carried >= 4  # most lanes cut a document at the boundary


PAUSES = """
[[phase]]
name = "a-only"
start_step = 0
weights = { a = 1 }
[[phase]]
name = "both"
start_step = 4
weights = { a = 1, b = 1 }
[[phase]]
name = "b-only"
start_step = 8
weights = { b = 1 }
[[phase]]
name = "both-again"
start_step = 12
weights = { a = 1, b = 1 }
"""


def test_new_weights_restart_the_mixer_and_a_paused_source_keeps_its_place(
    make_recipe, tokenizer_path
):
    recipe = make_recipe(
        sources=[("a", 120, 1.0), ("b", 120, 1.0)], lanes=2, unit="documents", extra=PAUSES
    )
    loader = ZephonLoader(recipe, tokenizer_path, 32, 4, trace=True, num_workers=0, prefetch=0)
    marks, held = [], []
    for step in range(16):
        if step in (4, 8, 12):
            marks.append({lane: len(t) for lane, t in loader.traces.items()})
        loader.next_batch()
        if step in (8, 11):  # in "b-only": nothing more of `a` is read or tokenized
            assert all(not lane.mixer.counts[0] for lane in loader.lanes)
            feeds = [demand.feeds[0] for demand in loader.ctx.scheduler.planner.lanes]
            held.append([(f.taken, len(f.slots), f.sched, f.reading) for f in feeds])
    assert held[0] == held[1] and len(held[0]) == 2
    for lane, trace in loader.traces.items():
        both = [src for src, _ in trace[marks[0][lane] : marks[1][lane]]]
        assert len(both) >= 6
        for n in range(1, len(both) + 1):  # from zero counts: alternating from the start
            assert abs(both[:n].count(0) - both[:n].count(1)) <= 1, both
        assert all(src == 1 for src, _ in trace[marks[1][lane] : marks[2][lane]])
        # `a` is taken in its lane's order, paused or not: nothing skipped or repeated.
        docs = loader.ctx.lane_docs(0, lane, 2)
        order = _epoch_list(docs, 0) + _epoch_list(docs, 1)
        taken = [doc for src, doc in trace if src == 0]
        assert taken == order[: len(taken)]
        assert any(src == 0 for src, _ in trace[marks[2][lane] :])  # `a` came back
    loader.close()


def _edit(recipe: Path, name: str, old: str, new: str) -> Path:
    text = recipe.read_text()
    assert old in text
    out = recipe.with_name(f"{name}.toml")
    out.write_text(text.replace(old, new))
    return out


def _resume(recipe: Path, tok: str, state: dict[str, Any], dp: int, steps: int) -> list[str]:
    loaders = make_ranks(recipe, tok, dp)
    try:
        for loader in loaders:
            loader.load_state_dict(state)
        return step_digests(loaders, steps)
    finally:
        close(loaders)


def test_future_phases_may_be_edited_on_resume_started_ones_not(make_recipe, tokenizer_path):
    recipe = four_phases(make_recipe)
    first = make_ranks(recipe, tokenizer_path, 2)
    step_digests(first, 5)
    inside = json.loads(json.dumps(save(first)))  # inside "long"
    step_digests(first, 1)
    boundary = json.loads(json.dumps(save(first)))  # the boundary checkpoint of "anneal"
    close(first)
    assert started_phases(inside) == [("warmup", 0), ("ramp", 2), ("long", 4)]
    assert boundary_of(boundary) == "anneal" and boundary_of(inside) is None
    assert set(inside["lanes"]["0"]["flush"]["mix"]) == {"prose", "code", "math"}
    # Two anneal mixes branched from the same checkpoints, each on its own D.
    anneal = "weights = { prose = 0.2, code = 0.3, math = 0.5 }\nlanes = 24"
    for k, (mix, dp) in enumerate(
        (("weights = { prose = 0.5, math = 0.5 }", 4), ("seq_len = 64", 3))
    ):
        branch = _edit(recipe, f"branch{k}", anneal, mix)
        own = run(branch, tokenizer_path, 1, STEPS)
        assert own[:6] == run(recipe, tokenizer_path, 1, 6)  # the prefix did not move
        assert _resume(branch, tokenizer_path, inside, dp, STEPS - 5) == own[5:]
        assert _resume(branch, tokenizer_path, boundary, dp, STEPS - 6) == own[6:]
    started = {
        "ramp": (
            "global_batch_size = 24",
            "global_batch_size = 36",
            "global_batch_size: checkpoint has 24, this run has 36",
        ),
        "long": (
            'name = "long"',
            'name = "longer"',
            "name: checkpoint has long, this run has longer",
        ),
        "warmup": (
            "prose = 0.7, code = 0.3 }",
            "prose = 0.6, code = 0.4 }",
            "weights: checkpoint has {'prose': 0.7, 'code': 0.3}",
        ),
    }
    for phase, (old, new, why) in started.items():
        changed = ZephonLoader(_edit(recipe, phase, old, new), tokenizer_path, 32, 8)
        with pytest.raises(StateError, match="cannot resume") as info:
            changed.load_state_dict(inside)
        changed.close()
        assert f"phase '{phase}': {why}" in str(info.value), str(info.value)
    inserted = _edit(
        recipe,
        "inserted",
        '[[phase]]\nname = "long"',
        '[[phase]]\nname = "mid"\nstart_step = 3\n\n[[phase]]\nname = "long"',
    )
    loader = ZephonLoader(inserted, tokenizer_path, 32, 8)
    with pytest.raises(
        StateError, match="phase 'mid' starts at step 3, before the checkpoint's step 5"
    ):
        loader.load_state_dict(inside)
    loader.close()


ADDED = """
[[phase]]
name = "base"
start_step = 0
[[phase]]
name = "anneal"
start_step = {start}
weights = {{ prose = 0.5, code = 0.5 }}
"""


def test_phases_added_to_a_running_jobs_recipe(make_recipe, tokenizer_path):
    """A checkpoint of a recipe without phases resumes once phases are added, the
    first equal to that recipe: at a later step, or exactly at the checkpoint's
    (step 3: rows to replay first; step 4: a flush point that re-picks its document)."""
    plain = _keep(make_recipe(), "plain")
    first = make_ranks(plain, tokenizer_path, 2)
    before = step_digests(first, 3)
    states = {3: json.loads(json.dumps(save(first)))}
    before += step_digests(first, 1)
    states[4] = json.loads(json.dumps(save(first)))
    close(first)
    assert "phases" not in states[3]["fingerprint"]
    assert {e["rows_since_flush"] for e in states[4]["lanes"].values()} == {0}
    assert any(e["flush"]["skip_tokens"] for e in states[4]["lanes"].values())
    for at, start in ((3, 5), (3, 3), (4, 4)):
        phased = make_recipe(extra=ADDED.format(start=start))
        own = run(phased, tokenizer_path, 1, 8)
        assert own[:at] == before[:at]
        assert _resume(phased, tokenizer_path, states[at], 4, 8 - at) == own[at:], (at, start)


def test_a_version_1_checkpoint_resumes_with_phases_added(tmp_path):
    """The committed version 1 state (mixer counts as a list) of a golden case,
    resumed with a phase added after it: the golden digests up to that phase."""
    from helpers import GOLDEN
    from helpers.golden import STATE_STEP, build_case

    recipe = build_case(tmp_path, "concat_tokens_repeat")
    with open(recipe, "a") as f:
        f.write(ADDED.format(start=9).replace("prose = 0.5, code = 0.5", "prose = 0.1, code = 0.9"))
    expected = json.loads((GOLDEN / "digests.json").read_text())["concat_tokens_repeat"]
    state = json.loads((GOLDEN / "state_concat_tokens_repeat.json").read_text())
    assert state["version"] == 1 and isinstance(state["lanes"]["0"]["flush"]["mix"], list)
    got = _resume(recipe, str(COMMITTED_TOKENIZER), state, 4, 9 - STATE_STEP + 2)
    assert got[: 9 - STATE_STEP] == expected[STATE_STEP:9]
    assert got[9 - STATE_STEP :] != expected[9:11]  # the added phase has its own mixture


BAD_PHASES = {
    "first-not-at-0": (
        "[[phase]]\nname = 'a'\nstart_step = 2\n",
        "phase 'a'.start_step: the first phase must start at step 0, got 2",
    ),
    "not-in-order": (
        "[[phase]]\nname = 'a'\nstart_step = 0\n[[phase]]\nname = 'b'\nstart_step = 5\n[[phase]]\nname = 'c'\nstart_step = 5\n",
        "phase 'c'.start_step: 5 is not after phase 'b' (start_step 5)",
    ),
    "unknown-source": (
        "[[phase]]\nname = 'a'\nstart_step = 0\nweights = { prose = 1, web = 2 }\n",
        "phase 'a'.weights: unknown source 'web'; declared sources: prose, code",
    ),
    "all-zero": (
        "[[phase]]\nname = 'a'\nstart_step = 0\nweights = { prose = 0 }\n",
        "phase 'a'.weights: no source has a positive weight",
    ),
    "negative": (
        "[[phase]]\nname = 'a'\nstart_step = 0\nweights = { prose = -1 }\n",
        "phase 'a'.weights: prose: expected a number >= 0, got -1",
    ),
    "zero-lanes": (
        "[[phase]]\nname = 'a'\nstart_step = 0\nlanes = 0\n",
        "phase 'a'.lanes: expected an integer >= 1, got 0",
    ),
    "duplicate": (
        "[[phase]]\nname = 'a'\nstart_step = 0\n[[phase]]\nname = 'a'\nstart_step = 1\n",
        "duplicate phase name(s): a",
    ),
    "unknown-key": (
        "[[phase]]\nname = 'a'\nstart_step = 0\nbatch = 3\n",
        "[phase 'a'] has unknown key(s): batch",
    ),
    "lanes-twice": (
        "[[phase]]\nname = 'a'\nstart_step = 0\nlanes = 12\n",
        "phase 'a'.lanes = 12 disagrees with [recipe] lanes = 8",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_PHASES))
def test_bad_phase_tables_name_the_phase_and_key(make_recipe, case):
    text, expected = BAD_PHASES[case]
    with pytest.raises(RecipeError) as info:
        load_recipe(make_recipe(extra=text))
    assert expected in str(info.value), str(info.value)


def test_one_source_of_truth_for_the_first_phase_shape(make_recipe, tokenizer_path):
    recipe = load_recipe(four_phases(make_recipe))
    # Not set by the job on purpose: the recipe's first phase decides.
    timeline = resolve_phases(recipe, 64, 8)
    assert [(p.seq_len, p.global_batch_size, p.lanes) for p in timeline.phases] == [
        (128, 12, 12),
        (128, 24, 12),
        (256, 48, 12),
        (256, 48, 24),
    ]
    assert [len(s.phases) for s in timeline.segments] == [2, 1, 1]  # the ramp is no flush
    assert timeline.phase_at(2).name == "warmup" and timeline.phase_at(3).name == "ramp"
    with pytest.raises(
        RecipeError, match="phase 'warmup' sets seq_len = 128 but the job sets seq_len = 64"
    ):
        resolve_phases(recipe, 64, 12, explicit=("seq_len",))
    assert resolve_phases(recipe, 128, 12, explicit=("seq_len", "global_batch_size"))
    # Every phase is checked for a data-parallel size and micro-batches in tokens.
    with pytest.raises(LayoutError, match="phase 'long' \\(from step 4\\): micro_batch_tokens 384"):
        timeline.layouts(4, micro_batch_tokens=384)  # 3 rows of 128, but of 256?
    # 3 rows per rank in micro-batches of 2 rows: one padding row per rank (§2),
    # reported, and refused above an allowed idle share, naming the phase.
    assert timeline.layouts(4, micro_batch_tokens=256)["warmup"].padded_rows(0) == 1
    with pytest.raises(LayoutError, match="phase .warmup. \\(from step 0\\): padded layout"):
        timeline.layouts(4, micro_batch_tokens=256, max_idle_share=0.2)
    assert set(timeline.layouts(4, micro_batch_tokens=256, from_step=2)) == {
        "ramp",
        "long",
        "anneal",
    }


def test_tools_follow_the_phases(make_recipe, tokenizer_path, tmp_path, capsys):
    recipe = four_phases(make_recipe)
    tok = ["--tokenizer", tokenizer_path]
    # validate: every phase for every size given; 8 ranks fit only the 24 lanes.
    assert main(["validate", str(recipe), *tok, "--dp", "1,2,4", "--micro-batch", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    phases = [line.split(":")[0] for line in out if line.startswith("phase ")]
    assert phases == ["phase     warmup", "phase     ramp", "phase     long", "phase     anneal"]
    ramp = next(line for line in out if line.startswith("phase     ramp"))
    assert "global_batch=24 seq_len=128 lanes=12 (batch size only: lanes go on)" in ramp
    assert sum(line.startswith("  dp=") for line in out) == 12 and out[-1] == "ok"
    # 8 ranks fit the 12-lane phases with padding (a quarter idle), refused above 10%.
    assert main(["validate", str(recipe), *tok, "--dp", "8", "--max-idle-share", "0.1"]) == 2
    err = capsys.readouterr()
    assert err.out.count("dp=8: error: padded layout") == 3  # warmup, ramp, long
    assert "3 phase and data-parallel size combination(s) do not fit" in err.err
    # hash: across the four phases at 2 ranks (merged state at the lane change).
    expected = run(recipe, tokenizer_path, 1, STEPS)
    assert main(["hash", str(recipe), *tok, "--dp", "2", "--steps", str(STEPS)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"step {s} {d} {n}" for s, (d, n) in enumerate(zip(expected, NAMES, strict=True))
    ]
    # inspect: a state after the lane change.
    loaders = make_ranks(recipe, tokenizer_path, 2)
    step_digests(loaders, 7)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(save(loaders)))
    close(loaders)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("  lane ") for line in out) == 24
    assert "phases started: warmup (from step 0), ramp (from step 2), long (from step 4)" in out[-4]
    assert out[-3] == "lanes: 24, in their segment since step 6"
    assert out[-2].startswith("deal prose: phase anneal, 12 -> 24 lanes")
    # mixture: the realised shares against the schedule; math from the anneal on.
    png = tmp_path / "mix.png"
    assert main(["mixture", str(recipe), *tok, "--steps", str(STEPS), "--plot", str(png)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:-1]]
    assert [r[1] for r in rows] == NAMES and png.stat().st_size > 10_000
    for r in rows:
        (prose, _, want_prose), (_, _, _), (math, _, want_math) = (
            map(float, cell.split("/")) for cell in r[2:]
        )
        assert math == want_math == 0 if r[1] != "anneal" else abs(math - want_math) < 0.15
        assert abs(prose - want_prose) < 0.2


def test_crossing_a_boundary_costs_a_step_not_a_restart(make_recipe, tokenizer_path):
    """Counted, not timed (no threads, lookahead of one token, so each step's count
    is its own work). Through the ramp and the seq_len change every document is
    tokenized once: the lanes keep their feeds and carry cut documents in memory,
    nothing is replayed; the lane-count change costs about a step's tokens."""
    recipe = four_phases(make_recipe)
    loader = ZephonLoader(
        recipe, tokenizer_path, 64, 8, trace=True, num_workers=0, prefetch=0, lookahead_tokens=1
    )
    planner = loader.ctx.scheduler.planner
    before, ratios = 0, []
    for step in range(STEPS):
        batch = loader.next_batch()
        stats = loader.stats()
        tokens = batch.num_rows + batch.num_valid_tokens()
        ratios.append((stats["tokens_tokenized"] - before) / tokens)
        before = stats["tokens_tokenized"]
        if step < 6:  # before the lane change
            picked = sum(len(t) for t in loader.traces.values())
            held = sum(s.ids is not None for ld in planner.lanes for f in ld.feeds for s in f.slots)
            assert stats["docs_tokenized"] == picked + held, step
    assert loader.replay["rows"] == 0
    ordinary = max(r for k, r in enumerate(ratios) if k not in (2, 4, 6))
    assert ratios[4] <= ordinary and ratios[6] <= 1.5 * ordinary, ratios
    loader.close()
