"""The lookahead's second budget: bytes of images, beside the planner's tokens.

Images cost memory out of proportion to their tokens: a 24-megapixel JPEG
decodes to about 72 MB of RGB (and Pillow's working copies, see header.py)
before it becomes a few hundred kilobytes of patches. So the need planner
(planner.py) admits a document of a source with images only while, besides
its tokens, its bytes fit in one budget per rank:

- queued for a call: its patches (from the headers, images/work.py
  `SizedDoc.cost`), reserved before any pixel is decoded;
- decoding: its decode peak. The decoders take a document at a time each,
  so at most `decoders` documents decode at once: the budget holds the
  `decoders` largest decode peaks of the documents queued (not the sum of
  them all, which on web-sized images was twice the memory really used);
- tokenized, waiting for its lane: its patches;
- taken by its lane: nothing (a lane holds at most its packer's documents).

As with tokens, the rows of the step being produced are never held back: an
image larger than the whole budget is still decoded when a lane needs it.
Text documents carry 0 bytes, so a text-only recipe never touches this budget.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any

from zephon.images.documents import ImageDocIds


class ImageBytes:
    """Image bytes reserved or held by the lookahead of one loader.

    decoders: documents decoded at once (the decode pool's threads, or 1)."""

    def __init__(self, budget: int, decoders: int = 1):
        self.budget, self.held, self.peak = max(budget, 1), 0, 0
        self.decoders = max(decoders, 1)
        self._peaks: list[int] = []  # decode peaks of the queued documents, ascending
        self.call = 0  # patches reserved by the call being planned (planner.py: small calls wait)

    @property
    def used(self) -> int:
        """Patches reserved or held, and the decode peaks that can be in memory at once."""
        return self.held + sum(self._peaks[-self.decoders :])

    def admits(self, nbytes: int, peak: int = 0) -> bool:
        """Whether a document of `nbytes` patches and decode `peak` fits."""
        top = self._peaks[-self.decoders :]
        if peak and (len(top) < self.decoders or peak > top[0]):
            top = sorted([*top, peak])[-self.decoders :]
        return self.held + nbytes + sum(top) <= self.budget

    def reserve(self, slot: Any, nbytes: int, peak: int = 0) -> None:
        """A document queued for a call (its patches; its decode peak until it is
        decoded), or given back tokenized to its feed (its patches)."""
        slot.nbytes += nbytes
        self.held += nbytes
        self.call += nbytes
        if peak:
            slot.peak = peak
            insort(self._peaks, peak)
        self.peak = max(self.peak, self.used)

    def _decoded(self, slot: Any) -> None:
        if slot.peak:
            del self._peaks[bisect_left(self._peaks, slot.peak)]
            slot.peak = 0

    def release(self, slot: Any) -> None:
        """A document taken by its lane, or unqueued."""
        self.held -= slot.nbytes
        slot.nbytes = 0
        self._decoded(slot)

    def stored(self, slot: Any, stats: Any) -> None:
        """A document's call finished: its decode peak is free, its patches held."""
        ids = slot.ids
        held = ids.doc.patch_bytes if type(ids) is ImageDocIds else 0
        self.held += held - slot.nbytes
        slot.nbytes = held
        self._decoded(slot)
        stats.image_docs += 1
        stats.image_tokens += len(ids)
        stats.images_framed += len(ids.doc.images) if type(ids) is ImageDocIds else 0

    def reset(self) -> None:
        """Every lane dropped (a restore or a new segment): nothing reserved."""
        self.held, self._peaks = 0, []

    def stats(self) -> dict[str, int]:
        return {
            "lookahead_bytes": self.used,
            "lookahead_bytes_budget": self.budget,
            "lookahead_peak_bytes": self.peak,
        }


def held_bytes(ids: Any) -> int:
    """Bytes a tokenized document holds in the lookahead (0 for text)."""
    return ids.doc.patch_bytes if type(ids) is ImageDocIds else 0
