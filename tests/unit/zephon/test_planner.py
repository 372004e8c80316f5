"""The need planner on its own: no threads, no tokenizer, no files.

Documents are in-memory stand-ins: every text is 36 characters, which the
planner estimates at 10 tokens (0.25 tokens per character, plus EOS), and a
lane step takes 10 tokens, so a lane's k-th document from offset o is needed
by step (o + 10 k) // 10.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from zephon.demand.feeds import Feed, FeedStart, Slot
from zephon.demand.planner import NeedPlanner, StepMap, UniformSteps
from zephon.images.budget import ImageBytes
from zephon.lanes.documents import BlockPart, LaneDocs, ShuffledLaneDocs
from zephon.lanes.packing import held_rows
from zephon.lanes.shuffle import SourceShuffle
from zephon.recipe.phases import NEVER, Phase, Segment, SegmentSteps

STEP = 10  # tokens one lane gives per step
TEXT = "x" * 36  # estimated at 10 tokens


class ListDocs(LaneDocs):
    """n documents per epoch in blocks of `block`, visited in file order."""

    def __init__(self, n: int, block: int = 4, repeat: bool = True):
        self.n, self.size, self.repeat = n, block, repeat

    def epoch_docs(self, epoch: int) -> int:
        return self.n

    def num_blocks(self, epoch: int) -> int:
        return -(-self.n // self.size)

    def block(self, epoch: int, j: int) -> BlockPart:
        start = j * self.size
        end = min(start + self.size, self.n)
        return BlockPart(start, end, np.arange(end - start, dtype=np.int64))

    def locate(self, epoch: int, pos: int) -> tuple[int, int]:
        return pos // self.size, pos % self.size


READER = SimpleNamespace(
    spec=SimpleNamespace(name="s", format="jsonl", paths=("s.jsonl",), pretokenized=False)
)


def planner_with(
    offsets: list[int],
    budget: int,
    weights: tuple[float, ...] = (1.0,),
    retired: bool = False,
    steps: StepMap | None = None,
) -> NeedPlanner:
    """A planner with one lane per offset, each with one feed per weight."""
    planner = NeedPlanner(budget, steps or UniformSteps(STEP))
    for lane, offset in enumerate(offsets):
        ld = planner.add_lane(lane, [0] * len(weights), offset, list(weights), "tokens")
        for k in range(len(weights)):
            planner.add_feed(ld, k, FeedStart(READER, ListDocs(50), 0, 0, retired))
    return planner


def read(planner: NeedPlanner, f: Feed, docs: int) -> None:
    """Read the feed's next `docs` documents, as the executor would."""
    parts = f.advance(docs)
    f.reading = True
    slots = [Slot(TEXT, None, p.start + int(o), f) for p in parts for o in p.order]
    planner.read_done(f, slots, None)


def read_all(planner: NeedPlanner, docs: int) -> None:
    for ld in planner.lanes:
        for f in ld.feeds:
            read(planner, f, docs)


def planned(planner: NeedPlanner) -> list[tuple[int, int]]:
    """(lane, document) of each document of the planned call, in call order."""
    return [(s.feed.lane.lane, s.doc_id) for s in planner.plan().call]


