"""The worker side of images: what reading and tokenizing do with a document that has them.

Decoding runs where tokenizing runs (the scheduler's workers), never on a
lane, in two stateless steps (docs/design.md §14):

- when read (`ImageWork.size`): each image's header only, so that the
  planner knows before any pixel is decoded the document's exact image
  tokens, the decode peak to reserve while it is in flight and the patch
  bytes it will hold (`SizedDoc.cost`);
- when tokenized (`ImageWork.encode`): text segments through the tokenizer
  (one call for all of a call's documents), images decoded, resized and cut
  into patches (zephon/images/prepare.py; not hashed: a batch's digests are
  computed when read, images/assembly.py), and the document framed as one id
  array (images/documents.py).
  With two or more workers the call's documents are decoded by that many
  decode processes (images/decode_processes.py), which write the patches
  into shared memory (images/shared_patches.py): started when the call is
  planned (`start`: its bytes, and the patches' slots, are taken then), a
  task's documents (up to TASK_PIXELS, at most 8) decoded one after another
  (and each document's images one after another), so no more documents decode at once
  than there are processes, which is what the byte budget reserves decode
  peaks for (images/budget.py). The document is framed from its images'
  headers (their placeholders and grids are known before any pixel) and
  reaches its lane at once, its pixels to come (`_LateDoc`): lanes pack on
  the sizes, and the step whose rows hold one of its images takes the
  document's results, moving its task to the front of the queue if it was
  not sent yet. So the first batch waits for its own images, not for every
  document the packers hold (best_fit's open bins). Under `bad_records =
  "drop"` the results are taken before the document reaches a lane (a bad
  image empties it, which changes the packing). No byte depends on the
  process count or on when results are taken. With fewer workers the calling
  thread decodes, into memory of its own.

A bad image (not an image, truncated or corrupt, zero bytes, more pixels than
`max_decoded_pixels`) makes its whole document bad: under `bad_records =
"error"` the document becomes a stand-in that raises the ImageError naming
shard and key when its lane picks it (a bad header, or any bad image decoded
on the calling thread), or the step whose rows hold the image raises it (a
body that fails in a decode process); under "drop" it becomes an empty
document (just EOS) at its own index, like any other bad record, and is
counted. Text documents that share a call are encoded exactly as without
images (zephon/tokenize/long_pieces.py).
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon.errors import ImageError
from zephon.images.decode_processes import DocResult, Task, TaskResult, decode_processes
from zephon.images.documents import DocImage, ImageDoc, ImageDocIds, bad_document
from zephon.images.prepare import ImagePatches, ImageSizing, prepare_image, size_image
from zephon.images.shared_patches import PatchArena, Slot
from zephon.images.tokens import ImageTokenIds, image_token_ids
from zephon.schema.recipe import ImageSpec
from zephon.sources.bad_records import DroppingReader
from zephon.sources.multimodal import ImageSegment, MultimodalDoc, TextSegment
from zephon.stage_profile import IMAGE, NULL_CLOCK, StageProfile
from zephon.tokenize.long_pieces import encode_documents
from zephon.tokenize.tokenizer import TokenizerInfo, encode_raw


@dataclass(frozen=True, eq=False)
class SizedDoc:
    """A document of a source with images, read, its images' headers known.

    value: the MultimodalDoc, or "" for a record the reader already dropped.
    error: the first image whose header is bad (then nothing after it is planned)."""

    value: MultimodalDoc | str
    sizings: tuple[ImageSizing, ...]
    error: ImageError | None
    text_chars: int
    image_tokens: int  # start, placeholders and end of every image
    patch_bytes: int
    peak_bytes: int  # the largest decode peak: images are decoded one at a time

    def cost(self, tokens_per_char: float) -> tuple[int, int, int]:
        """(tokens, patch bytes, decode peak) to reserve for it: its image tokens
        exactly and its text by estimate (with EOS); its patches; the largest
        decode peak of its images (decoded one at a time)."""
        tokens = int(self.text_chars * tokens_per_char) + self.image_tokens + 1
        return tokens, self.patch_bytes, self.peak_bytes


# A document's images decoded, in order, or the first bad one's error.
Decoded = list[ImagePatches] | ImageError
MAX_DOCS_PER_TASK = 8  # documents a pool task decodes, one after another
# A task's documents stop at this many decoded pixels: about 3 ms of decoding and
# resizing, against about 0.15 ms of Python a task costs (pickles, pipes, wake-ups).
TASK_PIXELS = 1 << 18


class ImageWork:
    """Reads' and tokenizer calls' work on image documents, for one recipe and tokenizer.

    decoders: decode processes (the loader's workers); 0 or 1 decode on the
    calling thread. profile: where decoding charges its CPU."""

    def __init__(
        self,
        spec: ImageSpec,
        tok: TokenizerInfo,
        decoders: int = 0,
        profile: StageProfile | None = None,
    ):
        self.spec, self.tok, self.profile = spec, tok, profile
        self.ids: ImageTokenIds = image_token_ids(spec, tok.tokenizer.token_to_id, tok.vocab_size)
        self._head = [tok.bos_id] if tok.add_bos else []
        self._decoders = decoders
        self._pool = decode_processes(decoders) if decoders > 1 else None
        self.arena = PatchArena() if self._pool is not None else None
        self._clock = (
            profile.external("zephon-decode-processes") if profile and self._pool else None
        )
        # by id of the doc: (doc, its task, its place in the task's documents, its slots)
        self._started: dict[int, tuple[SizedDoc, Future[TaskResult], int, list[Slot]]] = {}
        self.decoded = 0  # images decoded into patches, by the processes or here
        self._counting = threading.Lock()  # (the processes' results come on 2+ threads)

    @property
    def in_processes(self) -> bool:
        """Decoding runs in decode processes (two workers or more), not on the
        threads that tokenize."""
        return self._pool is not None

    def start(self, values: list[Any], cold: bool = False) -> None:
        """Start decoding a planned call's documents in the decode processes now:
        their bytes are reserved from the moment the call is planned, and the
        processes then never idle while the call before this one finishes its
        slowest document. `cold`: no batch assembled yet (since the start or a
        restore): a task per document, so that the first step's hurry moves its
        own documents, and no other, ahead of the rest."""
        if self._pool is None:
            return
        todo = [v for v in values if _decodable(v)]
        # A few small documents per task, one after another: a task per small
        # document costs more Python than decoding it. But a step that needs one
        # document of a task waits for them all, and has the others decoded before
        # the steps that need them: so a task holds up to TASK_PIXELS, and a
        # document that large is a task of its own.
        per_task = max(1, min(MAX_DOCS_PER_TASK, len(todo) // (2 * self._decoders)))
        if cold:
            per_task = 1
        chunk: list[SizedDoc] = []
        pixels = 0
        for v in todo:
            chunk.append(v)
            pixels += sum(s.header.pixels for s in v.sizings)
            if len(chunk) >= per_task or pixels >= TASK_PIXELS:
                self._submit(chunk)
                chunk, pixels = [], 0
        if chunk:
            self._submit(chunk)

    def _submit(self, chunk: list[SizedDoc]) -> None:
        assert self._pool is not None and self.arena is not None
        slots = [[self.arena.take(s.patch_bytes) for s in v.sizings] for v in chunk]
        docs = [
            [(seg.data, seg.name, slot) for seg, slot in zip(_images_of(v), mine, strict=True)]
            for v, mine in zip(chunk, slots, strict=True)
        ]
        future = self._pool.submit(Task(self.spec, docs, self.arena.segment_names()))
        future.add_done_callback(self._done)
        for k, v in enumerate(chunk):
            self._started[id(v)] = (v, future, k, slots[k])

    def _done(self, future: Future[TaskResult]) -> None:
        """A task ended: count its images decoded, charge its CPU if profiled."""
        if future.cancelled() or future.exception() is not None:
            return
        results, cpu_ns = future.result()
        self._count(sum(len(r) for r in results if not isinstance(r, ImageError)))
        if self._clock is not None:
            self._clock.add(IMAGE, cpu_ns)

    def _count(self, images: int) -> None:
        with self._counting:
            self.decoded += images

    def forget(self, values: list[Any]) -> None:
        """Drop the decodes started for a call that will not run (a reset): their
        tasks are cancelled unless already running, and their slots freed. A
        call's documents share no task with another call's (`start` is per call)."""
        for v in values:
            started = self._started.pop(id(v), None)
            if started is not None and started[0] is v:
                _, future, _, slots = started
                future.cancel()
                future.add_done_callback(lambda _f, slots=slots: self._give(slots))

    def _give(self, slots: list[Slot]) -> None:
        assert self.arena is not None
        for slot in slots:
            self.arena.give(slot)

    def _started_task(self, v: SizedDoc) -> tuple[Future[TaskResult], int, list[Slot]]:
        """The task decoding `v` (submitted now if its call's was not), its place
        in the task and its slots."""
        started = self._started.pop(id(v), None)
        if started is None or started[0] is not v:
            self._submit([v])
            started = self._started.pop(id(v))
        _, future, k, slots = started
        return future, k, slots

    def _take_started(self, v: SizedDoc) -> Decoded:
        future, k, slots = self._started_task(v)
        return self._claim(v, future.result()[0][k], slots)

    def hurry(self, futures: list[Future[TaskResult]]) -> None:
        """These tasks go to the front of the decode queue (in their order there)."""
        assert self._pool is not None
        self._pool.hurry(futures)

    def give_later(self, slots: list[Slot]) -> None:
        assert self.arena is not None
        for slot in slots:
            self.arena.give_later(slot)

    def _claim(self, v: SizedDoc, result: DocResult, slots: list[Slot]) -> Decoded:
        """A decode process's result for a document, its patches as views of their
        slots (freed with the views), or its error (every slot freed now)."""
        assert self.arena is not None
        if isinstance(result, ImageError):
            self._give(slots)
            return result
        width = self.spec.patch_size * self.spec.patch_size * 3
        out = []
        for (grid, num_tokens), slot, seg in zip(result, slots, _images_of(v), strict=True):
            patches = self.arena.view(slot).reshape(-1, width)
            out.append(ImagePatches(seg.name, patches, tuple(grid), num_tokens))
        return out

    def close(self) -> None:
        for v, *_ in list(self._started.values()):
            self.forget([v])
        if self.arena is not None:
            self.arena.close()  # the shared decode processes stay for the next loader

    def size(self, value: Any) -> SizedDoc:
        """The read-time sizing of a value of a source with images (header reads only)."""
        if not isinstance(value, MultimodalDoc):  # a record dropped when read: ""
            return SizedDoc(value, (), None, len(value), 0, 0, 0)
        sizings: list[ImageSizing] = []
        error, chars = None, 0
        for seg in value.segments:
            if isinstance(seg, TextSegment):
                chars += len(seg.text)
            elif error is None:
                try:
                    # kept open for a decode on this thread (prepare.py): a header is
                    # parsed once; a decode process opens the bytes itself
                    keep = self._pool is None
                    sizings.append(size_image(seg.data, seg.name, self.spec, keep_open=keep))
                except ImageError as exc:
                    error = exc
        return SizedDoc(
            value,
            tuple(sizings),
            error,
            chars,
            sum(p.num_tokens + 2 for p in sizings),
            sum(p.patch_bytes for p in sizings),
            max((p.decode_peak_bytes for p in sizings), default=0),
        )

    def encode(self, values: list[Any], origins: list[tuple[Any, int]]) -> list[np.ndarray]:
        """Framed ids of each value: text documents (str) as the text path encodes
        them, planned documents with their images. `origins`: (reader, document
        index) of each value, for dropping a document with a bad image."""
        texts = [v for v in values if isinstance(v, str)]
        text_ids = iter(encode_documents(texts, self.tok) if texts else [])
        segments = [
            s.text
            for v in values
            if isinstance(v, SizedDoc) and isinstance(v.value, MultimodalDoc)
            for s in v.value.segments
            if isinstance(s, TextSegment)
        ]
        seg_ids = iter([e.ids for e in encode_raw(segments, self.tok)] if segments else [])
        out: list[np.ndarray] = []
        for v, (reader, doc_id) in zip(values, origins, strict=True):
            if isinstance(v, str):
                out.append(next(text_ids))
            elif not isinstance(v.value, MultimodalDoc):
                out.append(self._empty())
            else:
                out.append(self._document(v, seg_ids, reader, doc_id, self._images(v, reader)))
        return out

    def _images(self, v: SizedDoc, reader: Any) -> Decoded | _LateDoc:
        """A document's images: decoded here (fewer than two workers); or in the
        decode processes, then waited for now where a bad image must make the
        document empty before any lane sees it (`bad_records = "drop"`), else by the
        first step that needs one of them (`_LateDoc`): lanes pack on the headers'
        sizes meanwhile, and their first rows need only their own images decoded."""
        if v.error is not None:
            return v.error
        if self._pool is None:
            return self._decode(v)
        if isinstance(reader, DroppingReader):
            return self._take_started(v)
        return _LateDoc(self, v, *self._started_task(v))

    def _decode(self, sized: SizedDoc) -> Decoded:
        """A document's images on this thread, one after another: their patches, or
        the first error."""
        doc = sized.value
        assert isinstance(doc, MultimodalDoc)
        clock = self.profile.here("zephon-decode") if self.profile is not None else NULL_CLOCK
        left = clock.switch(IMAGE)
        out = []
        sizings = iter(sized.sizings)  # one per image, in order (no bad header: decodable)
        try:
            for seg in doc.segments:
                if isinstance(seg, TextSegment):
                    continue
                try:
                    patches = prepare_image(seg.data, seg.name, self.spec, next(sizings))
                except ImageError as exc:
                    return exc
                out.append(patches)
            self._count(len(out))
            return out
        finally:
            clock.switch(left)

    def _empty(self) -> np.ndarray:
        return np.array([*self._head, self.tok.eos_id], dtype=np.int32)

    def _document(
        self, sized: SizedDoc, seg_ids: Any, reader: Any, doc_id: int, images: Decoded | _LateDoc
    ) -> np.ndarray:
        doc = sized.value
        assert isinstance(doc, MultimodalDoc)
        texts = [next(seg_ids) for s in doc.segments if isinstance(s, TextSegment)]
        try:
            if isinstance(images, ImageError):
                raise images
            if isinstance(images, _LateDoc):  # sized from the headers, pixels to come
                late = [
                    (s.num_tokens, s.grid, _LateImage(images, i, s.patch_bytes))
                    for i, s in enumerate(sized.sizings)
                ]
                return self._frame(doc, texts, late)
            return self._frame(doc, texts, [(p.num_tokens, p.grid, p.patches) for p in images])
        except ImageError as exc:
            if isinstance(reader, DroppingReader):
                reader.drop(doc_id, exc)
                return self._empty()
            return bad_document(exc)

    def _frame(
        self, doc: MultimodalDoc, texts: list[list[int]], decoded: list[tuple[Any, ...]]
    ) -> ImageDocIds:
        """The document's ids (BOS, segments in order, EOS) and its images: per image
        (placeholder tokens, grid, patches or LatePixels)."""
        ids = self.ids
        pending = iter(decoded)
        pieces: list[Any] = []  # per segment: its text's ids, or (image, its block's length)
        n = len(self._head) + 1  # and EOS
        k = 0
        for seg in doc.segments:
            if isinstance(seg, TextSegment):
                pieces.append(texts[k])
                n += len(texts[k])
                k += 1
            else:
                image = next(pending)
                pieces.append((image, seg.name))
                n += image[0] + 2
        # one array, filled in place: a document is a few pieces, each a slice
        flat = np.empty(n, dtype=np.int32)
        at = len(self._head)
        flat[:at] = self._head
        images: list[DocImage] = []
        for piece in pieces:
            if isinstance(piece, tuple):
                (num_tokens, grid, patches), name = piece
                end = at + num_tokens + 2
                flat[at] = ids.start
                flat[at + 1 : end - 1] = ids.pad
                flat[end - 1] = ids.end
                images.append(DocImage(at, num_tokens, tuple(grid), patches, name))
            else:
                end = at + len(piece)
                flat[at:end] = piece
            at = end
        flat[at] = self.tok.eos_id
        return ImageDocIds.make(flat, ImageDoc(tuple(images)))


def bad_images(value: Any, spec: ImageSpec) -> list[str]:
    """Why each image of a read value cannot be used, decoding it as training would
    (`zephon validate --scan`); [] for a good document or one that is no MultimodalDoc."""
    if not isinstance(value, MultimodalDoc):
        return []
    out = []
    for image in value.images:
        try:
            prepare_image(image.data, image.name, spec)
        except ImageError as exc:
            out.append(str(exc))
    return out


def _images_of(v: SizedDoc) -> list[ImageSegment]:
    assert isinstance(v.value, MultimodalDoc)
    return [s for s in v.value.segments if not isinstance(s, TextSegment)]


def _decodable(v: Any) -> bool:
    """A planned document with images to decode (no bad header)."""
    return isinstance(v, SizedDoc) and isinstance(v.value, MultimodalDoc) and v.error is None


class _LateDoc:
    """A document's images still in a decode process. The first step whose rows
    hold one of them takes them all (having moved their task to the front of the
    queue, with every other task of the step, if it was not sent yet); a bad image
    is raised then, naming its record.
    Slots of a document no step ever takes (its lanes dropped by a restore) are
    freed when its task ends."""

    def __init__(
        self,
        work: ImageWork,
        sized: SizedDoc,
        future: Future[TaskResult],
        k: int,
        slots: list[Slot],
    ) -> None:
        self._work, self._sized, self._future, self._k, self._slots = work, sized, future, k, slots
        self._taken: Decoded | None = None
        self._wanted = False  # its task was hurried
        self._lock = threading.Lock()
        self._untaken = weakref.finalize(self, _free_when_done, future, work, slots)

    def want(self) -> Future[TaskResult] | None:
        """The task to hurry for these images (once), or None."""
        if self._wanted or self._taken is not None or self._future.done():
            return None
        self._wanted = True
        return self._future

    def get(self, i: int) -> np.ndarray:
        with self._lock:
            if self._taken is None:
                if (future := self.want()) is not None:
                    self._work.hurry([future])
                result = self._future.result()[0][self._k]
                self._untaken.detach()
                self._taken = self._work._claim(self._sized, result, self._slots)
        if isinstance(self._taken, ImageError):
            raise self._taken
        return self._taken[i].patches


class _LateImage:
    """Image `i` of a `_LateDoc` (documents.LatePixels)."""

    __slots__ = ("_doc", "_i", "nbytes")

    def __init__(self, doc: _LateDoc, i: int, nbytes: int) -> None:
        self._doc, self._i, self.nbytes = doc, i, nbytes

    def want(self) -> Future[TaskResult] | None:
        return self._doc.want()

    def get(self) -> np.ndarray:
        return self._doc.get(self._i)


def _free_when_done(future: Future[TaskResult], work: ImageWork, slots: list[Slot]) -> None:
    future.add_done_callback(lambda _f: work.give_later(slots))
