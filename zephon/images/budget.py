"""The lookahead's second budget: bytes of images, beside the planner's tokens.

Images cost memory out of proportion to their tokens: a 24-megapixel JPEG
decodes to about 72 MB of RGB (and Pillow's working copies, see header.py)
before it becomes a few hundred kilobytes of patches. So the need planner
(planner.py) admits a document of a source with images only while, besides
its tokens, its bytes fit in one budget per rank:

- queued for a call: its patches plus its largest decode peak (from the
  headers, images/work.py `PlannedDoc.cost`), reserved before any pixel is
  decoded, since the call may be decoding it now;
- tokenized, waiting for its lane: its patches;
- taken by its lane: nothing (a lane holds at most its packer's documents).

As with tokens, the step being produced is never held back: an image larger
than the whole budget is still decoded when a lane needs it. Text documents
carry 0 bytes, so a text-only recipe never touches this budget.
"""

from __future__ import annotations

from typing import Any

from zephon.images.documents import ImageDocIds


class ImageBytes:
    """Image bytes reserved or held by the lookahead of one loader."""

    def __init__(self, budget: int):
        self.budget, self.used, self.peak = max(budget, 1), 0, 0
        self.call = 0  # reserved by the call being planned (planner.py: small calls wait)

    def admits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.budget

    def reserve(self, slot: Any, nbytes: int) -> None:
        """A document queued for a call, or given back tokenized to its feed."""
        slot.nbytes += nbytes
        self.used += nbytes
        self.call += nbytes
        self.peak = max(self.peak, self.used)

    def release(self, slot: Any) -> None:
        """A document taken by its lane, or unqueued."""
        self.used -= slot.nbytes
        slot.nbytes = 0

    def stored(self, slot: Any, stats: Any) -> None:
        """A document's call finished: from its reservation to the patches it holds."""
        ids = slot.ids
        held = ids.doc.patch_bytes if type(ids) is ImageDocIds else 0
        self.used += held - slot.nbytes
        slot.nbytes = held
        stats.image_docs += 1
        stats.image_tokens += len(ids)
        stats.images_decoded += len(ids.doc.images) if type(ids) is ImageDocIds else 0

    def stats(self) -> dict[str, int]:
        return {
            "lookahead_bytes": self.used,
            "lookahead_bytes_budget": self.budget,
            "lookahead_peak_bytes": self.peak,
        }


def held_bytes(ids: Any) -> int:
    """Bytes a tokenized document holds in the lookahead (0 for text)."""
    return ids.doc.patch_bytes if type(ids) is ImageDocIds else 0
