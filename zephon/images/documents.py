"""Documents with images as the lanes see them: framed ids plus the images they hold.

A worker turns a document with images into one int32 id array, like a text
document's (BOS if asked, then its segments in order, EOS), in which each
image is a *block*: the start token, one placeholder per merge window, the end
token. `ImageDocIds` is that array; it carries an `ImageDoc` with the images
(uint8 patches, grid, the SHA-256 of grid and patches made by the worker that
decoded them, the record's name) and where each block starts. Lanes, mixer and
packers see an ordinary array of ids (an image counts its N + 2 tokens);
slicing it keeps track of where the slice starts in its document, so a row
built from slices knows which images it holds and where (`row_images`).

A lane may have to leave out an image whose block does not fit in a row of its
segment (`fit_row`: an error naming the record, or under `bad_records =
"drop"` the block removed, counted). Offsets a flush point carries across a
phase boundary are those of the document as the worker made it
(`original_offset`), so the next segment, whatever its row length, removes
what it must from the same starting point whether the document came from
memory or was read again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from zephon.errors import DataError, ImageError


class LatePixels(Protocol):
    """An image's patches still being decoded (images/work.py): their size is known
    from the header; `get` waits for the patches, or raises the ImageError."""

    nbytes: int

    def want(self) -> object | None:
        """A step needs these pixels: returns what to hurry (their decode task), or
        None when they are at hand; `get` follows."""
        ...

    def get(self) -> np.ndarray: ...


@dataclass(frozen=True, eq=False)
class DocImage:
    offset: int  # token offset of the image's start token in its document
    num_tokens: int  # placeholders: num_patches / merge²
    grid: tuple[int, int]  # (h_patches, w_patches)
    patches: np.ndarray | LatePixels  # [num_patches, 3 * p * p] uint8, or still decoding
    name: str  # the record, for error messages

    @property
    def block(self) -> int:
        """Tokens of the image in a row: start, placeholders, end."""
        return self.num_tokens + 2

    @property
    def nbytes(self) -> int:
        return self.patches.nbytes

    def wanted(self) -> object | None:
        """The decode task to hurry for a step that needs this image, if any (once)."""
        return None if isinstance(self.patches, np.ndarray) else self.patches.want()

    def pixels(self) -> np.ndarray:
        """The patches: at hand, or waited for (the step that needs them)."""
        if isinstance(self.patches, np.ndarray):
            return self.patches
        return self.patches.get()

    def digest(self) -> bytes:
        """image_digest of the patches (waited for if late): SHA-256 of every pixel,
        computed when a batch's digest is read, not when decoded (images/assembly.py)."""
        return image_digest(self.grid, self.pixels())

    def moved(self, offset: int) -> DocImage:
        return DocImage(offset, self.num_tokens, self.grid, self.patches, self.name)


