"""Reading a feed's documents: the stateless worker side of the scheduler.

A read turns parts of blocks (a span and offsets in visiting order) into the
feed's next slots: texts to tokenize, or ids already checked and framed for a
pretokenized source. It touches nothing the planner changes, so it runs with
the scheduler's lock released, on any thread.
"""

from __future__ import annotations

from typing import Any

from zephon.demand.feeds import Feed, Slot
from zephon.lanes.documents import BlockPart
from zephon.sources import SourceReader
from zephon.stage_profile import IMAGE, current
from zephon.tokenize.tokenizer import TokenizerInfo, check_token_ids


def read_part(reader: Any, part: BlockPart, by_document: bool) -> list[Any]:
    """Values of documents part.start + part.order, in that order: read one by
    one, or as the range they cover."""
    start, order = part.start, part.order
    if not len(order):
        return []
    if by_document:
        try:
            docs = (start + order).tolist()
            if isinstance(reader, SourceReader):  # not a wrapper: bad_records keeps its own reads
                return reader.read_docs(docs)
            return [reader.read_range(i, i + 1)[0] for i in docs]
        except Exception:
            # Report the block's first bad record in file order, as a block read does
            # (the same error whatever the lookahead or worker count).
            reader.read_range(part.start, part.end)
            raise
    lo, hi = int(order.min()), int(order.max()) + 1
    raw = reader.read_range(start + lo, start + hi)
    return [raw[i - lo] for i in order.tolist()]


def read_slots(
    f: Feed, parts: list[BlockPart], tok: TokenizerInfo
) -> tuple[list[Slot], BaseException | None]:
    """The feed's slots for `parts`, and the error that stopped the read, if any
    (a bad part keeps the documents of the parts before it)."""
    slots: list[Slot] = []
    try:
        for part in parts:
            values = read_part(f.reader, part, f.by_document)
            doc_ids = (part.start + part.order).tolist()
            if f.pretokenized:
                framed = check_token_ids(values, doc_ids, f.reader.spec, tok)
                slots += [Slot(None, ids, d, f) for ids, d in zip(framed, doc_ids, strict=True)]
            else:
                if f.images is not None:  # headers read here, pixels when tokenized
                    clock = current()  # header plans are image work, not reading
                    left = clock.switch(IMAGE)
                    try:
                        values = [f.images.size(v) for v in values]
                    finally:
                        clock.switch(left)
                slots += [Slot(v, None, d, f) for v, d in zip(values, doc_ids, strict=True)]
    except BaseException as exc:
        return slots, exc
    return slots, None