def test_work_is_served_in_step_then_lane_order():
    planner = planner_with([30, 0, 20], budget=10_000)  # lanes at steps 3, 0 and 2
    read_all(planner, 5)
    planner.warm = True
    got = planned(planner)
    expected = sorted(
        ((off // STEP + k, lane, k) for lane, off in enumerate([30, 0, 20]) for k in range(5)),
    )
    assert got == [(lane, k) for _, lane, k in expected]


def test_a_lane_that_waits_is_served_first():
    planner = planner_with([0, 50], budget=10_000)
    read_all(planner, 3)
    planner.warm = True
    planner.waiting.add(planner.lanes[1].feeds[0])  # lane 1 waits, though it is at step 5
    assert planned(planner)[:1] == [(1, 0)]


def test_budget_holds_back_later_steps():
    planner = planner_with([0, 0], budget=60)  # horizon 60 // (2 x 10) + 1 = 4 steps
    read_all(planner, 10)
    planner.warm = True
    got = planned(planner)
    # Steps 0-2 of both lanes fill the budget exactly; step 3 would overrun it.
    assert got == [(lane, k) for k in range(3) for lane in (0, 1)]
    assert planner.used == 60


def test_the_step_being_produced_ignores_the_budget():
    planner = planner_with([0, 0], budget=5)
    read_all(planner, 10)
    planner.warm = True
    assert planned(planner) == [(0, 0), (1, 0)]  # step 0 is needed: 20 tokens > 5
    assert planner.used == 20
    planner.floor = 1
    assert planned(planner) == [(0, 1), (1, 1)]  # and then step 1, still over budget
    assert planner.plan().call == []  # step 2 is not needed yet and the budget is spent


def test_a_lane_behind_its_steps_by_padding_is_still_held_to_the_budget():
    """A packer's padding makes the rows of a step hold fewer documents' tokens
    than the step's row tokens, so a lane's offset falls behind the step being
    produced a little more each step: here the lane's next document starts at
    offset 100 (step 10 by tokens) while step 20 is being produced. Its next
    documents are needed from about step 20 on, not at steps 10-19: only the
    step being produced and the one before (the slack for a lane that has not
    taken that step's documents yet) ignore the budget, and the lookahead after
    them stays within it. (Mapping offsets to steps alone, every document up to
    offset 200 would count as needed now, and the budget would hold none back.)"""
    planner = planner_with([100], budget=30)
    read_all(planner, 20)
    planner.warm = True
    planner.floor = 20
    got = planned(planner)
    # lag 20 - 1 - 10 = 9 steps: documents k = 0, 1 are steps 19 and 20 (needed),
    # then the budget (30 tokens) allows one more step: k = 2 at step 21; k = 3 waits.
    assert got == [(0, 0), (0, 1), (0, 2)]
    assert planner.used == 30


def test_lookahead_stops_at_the_horizon():
    # Two lanes: horizon 100 // (2 x 10) + 1 = 6 steps. Lane 1 has nothing to give,
    # so the budget alone would let lane 0 plan 10 steps ahead.
    planner = planner_with([0], budget=100)
    planner.add_feed(
        planner.add_lane(1, [0], 0, [1.0], "tokens"), 0, FeedStart(READER, ListDocs(50), 0, 0, True)
    )
    read_all(planner, 20)
    planner.warm = True
    got = planned(planner)
    assert planner.horizon == 6
    assert got == [(0, k) for k in range(7)]  # steps 0..6
    assert planner.used == 70


def test_before_the_first_batch_only_the_exact_next_documents():
    """Cold: the mixer's own picks, and only those the step being produced needs."""
    planner = planner_with([0], budget=10_000, weights=(0.5, 0.5))
    read_all(planner, 6)
    got = planned(planner)
    # The first pick is source 0's first document (ties go to the lower index);
    # its ids are unknown until tokenized, so nothing after it can be placed.
    assert got == [(0, 0)] and planner.lanes[0].frontier == 0
    call = planner.lanes[0].feeds[0].slots[0]
    planner.stored([call], [TEXT], [np.zeros(STEP, dtype=np.int32)])
    # Source 0 took one step (10 tokens): source 1 is owed the next pick, at step 1,
    # which is past the step being produced.
    assert planned(planner) == []
    planner.floor = 1
    assert [(s.feed.source, s.doc_id) for s in planner.plan().call] == [(1, 0)]


def test_before_the_first_batch_best_fit_plans_every_lane_its_open_bins_need():
    """best_fit emits a row only when a bin closes, so a lane's first rows need
    the documents its open bins hold too: each lane's exact next document within
    that many rows is planned at once, not one lane after another as each waits.
    Rows of 10 tokens, one per lane per step (a step is 10 tokens, as above)."""
    phase = Phase(None, 0, None, 4, 9, 4, (1.0,), ("s",))
    segment = Segment(0, (phase,))
    offsets = [0, 15, 25, 35]  # lanes whose next document starts at steps 0, 1, 2, 3
    assert held_rows("concat", 8) == 0 and held_rows("best_fit", 2) == 2
    for held, lanes in ((0, [0]), (2, [0, 1, 2])):
        steps = SegmentSteps(segment, held_rows=held)
        planner = planner_with(offsets, budget=10_000, steps=steps)
        read_all(planner, 4)
        # One document per lane (its exact next pick), for the lanes whose open
        # bins reach back to step 0: offsets 15 and 25 are within 2 rows of it.
        assert planned(planner) == [(lane, 0) for lane in lanes], held
    # Past the segment's end no step needs a document, held rows or not.
    ends = SegmentSteps(Segment(0, (Phase(None, 0, 3, 4, 9, 4, (1.0,), ("s",)),)), held_rows=2)
    assert ends.need_step(30) == ends.step_of(30) == NEVER
    assert (ends.need_step(29), ends.step_of(29)) == (0, 2)


def test_once_warm_only_the_rows_of_the_step_being_produced_ignore_the_budget():
    """What a packer needs early (best_fit's open bins) is planned first, but it
    waits for the budget like any lookahead: only the documents of the step
    being produced's own rows are never held back, so the byte and token
    budgets still bound what is queued."""
    phase = Phase(None, 0, None, 4, 9, 4, (1.0,), ("s",))
    planner = planner_with([0], budget=5, steps=SegmentSteps(Segment(0, (phase,)), held_rows=2))
    read_all(planner, 6)
    planner.warm = True
    # Documents at offsets 0, 10, 20 are all needed by step 0 (two rows held),
    # but only the first lies in step 0's rows; the budget (5 tokens) holds the rest.
    assert planned(planner) == [(0, 0)]
    assert planner.plan().call == []
    planner.floor = 1  # step 1's rows: the document at offset 10
    assert planned(planner) == [(0, 1)]


def test_a_paused_source_is_not_planned_unless_a_lane_waits_on_it():
    planner = planner_with([0], budget=10_000, weights=(1.0, 0.0))
    read_all(planner, 5)
    planner.warm = True
    assert {s.feed.source for s in planner.plan().call} == {0}  # no division by its share
    paused = planner.lanes[0].feeds[1]
    planner.waiting.add(paused)
    assert [(s.feed.source, s.doc_id) for s in planner.plan().call] == [(1, 0)]


def test_a_feed_reads_the_plans_documents_across_blocks_and_epochs():
    plan = SourceShuffle("s", 37, 3, 4, seed=5, shuffle=True)
    docs = ShuffledLaneDocs(plan, lane=1, repeat=True)
    planner = NeedPlanner(1000, UniformSteps(STEP))
    ld = planner.add_lane(1, [0], 0, [1.0], "tokens")
    # Start at the third document of the lane's epoch 0.
    f = planner.add_feed(ld, 0, FeedStart(READER, docs, 0, 2, False))
    n = plan.lane_docs(0, 1) + plan.lane_docs(1, 1)
    while len(f.slots) < n:
        read(planner, f, 3)
    expected = []
    for epoch in (0, 1):
        blocks, _ = plan.lane_blocks(epoch, 1)
        for b in blocks:
            start, _ = plan.block_range(int(b))
            expected += (start + plan.block_order(epoch, int(b))).tolist()
    assert [s.doc_id for s in f.slots][: n - 2] == expected[2:n]


def test_the_end_of_epoch_rule():
    assert ListDocs(5, repeat=True).position(0, 5) == (1, 0)
    assert ListDocs(5, repeat=False).position(0, 5) is None
    assert ListDocs(5, repeat=False).position(0, 4) == (0, 4)
    assert ListDocs(8, block=4, repeat=True).next_block(0, 1) == (1, 0)
    assert ListDocs(8, block=4, repeat=False).next_block(0, 1) is None


def test_image_bytes_hold_patches_and_as_many_decode_peaks_as_decode_at_once():
    """Two decoders: the budget holds every queued document's patches and the two
    largest decode peaks among them (not all five); a decoded document frees its
    peak and keeps its patches; taken, it holds nothing."""
    budget = ImageBytes(115, decoders=2)
    slots = [Slot(None, None, k, None) for k in range(5)]  # type: ignore[arg-type]
    for slot, peak in zip(slots, (10, 50, 30, 20, 40), strict=True):
        assert budget.admits(1, peak)
        budget.reserve(slot, 1, peak)
    assert budget.used == 5 + 50 + 40
    assert budget.admits(15, 45) and not budget.admits(16, 45)  # 5 + 15 + 50 + 45 = 115
    assert not budget.admits(1, 200)  # a peak alone over the budget
    budget.release(slots[1])  # unqueued: its patch and its peak (the largest) go
    assert budget.used == 4 + 40 + 30
    slots[4].ids = np.zeros(3, dtype=np.int32)  # decoded (a stand-in holding no images)
    budget.stored(slots[4], SimpleNamespace(image_docs=0, image_tokens=0, images_framed=0))
    assert budget.used == 3 + 30 + 20 and budget.peak == 95
    budget.reset()
    assert budget.used == 0
