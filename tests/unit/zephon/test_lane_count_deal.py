"""A lane-count change, checked against its rule rather than against another run
(docs/design.md §12 "Lane count", DESIGN §12): for L -> L' lanes, up (4 -> 6) and
down (6 -> 4), with both packers,

- new lane j carries the documents `concat` cut at the boundary (and their
  tails) of exactly the old lanes l with l mod L' == j, in old-lane order;
- the documents the old lanes had not drawn are pieces of their blocks, in
  old-lane order, permuted by the keyed permutation of (seed, source, epoch,
  "deal", phase), and piece i goes to new lane i mod L';
- over the boundary every token of every document is emitted exactly once:
  counted per document in the rows before and after it.

The other phase tests compare runs with each other (D = 1 against D = 3, a
resume against the original), so a deal that is wrong the same way in every
run passes them; these tests compute what the rule gives on their own."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.corpus import COMMITTED_TOKENIZER, synthetic_docs, write_jsonl
from helpers.loader import close, make_ranks, save, step_digests

from zephon import ZephonLoader
from zephon.lanes.documents import ShuffledLaneDocs
from zephon.lanes.shuffle import keyed_permutation
from zephon.streams.segment_boundary import enter_segment

CHANGES = [(4, 6), (6, 4)]  # up and down, neither count a multiple of the other
ALGORITHMS = ["concat", "best_fit"]
SEED = 31
BOUNDARY = 3  # steps before the phase with the new lane count
GLOBAL = 12  # rows per step: 3 or 2 rows per lane for 4 or 6 lanes
PHASES = """
[[phase]]
name = "before"
start_step = 0
global_batch_size = {gbs}
[[phase]]
name = "after"
start_step = {step}
lanes = {lanes}
"""


def _recipe(folder: Path, lanes: tuple[int, int], algorithm: str, body: str, sources: str) -> Path:
    old, new = lanes
    path = folder / f"{algorithm}-{old}-{new}.toml"
    path.write_text(
        f'[recipe]\nname = "deal"\nseed = {SEED}\nlanes = {old}\n'
        f"[shuffle]\nblock_size = 4\n"
        f'[packing]\nalgorithm = "{algorithm}"\nopen_bins = 3\nflush_interval = 4\n'
        f'{body}[execution]\ncache_dir = "{folder / "cache"}"\n'
        f"{sources}{PHASES.format(gbs=GLOBAL, step=BOUNDARY, lanes=new)}"
    )
    return path


def _boundary_state(recipe: Path, dp: int) -> dict[str, Any]:
    """The merged state of `dp` ranks written at the lane-count boundary."""
    ranks = make_ranks(recipe, str(COMMITTED_TOKENIZER), dp, prefetch=0)
    step_digests(ranks, BOUNDARY)
    state = json.loads(json.dumps(save(ranks)))
    close(ranks)
    assert state["boundary_of"] == "after"
    return state


def _remaining_pieces(docs: Any, cursor: tuple[int, int], epoch: int) -> list[list[int]]:
    """What a lane standing at `cursor` (epoch, documents taken) has not drawn of
    `epoch`, block by block (the first from the cursor on), in visiting order."""
    at, taken = cursor
    if epoch < at:
        return []
    pieces, seen = [], 0
    for j in range(docs.num_blocks(epoch)):
        part = docs.block(epoch, j)
        block = (part.start + part.order).tolist()
        skip = max(0, taken - seen) if epoch == at else 0
        seen += len(block)
        if skip < len(block):
            pieces.append(block[skip:])
    return pieces


def _walk(docs: Any, epoch: int) -> list[int]:
    out: list[int] = []
    for j in range(docs.num_blocks(epoch)):
        part = docs.block(epoch, j)
        out += (part.start + part.order).tolist()
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("lanes", CHANGES, ids=lambda c: f"{c[0]}to{c[1]}")
def test_new_lane_j_gets_the_tails_of_old_lanes_j_mod_new_and_dealt_pieces(
    tmp_path, lanes, algorithm
):
    """enter_segment on the old lanes' boundary points (the merged state of 2 ranks):
    tails by old lane l mod L', pieces by piece index i mod L' after the keyed
    permutation, each new lane starting at the first dealt epoch."""
    old, new = lanes
    # 22 documents of `code` over 4 or 6 lanes: some lanes are in epoch 1 by the
    # boundary, others still in epoch 0, so more than one epoch is dealt.
    tables = []
    for k, (name, n) in enumerate((("prose", 90), ("code", 22))):
        write_jsonl(tmp_path / f"{name}.jsonl", synthetic_docs(n, seed=40 + k))
        tables.append(f'[[source]]\nname = "{name}"\npath = "{name}.jsonl"\nweight = 0.5\n')
    recipe = _recipe(tmp_path, lanes, algorithm, "", "".join(tables))
    state = _boundary_state(recipe, 2)
    points = {int(lane): e["flush"] for lane, e in state["lanes"].items()}
    loader = ZephonLoader(recipe, str(COMMITTED_TOKENIZER), 32, 16)
    ctx, (before, after) = loader.ctx, loader.timeline.segments
    assert sorted(points) == list(range(old)) and after.lanes == new
    starts, deals = enter_segment(ctx, points, before, after)
    assert sorted(starts) == list(range(new))

    # Tails: new lane j carries old lanes j, j + L', ... (those with l mod L' == j).
    # Here every concat lane cut a document at its boundary row; best_fit cuts none.
    carried = sum(len(p.get("carry", [])) for p in points.values())
    assert carried == (old if algorithm == "concat" else 0)
    for j in range(new):
        want = [c for lane in range(old) if lane % new == j for c in points[lane].get("carry", [])]
        assert starts[j].get("carry", []) == want, j

    # Pieces: the old lanes' undrawn documents, dealt piece by piece.
    ctx.set_deals(deals)
    dealt_epochs = 0
    for i, spec in enumerate(ctx.recipe.sources):
        cursors = {
            lane: (p["sources"][spec.name]["epoch"], p["sources"][spec.name]["pos"])
            for lane, p in points.items()
        }
        assert not any(p["sources"][spec.name]["retired"] for p in points.values())
        first, last = min(e for e, _ in cursors.values()), max(e for e, _ in cursors.values())
        plain = [ShuffledLaneDocs(ctx.shuffle_of(i, old), lane, True) for lane in range(old)]
        for lane in range(new):  # every new lane starts at the first dealt epoch
            got = starts[lane]["sources"][spec.name]
            assert (got["epoch"], got["pos"], got["retired"]) == (first, 0, False)
        for epoch in range(first, last + 1):
            pool = [
                piece
                for lane in range(old)
                for piece in _remaining_pieces(plain[lane], cursors[lane], epoch)
            ]
            order = keyed_permutation(len(pool), SEED, spec.name, epoch, "deal", "after")
            for j in range(new):
                want = [d for k in range(j, len(pool), new) for d in pool[int(order[k])]]
                assert _walk(ctx.lane_docs(i, j, new), epoch) == want, (spec.name, epoch, j)
            dealt_epochs += 1
    # Not vacuous: `code` is dealt over two epochs (lanes stood in 0 and 1).
    assert dealt_epochs >= 3
    loader.close()


def _id_sources(folder: Path) -> tuple[str, dict[int, int]]:
    """Two pretokenized sources whose every document is one token id repeated,
    unique to the document (2 + 1000 * source + index; 0 and 1 are EOS and pad):
    the rows then say whose tokens they hold. Returns the [[source]] tables and
    each id's length."""
    rng = np.random.default_rng(5)
    tables, lengths = [], {}
    for s, (name, n) in enumerate((("a", 70), ("b", 40))):
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for d in range(n):
                doc_id = 2 + 1000 * s + d
                # mostly shorter than a row (33 tokens), some two or three rows long
                size = int(rng.choice([rng.integers(1, 30), rng.integers(30, 90)]))
                lengths[doc_id] = size
                f.write(json.dumps({"ids": [doc_id] * size}) + "\n")
        tables.append(
            f'[[source]]\nname = "{name}"\npath = "{name}.jsonl"\ntoken_field = "ids"\n'
            f"weight = {0.6 if s == 0 else 0.4}\n"
        )
    return "".join(tables), lengths


