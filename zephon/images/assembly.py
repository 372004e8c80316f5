"""A step's images on one rank: the `ImageBatch`, the lane digests, the ignored labels.

The batch producer (production.py) adds each row's images as it takes the
row from its lane, in canonical order (lane by lane, row by row, position by
position), so concatenating the ranks' images in rank order gives the global
batch's images in lane order, as for the rows (docs/design.md §14).

- Digest: a lane whose rows of the step hold images hashes its rows' digest
  (zephon/digest.py) together with each image's grid and the SHA-256 of its
  grid and patches (`image_digest`), in canonical order. A lane without
  images keeps the rows' digest itself, so every text-only recipe, and the
  text-only lanes of a recipe with images, keep their digests exactly.
  Hashing every pixel costs about 5% of an image's work (0.4 ms of a
  photograph's 9), and most steps' digests are never read (the trainer reads
  them at logged steps with `log_batch_digests`): so the batch's digests are
  a `LaneDigests`, whose image lanes are hashed when first read, on the
  reading thread, from the patches the batch hands the model (they hold them
  until then), unless the producer, ahead of the trainer, hashed them while it
  waited for the trainer to take the batch (production.py). The values are
  the same whenever they are computed.
- Labels: a target that is an image token (start, placeholder, end) is
  ignored: the model reads images and never writes them; the text after an
  image is learnt from the end token's position.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, overload

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

    def wait(self) -> None:
        """Every image of the step decoded (a bad one raised), in canonical order."""
        for image in self.images:
            image.pixels()

    def lane_digests(self, rows_digests: list[bytes]) -> LaneDigests:
        """The step's lane digests (`rows_digests`: each lane's rows, in `end_lane`
        order), each lane with images hashed when first read."""
        ends = self._lane_ends
        lanes = [self.images[ends[i - 1] if i else 0 : ends[i]] for i in range(len(ends))]
        return LaneDigests(rows_digests, lanes)

    def finish(self, labels: np.ndarray, tokens: np.ndarray, ignore: int) -> ImageBatch | None:
        """Set to `ignore` the labels whose targets are image tokens (`labels`: the
        batch's, written in place; `tokens`: the rows as packed, seq_len + 1 each);
        the step's images, or None when its rows hold none."""
        labels[np.isin(tokens[:, 1:], self.token_ids)] = ignore
        if not self.images:
            return None
        return ImageBatch.from_numpy(
            [im.pixels() for im in self.images],  # views: no pixel is copied here
            np.array([im.grid for im in self.images], dtype=np.int64),
            np.array(self.rows, dtype=np.int64),
            np.array(self.starts, dtype=np.int64),
            self.spec.patch_size,
            self.spec.merge,
        )


def lane_digest(rows_digest: bytes, images: Sequence[DocImage]) -> bytes:
    """A lane's digest for a step: its rows' digest alone without images, else
    SHA-256 of the tag, the rows' digest and each image's grid and digest."""
    if not images:
        return rows_digest
    h = hashlib.sha256(DIGEST_TAG)
    h.update(rows_digest)
    for image in images:
        h.update(np.asarray(image.grid, dtype="<i8").tobytes())
        h.update(image.digest())  # waits for a late image's decode
    return h.digest()


class LaneDigests(Sequence[bytes]):
    """A step's lane digests, a lane with images computed when first read (module
    notes); it holds that lane's images until then. Compares equal to the list of
    its values, and pickles and copies as that list."""

    def __init__(self, rows_digests: list[bytes], images: list[list[DocImage]]):
        pairs = zip(rows_digests, images, strict=True)
        self._values: list[bytes | None] = [None if im else d for d, im in pairs]
        self._rows = rows_digests
        self._images: list[list[DocImage] | None] = [im or None for im in images]

    def _value(self, i: int) -> bytes:
        value = self._values[i]
        if value is None:
            images = self._images[i]
            if images is None:  # another thread computed it meanwhile (value first)
                value = self._values[i]
                assert value is not None
                return value
            value = self._values[i] = lane_digest(self._rows[i], images)
            self._images[i] = None  # the patches may go with the batch now
        return value

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self._value(k) for k in range(len(self._values))[i]]
        return self._value(range(len(self._values))[i])  # (negative indices; IndexError)

    def __iter__(self) -> Iterator[bytes]:
        return (self._value(k) for k in range(len(self._values)))

    def compute(self) -> None:
        """Every lane's digest now (the producer, while it waits for the trainer)."""
        for k in range(len(self._values)):
            self._value(k)

    def pending(self) -> int:
        """Lanes whose digest is not computed yet."""
        return sum(v is None for v in self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LaneDigests | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable cache, compared by value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))

    def __repr__(self) -> str:
        return f"LaneDigests({len(self)} lanes, {self.pending()} not computed yet)"