def image_digest(grid: tuple[int, int], patches: np.ndarray) -> bytes:
    """SHA-256 of an image as the batch digest covers it: grid (int64 LE), then patches."""
    h = hashlib.sha256(np.asarray(grid, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(patches, dtype=np.uint8))  # its buffer: no copy
    return h.digest()


class ImageDoc:
    """What an `ImageDocIds` array holds besides its ids.

    images: in document order. error: the document's first bad image (the
    `bad_records = "error"` policy: raised when a lane picks the document).
    original: the document as the worker made it, when `fit_row` removed blocks
    from it; removed: (offset here, tokens) of each removed block."""

    __slots__ = ("images", "error", "original", "removed", "longest", "patch_bytes")

    def __init__(
        self,
        images: tuple[DocImage, ...],
        error: DataError | None = None,
        original: ImageDocIds | None = None,
        removed: tuple[tuple[int, int], ...] = (),
    ):
        self.images, self.error = images, error
        self.original, self.removed = original, removed
        longest = patch_bytes = 0  # loops, not generators: one is made per document
        for im in images:
            longest = max(longest, im.block)
            patch_bytes += im.nbytes
        self.longest, self.patch_bytes = longest, patch_bytes


class ImageDocIds(np.ndarray):
    """int32 ids of a document with images; a slice knows where it starts (`start`)."""

    doc: ImageDoc
    start: int

    def __array_finalize__(self, obj: Any) -> None:
        self.doc = getattr(obj, "doc", None)  # type: ignore[assignment]
        self.start = getattr(obj, "start", 0)

    def __getitem__(self, key: Any) -> Any:
        out = super().__getitem__(key)
        if isinstance(key, slice) and isinstance(out, ImageDocIds):
            first, _, step = key.indices(len(self))
            if step != 1:
                raise ValueError("a document's ids are sliced contiguously")
            out.start = self.start + first
        return out

    @staticmethod
    def make(ids: np.ndarray, doc: ImageDoc) -> ImageDocIds:
        out = np.ascontiguousarray(ids, dtype=np.int32).view(ImageDocIds)
        out.doc, out.start = doc, 0
        return out

    def blocks(self) -> np.ndarray:
        """[k, 2] int64: (start, end) offsets of the image blocks, in order."""
        starts = np.array([im.offset for im in self.doc.images], dtype=np.int64)
        ends = starts + np.array([im.block for im in self.doc.images], dtype=np.int64)
        return np.stack([starts, ends], axis=1).reshape(-1, 2)


def bad_document(error: DataError) -> ImageDocIds:
    """The stand-in for a document with a bad image under `bad_records = "error"`: no
    ids; the lane that picks it raises `error` (so the error comes at the step that
    needs the document, whatever the lookahead)."""
    return ImageDocIds.make(np.zeros(0, dtype=np.int32), ImageDoc((), error))


def original_of(ids: np.ndarray) -> np.ndarray:
    """The document as the worker made it (before `fit_row` removed blocks)."""
    if type(ids) is ImageDocIds and ids.doc.original is not None:
        return ids.doc.original
    return ids


def original_offset(ids: np.ndarray, off: int) -> int:
    """Offset `off` of a document a lane packs, in the document as the worker made it."""
    if type(ids) is not ImageDocIds:
        return off
    return off + sum(n for at, n in ids.doc.removed if at <= off)


def _too_long(image: DocImage, row_len: int, dropped: bool) -> ImageError:
    what = (
        "left out of its document"
        if dropped
        else 'lower [image] max_pixels, raise seq_len, or set bad_records = "drop" in '
        "[recipe] to leave such images out"
    )
    return ImageError(
        f"{image.name}: image of {image.num_tokens} placeholder tokens ({image.block} with "
        f"its start and end tokens) does not fit in a row of {row_len} tokens (seq_len "
        f"{row_len - 1}); an image is never split across rows: {what}"
    )


def fit_row(ids: ImageDocIds, row_len: int, drop: Any, doc_id: int, after: int = 0) -> ImageDocIds:
    """The document as a lane of rows of `row_len` tokens packs it.

    Raises the document's image error, if it has one. An image block longer
    than a row that starts at or after offset `after` (of the worker's
    document) is an ImageError naming the record, unless `drop` (a
    DroppingReader, None under "error") takes it: then the block is removed
    and the document recorded as dropped (by its index)."""
    if ids.doc.error is not None:
        raise ids.doc.error
    whole = original_of(ids)
    assert type(whole) is ImageDocIds
    if whole.doc.longest <= row_len:
        return whole
    kept: list[DocImage] = []
    removed: list[tuple[int, int]] = []
    parts: list[np.ndarray] = []
    at = 0  # next offset of `whole` to copy
    for image in whole.doc.images:
        if image.block <= row_len or image.offset < after:
            kept.append(image.moved(image.offset - sum(n for _, n in removed)))
            continue
        if drop is None:
            raise _too_long(image, row_len, False)
        drop.drop(doc_id, _too_long(image, row_len, True))
        parts.append(np.asarray(whole[at : image.offset]))
        removed.append((image.offset - sum(n for _, n in removed), image.block))
        at = image.offset + image.block
    parts.append(np.asarray(whole[at:]))
    return ImageDocIds.make(
        np.concatenate(parts), ImageDoc(tuple(kept), None, whole, tuple(removed))
    )


def row_images(pieces: list[Any]) -> list[tuple[int, DocImage]]:
    """(input position of the first placeholder, image) of every image in a row
    built from `pieces` ((ids, source, starts) each, in row order). A block cut by a
    piece's end is a packing bug, not bad data: it is raised as one."""
    out: list[tuple[int, DocImage]] = []
    at = 0
    for ids, _, _ in pieces:
        if type(ids) is ImageDocIds:
            a, b = ids.start, ids.start + len(ids)
            for image in ids.doc.images:
                if a <= image.offset < b:
                    if image.offset + image.block > b:
                        raise AssertionError(f"{image.name}: image block split across rows")
                    out.append((at + image.offset - a + 1, image))
                elif image.offset < a < image.offset + image.block:
                    raise AssertionError(f"{image.name}: image block split across rows")
        at += len(ids)
    return out


def block_cut(ids: ImageDocIds, at: int) -> int:
    """Where a row that would end before offset `at` of `ids` ends instead: `at`,
    or the start of the image block that `at` falls strictly inside."""
    for image in ids.doc.images:
        if image.offset < at < image.offset + image.block:
            return image.offset
    return at


def image_chunks(ids: ImageDocIds, row_len: int) -> list[tuple[int, int]]:
    """(start, end) of the row-sized chunks `best_fit` splits a document into: as
    long as a row allows, cut only between image blocks (each at most a row long,
    see fit_row)."""
    out, a, n = [], 0, len(ids)
    while a < n:
        b = block_cut(ids, min(a + row_len, n))
        if b == a:  # fit_row lets no such block through: a bug, not bad data
            raise AssertionError(f"an image block at offset {a} is longer than a row")
        out.append((a, b))
        a = b
    return out
