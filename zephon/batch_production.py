"""Producing a rank's batches: lanes started, replayed, assembled, read ahead.

Each lane starts from a flush point and replays the rows the trainer had
already consumed after it; then every step takes the phase's rows per lane
from each of the rank's lanes, in lane order, and hashes each lane's rows. A
background thread may produce steps ahead of the trainer (prefetch); it never
changes a byte, only when a batch is ready. Nothing runs before `start`, so a
loader built and then restored does no wasted work.

At the end of a segment (phases.py) every lane stands at its boundary row;
before the next batch the producer builds the next segment's lanes from their
boundary points (boundary.py) and the scheduler starts over for them. A
lane-count change needs every lane's point: a producer that owns them all
crosses it; otherwise it stops there (BOUNDARY) until the loader is given the
merged state of all ranks.

With image sources, each step's images are collected with its rows, folded
into the lane digests of lanes whose rows hold images (when those digests
are read) and attached to the batch (images/assembly.py). With decode
processes, once the first batch is out, the next step's rows are taken before
a step waits for its pixels, so that its decode tasks queue right behind this
step's (`produce`); never across a segment's end, and nothing it meets (an
error, the end of the data) reaches the trainer before that step is asked for.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.batch import IGNORE_INDEX, Batch, rows_to_batch
from zephon.demand.stats import DOC_COUNTS, TOKEN_COUNTS
from zephon.digest import rows_digest
from zephon.errors import StateError
from zephon.images.assembly import BatchImages, LaneDigests
from zephon.recipe.phases import PhaseTimeline, Segment
from zephon.stage_profile import ASSEMBLE, NULL_CLOCK, OTHER, PACK, Clock, current
from zephon.state.flush_log import FlushPoint
from zephon.state.lane_count_deal import Record
from zephon.streams.context import PipelineContext
from zephon.streams.lane import LaneStream
from zephon.streams.segment_boundary import enter_segment

END = object()  # the data ended (a `stop` source ran dry)
BOUNDARY = object()  # a lane-count change this rank cannot cross alone

# The batch; each lane's new flush points; and, on a segment's first batch, the
# new lanes' starting points and the lane-count changes to keep.
Entered = tuple[dict[int, FlushPoint], dict[str, list[Record]]]
Produced = tuple[Batch, dict[int, list[FlushPoint]], Entered | None]


@dataclass(frozen=True, eq=False)
class _Packed:
    """A step's rows as the lanes gave them, its pixels perhaps still decoding."""

    step: int
    phase: str
    rows_per_lane: int
    tokens: np.ndarray
    positions: np.ndarray
    counted: list[tuple[list[int], list[int]]]  # (tokens, documents) by source, per row
    flushes: dict[int, list[FlushPoint]]
    images: BatchImages | None


@dataclass(frozen=True, eq=False)
class _Failed:
    """Packing a step ahead raised this: raised when that step is asked for."""

    error: Exception


_ENDED = object()  # packing a step ahead found the data's end