def _full_rows(batch: Any) -> np.ndarray:
    """A batch's rows as packed (seq_len + 1 tokens: inputs, then the last label)."""
    last = batch.labels.numpy()[:, -1:]
    return np.concatenate([batch.input_ids.numpy(), np.where(last < 0, 1, last)], axis=1)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("lanes", CHANGES, ids=lambda c: f"{c[0]}to{c[1]}")
def test_every_token_of_every_document_once_across_the_lane_change(tmp_path, lanes, algorithm):
    """`stop` sources drained to their end: the rows of the 3 steps before the
    boundary (2 ranks) and every row the new lanes give after it (3 ranks, from the
    boundary state) hold each document's tokens exactly its length times, and one
    EOS per document: nothing lost (a dropped tail), nothing emitted twice."""
    sources, lengths = _id_sources(tmp_path)
    body = '[mixture]\non_exhausted = "stop"\n'
    recipe = _recipe(tmp_path, lanes, algorithm, body, sources)
    counts: Counter[int] = Counter()
    ranks = make_ranks(recipe, str(COMMITTED_TOKENIZER), 2, prefetch=0)
    for _ in range(BOUNDARY):
        for loader in ranks:
            counts.update(_full_rows(loader.next_batch()).ravel().tolist())
    state = json.loads(json.dumps(save(ranks)))
    close(ranks)
    before = sum(n for t, n in counts.items() if t > 1)
    cut = [t for t, n in counts.items() if 1 < t and 0 < n < lengths[t]]
    after = make_ranks(recipe, str(COMMITTED_TOKENIZER), 3, prefetch=0)
    rows = 0
    for loader in after:
        loader.load_state_dict(state)
        loader.start()
        assert loader.lanes and all(lane.rows_emitted == 0 for lane in loader.lanes)
        for lane in loader.lanes:
            while (row := lane.next_row()) is not None:
                counts.update(row[0].tolist())
                rows += 1
    close(after)
    eos = counts.pop(0)
    counts.pop(1, None)  # padding
    assert dict(counts) == lengths
    assert eos == len(lengths)
    # Not vacuous: much was emitted on both sides, and concat cut documents at
    # the boundary whose rest came after it.
    assert 0.2 < before / sum(lengths.values()) < 0.8 and rows > 0
    if algorithm == "concat":
        assert cut
