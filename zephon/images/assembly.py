"""A step's images on one rank: the `ImageBatch`, the lane digests, the ignored labels.

The batch producer (production.py) adds each row's images as it takes the
row from its lane, in canonical order (lane by lane, row by row, position by
position), so concatenating the ranks' images in rank order gives the global
batch's images in lane order, as for the rows (docs/design.md §14).

- Digest: a lane whose rows of the step hold images hashes its rows' digest
  (zephon/digest.py) together with each image's grid and the SHA-256 its
  worker made of grid and patches, in canonical order. A lane without images
  keeps the rows' digest itself, so every text-only recipe, and the text-only
  lanes of a recipe with images, keep their digests exactly.
- Labels: a target that is an image token (start, placeholder, end) is
  ignored: the model reads images and never writes them; the text after an
  image is learnt from the end token's position.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from zephon.images.batch import ImageBatch
from zephon.images.documents import DocImage

DIGEST_TAG = b"zephon lane images v1"


class BatchImages:
    """The images of one step's rows of a rank, collected in canonical order: every
    lane's rows are added (`add_row`, `end_lane`), then the images still decoding
    are hurried at once (`hurry`), then each lane's digest waits for its own."""

    def __init__(self, work: Any):
        self.work = work
        self.spec = work.spec
        self.token_ids = np.array([work.ids.start, work.ids.pad, work.ids.end], dtype=np.int32)
        self.rows: list[int] = []
        self.starts: list[int] = []
        self.images: list[DocImage] = []
        self._lane_ends: list[int] = []

    def add_row(self, row: int, placed: list[tuple[int, DocImage]]) -> None:
        """Row `row` of the batch holds these images (first placeholder, image)."""
        for start, image in placed:
            self.rows.append(row)
            self.starts.append(start)
            self.images.append(image)

    def end_lane(self) -> None:
        """The rows added since the last call are the next lane's."""
        self._lane_ends.append(len(self.images))

    def hurry(self) -> None:
        """Every image of the step still decoding goes to the front of the decode
        queue now, before any lane waits for one: otherwise the processes would
        decode other documents' images while the step waits lane after lane."""
        tasks = [t for im in self.images if (t := im.wanted()) is not None]
        if tasks:
            self.work.hurry(tasks)

    def lane_digest(self, lane: int, rows_digest: bytes) -> bytes:
        """The digest of the step's `lane`-th lane (in `end_lane` order)."""
        first = self._lane_ends[lane - 1] if lane else 0
        mine = self.images[first : self._lane_ends[lane]]
        if not mine:
            return rows_digest
        h = hashlib.sha256(DIGEST_TAG)
        h.update(rows_digest)
        for image in mine:
            h.update(np.asarray(image.grid, dtype="<i8").tobytes())
            h.update(image.pixels()[1])  # waits for a late image's decode
        return h.digest()

    def finish(self, labels: np.ndarray, tokens: np.ndarray, ignore: int) -> ImageBatch | None:
        """Set to `ignore` the labels whose targets are image tokens (`labels`: the
        batch's, written in place; `tokens`: the rows as packed, seq_len + 1 each);
        the step's images, or None when its rows hold none."""
        labels[np.isin(tokens[:, 1:], self.token_ids)] = ignore
        if not self.images:
            return None
        return ImageBatch.from_numpy(
            [im.pixels()[0] for im in self.images],  # views: no pixel is copied here
            np.array([im.grid for im in self.images], dtype=np.int64),
            np.array(self.rows, dtype=np.int64),
            np.array(self.starts, dtype=np.int64),
            self.spec.patch_size,
            self.spec.merge,
        )