def _row_buffers(n: int, row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and positions of a step's `n` rows."""
    return np.empty((n, row_len), np.int32), np.empty((n, row_len), np.int32)


def _first_batch_counts(stats: dict[str, Any], positions: np.ndarray) -> dict[str, int]:
    """The work done when a first batch was assembled, and its rows' tokens."""
    keys = ("docs_tokenized", "tokens_tokenized", "docs_pretokenized", "tokens_pretokenized",
            "docs_read", "image_docs", "image_tokens", "images_framed", "images_decoded")  # fmt: skip
    return {**{k: stats[k] for k in keys}, "row_tokens": int((positions >= 0).sum())}


class BatchProducer:
    """The rank's lanes from their start points on, and the batches they make.

    Args:
        ctx: what the lanes share.
        schedule: the phases, and the segments they form.
        segment: the segment the starting lanes belong to.
        starts: per lane, (flush point, rows to replay after it).
        step: the step the trainer continues at (batches before it were consumed).
        prefetch: steps produced ahead of the trainer (0: on the trainer's thread).
        traces: per lane, a list to record (source, document) of packed documents.
        whole: the producer owns every lane, so it can cross lane-count changes.
    """

    def __init__(
        self,
        ctx: PipelineContext,
        timeline: PhaseTimeline,
        segment: Segment,
        starts: dict[int, tuple[FlushPoint, int]],
        step: int,
        prefetch: int,
        traces: dict[int, list[tuple[int, int]]] | None,
        whole: bool,
    ):
        self.ctx, self.timeline, self.segment = ctx, timeline, segment
        self.starts, self.step = starts, step
        self.prefetch, self.traces, self.whole = prefetch, traces, whole
        self.source_names = tuple(s.name for s in ctx.recipe.sources)
        self.started = False
        self.lanes: list[LaneStream] = []
        self._warm = False
        self._entered: Entered | None = None
        self.produced_step = step
        self.packed_step = step  # the next step whose rows the lanes give
        self._ahead: Any = None  # the step packed ahead (_Packed, _Failed, _ENDED)
        self._decodes_ahead = ctx.images is not None and ctx.images.in_processes
        self._rows: list[tuple[np.ndarray, np.ndarray] | None] = [None, None]
        self.replay = {"rows": 0, "docs_packed": 0, "docs_tokenized": 0, "tokens_tokenized": 0}
        self.first_batch: dict[str, int] | None = None
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(prefetch, 1))
        self._stop = threading.Event()

    def start(self) -> dict[int, list[FlushPoint]]:
        """Build the lanes, replay each to its consumed row and begin prefetching.
        Returns the flush points the lanes passed while replaying."""
        self.started = True
        scheduler = self.ctx.scheduler
        clock = self._consumer_clock()
        left = clock.switch(PACK)  # building the lanes and replaying is the lanes' work
        # Replayed rows and the first batch are all "needed" work for the scheduler.
        scheduler.set_floor(self.step)
        self.lanes = [
            LaneStream(self.ctx, self.segment, lane, flush, self._trace(lane))
            for lane, (flush, _) in self.starts.items()
        ]
        consumed = self.segment.rows_before(self.step)
        passed = {}
        for lane in self.lanes:
            skip = self.starts[lane.lane][1]
            for _ in range(skip):  # replay: rebuild and drop rows already consumed
                if lane.next_row() is None:
                    raise StateError(
                        f"lane {lane.lane}: data ended while replaying to row {consumed}"
                    )
            self.replay["rows"] += skip
            self.replay["docs_packed"] += lane.docs_packed
            passed[lane.lane] = lane.take_flushes()
        stats = scheduler.stats()
        self.replay["docs_tokenized"] = sum(stats[k] for k in DOC_COUNTS)
        self.replay["tokens_tokenized"] = sum(stats[k] for k in TOKEN_COUNTS)
        if self.prefetch > 0:
            self._thread = threading.Thread(target=self._run, name="zephon-prefetch", daemon=True)
            self._thread.start()
        clock.switch(left)
        return passed

    def _consumer_clock(self) -> Clock:
        """The clock of the thread that asks for batches (the trainer's), if profiled."""
        profile = self.ctx.scheduler.profile
        return profile.here("consumer") if profile is not None else NULL_CLOCK

    def _trace(self, lane: int) -> list[tuple[int, int]] | None:
        if self.traces is None:
            return None
        return self.traces.setdefault(lane, [])

    def next(self) -> Produced | BaseException | object:
        """The next step's batch and flush points; END once a lane ran dry, BOUNDARY at
        a lane-count change it cannot cross; an exception raised on the prefetch
        thread is returned, not raised."""
        profile = self.ctx.scheduler.profile
        clock = self._consumer_clock()
        left = clock.switch(OTHER)
        try:
            if self._thread is not None:
                begun = clock.wait_begin()
                item = self._queue.get()
                clock.wait_end(begun)
            else:
                item = self.produce()
            if profile is not None and isinstance(item, tuple):  # tokens delivered
                profile.tokens += int(item[0].source_tokens.sum())
            return END if item is None else item
        finally:
            clock.switch(left)

    def _cross(self) -> bool:
        """Build the next segment's lanes from the boundary points of these; False
        at a lane-count change without every lane."""
        before = self.segment
        assert before.end_step is not None
        after = self.timeline.segment_of(before.end_step)
        if after.lanes != before.lanes and not self.whole:
            return False
        points = {lane.lane: lane.boundary_point() for lane in self.lanes}
        starts, deals = enter_segment(self.ctx, points, before, after)
        known = {k: ids for lane in self.lanes for k, ids in lane.held_docs().items()}
        scheduler = self.ctx.scheduler
        # The same lanes keep their feeds and what those hold; new lanes start over.
        same = {lane.lane: lane for lane in self.lanes} if after.lanes == before.lanes else {}
        if same:
            scheduler.set_steps(self.ctx.step_map(after))
        else:
            scheduler.reset(self.ctx.step_map(after), keep_stats=True)
        scheduler.set_floor(self.produced_step)
        self.ctx.set_deals(deals)
        self.segment = after
        self.lanes = [
            LaneStream(self.ctx, after, lane, p, self._trace(lane), same.get(lane), known)
            for lane, p in sorted(starts.items())
        ]
        self._warm = False
        self._entered = (starts, deals)
        return True

    def produce(self) -> Produced | object | None:
        """Assemble the next step from every lane, in lane order; None at the end,
        BOUNDARY at a lane-count change it cannot cross.

        With decode processes, once warm, the step after this one takes its rows
        from the lanes before this one waits for its pixels: its decode tasks then
        queue right behind this step's (`_pack`), so the processes go from one
        step's images to the next's in the order the steps need them, instead of
        decoding documents the lanes will only place later while the next step
        packs. A failure or the end of the data met doing so is handed on at the
        next call, as it would have been met then."""
        packed, self._ahead = (self._ahead if self._ahead is not None else self._pack()), None
        if isinstance(packed, _Failed):
            raise packed.error
        if packed is _ENDED:
            return None
        if not isinstance(packed, _Packed):
            return packed  # the end of the data, or BOUNDARY
        if self._warm and self._decodes_ahead and not self._ends_segment(packed.step + 1):
            try:
                self._ahead = self._pack()
            except Exception as exc:  # raised when that step is asked for (an interrupt: now)
                self._ahead = _Failed(exc)
            if self._ahead is None:
                self._ahead = _ENDED
        return self._finish(packed)

    def _ends_segment(self, step: int) -> bool:
        """`step` belongs to the next segment (its lanes are built when it is packed)."""
        return self.segment.end_step is not None and step >= self.segment.end_step

    def _pack(self) -> _Packed | object | None:
        """The next step's rows from every lane, in lane order, its images' decode
        tasks moved ahead of every task not hurried before them; None at the end,
        BOUNDARY at a lane-count change it cannot cross."""
        if self._ends_segment(self.packed_step):
            if not self._cross():
                return BOUNDARY
        seg = self.segment
        step = self.packed_step
        phase = seg.phase_of(step)
        r, row_len = phase.rows_per_lane, seg.row_len
        n = len(self.lanes) * r
        self.ctx.scheduler.set_floor(step)
        clock = current()
        left = clock.switch(PACK)
        # The step's rows, in buffers kept from step to step (two: one step may be
        # packed while the one before it waits for pixels): the batch tensors are
        # copies, and fresh memory costs a page fault per 4 KiB.
        rows = self._rows[step % 2]
        if rows is None or rows[0].shape != (n, row_len):
            rows = self._rows[step % 2] = _row_buffers(n, row_len)
        tokens, positions = rows
        counted: list[tuple[list[int], list[int]]] = []  # (tokens, documents) by source, per row
        flushes = {}
        images = None if self.ctx.images is None else BatchImages(self.ctx.images)
        for i, lane in enumerate(self.lanes):
            for k in range(r):
                row = lane.next_row()
                if row is None:
                    clock.switch(left)
                    return None
                tokens[i * r + k], positions[i * r + k] = row
                assert lane.last_sources is not None
                counted.append(lane.last_sources)
                if images is not None:
                    images.add_row(i * r + k, lane.last_images)
            if images is not None:
                images.end_lane()
            flushes[lane.lane] = lane.take_flushes()
        if images is not None:
            images.hurry()  # the step's images first, before a lane waits for one
        self.packed_step += 1
        clock.switch(left)
        return _Packed(step, phase.name, r, tokens, positions, counted, flushes, images)

    def _finish(self, packed: _Packed) -> Produced:
        """The packed step's batch: its digests, its pixels waited for, its counts."""
        assert packed.step == self.produced_step
        clock = current()
        left = clock.switch(ASSEMBLE)
        r, tokens, positions = packed.rows_per_lane, packed.tokens, packed.positions
        images = packed.images
        scheduler = self.ctx.scheduler
        n = len(tokens)
        rows_digests = [
            rows_digest(tokens[i : i + r], positions[i : i + r]) for i in range(0, n, r)
        ]
        # with images: hashed when read (images/assembly.py)
        digests: Sequence[bytes]
        digests = rows_digests if images is None else images.lane_digests(rows_digests)
        if images is not None:
            # The step's pixels before the planner turns warm below: until the first
            # batch it plans only the documents that batch needs, so the loader's
            # reading and planning leave the cores to its decoding.
            images.wait()
        by_source = (
            np.array(packed.counted, dtype=np.int64)
            .reshape(n, 2, len(self.source_names))
            .sum(axis=0)
        )
        if not self._warm:  # the first batch since the start or a boundary
            self._warm = True
            stats = scheduler.set_warm()
            if self.first_batch is None:  # work done by then (replay included)
                self.first_batch = _first_batch_counts(stats, positions)
        batch = rows_to_batch(packed.step, tokens, positions, digests)
        if images is not None:
            # (labels: a view of the tensor's memory, changed in place)
            batch.images = images.finish(batch.labels.numpy(), tokens, IGNORE_INDEX)
        batch.source_tokens, batch.source_docs = by_source[0], by_source[1]
        batch.source_names = self.source_names
        batch.phase = packed.phase
        self.produced_step += 1
        entered, self._entered = self._entered, None
        clock.switch(left)
        return batch, packed.flushes, entered

    def _put(self, item: Any) -> bool:
        clock = current()
        if self._queue.full() and type(item) is tuple and type(item[0].digests) is LaneDigests:
            # The trainer is behind: hash the batch's image lanes while waiting for it,
            # not on its thread when it reads them (a log step); else they wait for a read.
            left = clock.switch(ASSEMBLE)
            item[0].digests.compute()
            clock.switch(left)
        begun = clock.wait_begin()
        try:
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False
        finally:
            clock.wait_end(begun)

    def _run(self) -> None:
        profile = self.ctx.scheduler.profile
        if profile is not None:
            profile.clock("prefetch")
        try:
            while not self._stop.is_set():
                item = self.produce()
                if not self._put(END if item is None else item) or item in (None, BOUNDARY):
                    return
        except BaseException as exc:  # handed to the trainer's thread, raised there
            self._put(exc)

    def stop(self) -> None:
        """Stop the prefetch thread (what it produced ahead is dropped)."""
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.05)
                except queue.Empty:
                    pass
            self._thread.join()
            self._thread = None
        self.lanes, self._ahead = [], None
