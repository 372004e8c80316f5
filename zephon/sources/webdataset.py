"""WebDataset tar shards (`format = "webdataset"`): one image-text sample per key.

A shard is a plain tar. A sample is a run of consecutive members sharing a
key: the member name up to the first dot of its basename (`d/0042.jpg` and
`d/0042.txt` are key `d/0042`, extensions `jpg` and `txt`). Its image is its
`jpg`, `jpeg`, `png` or `webp` member (`image_field` picks one where a sample
has several); its text is its `txt` member, else field `text_field` of its
`json` member. Other members are ignored, and keys with none of these
members are not samples. A key that comes back after other keys is an error
(the shard was not written sample by sample).

Index: each shard is indexed once per node (`cache.build_once`, as JSONL is).
`tarfile` walks the 512-byte headers (GNU and PAX long names included) and
seeks past member data, so a remote shard is read in ranges around its
headers rather than downloaded whole. The index (per sample: key, and offset
and size of each member kind) is a structured `.npy` that readers
memory-map. Reading samples is then byte-range reads (`pread`) of just their
members, nearby members of consecutive samples in one read.
"""

from __future__ import annotations

import json
import os
import tarfile

import numpy as np

from zephon.errors import DataError
from zephon.files import atomic_file
from zephon.schema.recipe import WDS_IMAGE_EXTS, SourceSpec
from zephon.sources.cache import build_once, cache_key
from zephon.sources.formats import SourceFormat, register_format
from zephon.sources.multimodal import ImageSegment, MultimodalDoc, TextSegment
from zephon.sources.part import SourcePart
from zephon.sources.storage import ByteObject

SLOTS = (*WDS_IMAGE_EXTS, "txt", "json")  # member kinds the index records
_TXT, _JSON = SLOTS.index("txt"), SLOTS.index("json")
GAP = 64 << 10  # reading through a gap this small beats a second read
RUN_BYTES = 8 << 20  # at most this much in one read (unless one member is larger)
INDEX_LAYOUT = "wds-1"  # part of the cache key: bump when the index layout changes


def split_name(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name by WebDataset's rule; None without a dot."""
    folder, _, base = name.rpartition("/")
    if "." not in base:
        return None
    stem, ext = base.split(".", 1)
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _scan(obj: ByteObject) -> list[tuple[str, list[int], list[int]]]:
    """[(key, offsets, sizes)] of the shard's samples, in tar order (-1: no such member)."""
    samples: list[tuple[str, list[int], list[int]]] = []
    seen: set[str] = set()
    current: str | None = None
    last = "the start"
    with obj.open() as f:
        try:
            tar = tarfile.open(fileobj=f, mode="r:")
            while (info := tar.next()) is not None:
                tar.members.clear()  # the index is ours; keep memory flat
                last = f"member {info.name!r}"
                parts = split_name(info.name) if info.isreg() else None
                if parts is None:
                    continue
                key, ext = parts
                if key != current:
                    if key in seen:
                        raise DataError(
                            f"{obj.url}: key {key!r} comes back at {last} after other keys; "
                            "a WebDataset shard keeps each sample's members together"
                        )
                    seen.add(key)
                    current = key
                    samples.append((key, [-1] * len(SLOTS), [-1] * len(SLOTS)))
                if ext not in SLOTS:
                    continue
                slot = SLOTS.index(ext)
                offsets, sizes = samples[-1][1], samples[-1][2]
                if offsets[slot] >= 0:
                    raise DataError(f"{obj.url}: key {key!r} has two '{ext}' members")
                if info.offset_data + info.size > obj.size:
                    raise DataError(
                        f"{obj.url}: {last} ends at byte {info.offset_data + info.size}, past the "
                        f"end of the file ({obj.size} bytes): a truncated shard"
                    )
                offsets[slot], sizes[slot] = info.offset_data, info.size
            end = tar.offset
        except tarfile.TarError as exc:
            raise DataError(f"{obj.url}: not a readable tar shard after {last}: {exc}") from None
        # tarfile stops quietly at a damaged or cut-off header: only zeros may follow.
        if end < obj.size:
            f.seek(end)
            block = f.read(tarfile.BLOCKSIZE)
            if len(block) < tarfile.BLOCKSIZE or block.count(0) != len(block):
                raise DataError(
                    f"{obj.url}: truncated or corrupt tar header at byte {end}, after {last}"
                )
    return [s for s in samples if max(s[1]) >= 0]


def _write_index(obj: ByteObject, path: str) -> None:
    samples = _scan(obj)
    keys = [k.encode("utf-8") for k, _, _ in samples]
    dtype = np.dtype(
        [
            ("key", f"S{max([len(k) for k in keys], default=1)}"),
            ("offset", "<i8", (len(SLOTS),)),
            ("size", "<i8", (len(SLOTS),)),
        ]
    )
    index = np.zeros(len(samples), dtype=dtype)
    if samples:
        index["key"] = keys
        index["offset"] = [s[1] for s in samples]
        index["size"] = [s[2] for s in samples]
    with atomic_file(path) as f:
        np.save(f, index)


class TarShard(SourcePart):
    """One shard: its samples by index, read as MultimodalDocs."""

    def __init__(self, obj: ByteObject, spec: SourceSpec, cache_dir: str):
        self.obj, self.url, self.spec = obj, obj.url, spec
        key = cache_key(INDEX_LAYOUT, *obj.identity())
        path = os.path.join(cache_dir, "wdsindex", key + ".npy")
        build_once(cache_dir, key, [path], lambda: _write_index(obj, path))
        try:
            self.index = np.load(path, mmap_mode="r")
        except ValueError:  # numpy cannot memory-map the zero bytes of an empty index
            self.index = np.load(path)

    def __len__(self) -> int:
        return len(self.index)

    def content_files(self) -> list[ByteObject]:
        return [self.obj]

    def read(self, a: int, b: int) -> list[MultimodalDoc]:
        return self.read_docs(list(range(a, b)))

    def _members(self, key: str, offsets: list[int], sizes: list[int]) -> tuple[int, int]:
        """(image slot, text slot) of a sample, or the DataError naming what is missing."""
        where = f"{self.url}: key {key}"
        have = [SLOTS[s] for s in range(len(SLOTS)) if offsets[s] >= 0]
        if self.spec.image_field:
            images = [self.spec.image_field] if self.spec.image_field in have else []
        else:
            images = [e for e in WDS_IMAGE_EXTS if e in have]
        if len(images) != 1:
            wanted = self.spec.image_field or " or ".join(WDS_IMAGE_EXTS)
            problem = "no image member" if not images else "several image members"
            hint = "; set image_field to choose one" if images else ""
            raise DataError(f"{where}: {problem} (expected {wanted}; has {', '.join(have)}){hint}")
        image = SLOTS.index(images[0])
        text = _TXT if offsets[_TXT] >= 0 else _JSON if offsets[_JSON] >= 0 else -1
        if text < 0:
            raise DataError(
                f"{where}: no text (expected a txt member, or a json member with field "
                f"'{self.spec.text_field}'; has {', '.join(have)})"
            )
        if sizes[image] == 0:
            raise DataError(f"{where}: zero-size member {key}.{SLOTS[image]}")
        return image, text

    def read_docs(self, docs: list[int]) -> list[MultimodalDoc]:
        """Samples `docs` (any order, in that order); the first bad one raises."""
        # One gather from the memory-mapped index, then plain Python values: the
        # per-sample numpy scalar lookups were most of a small sample's read cost.
        rows = self.index[np.asarray(docs, dtype=np.int64)] if docs else self.index[:0]
        keys = [k.decode("utf-8") for k in rows["key"].tolist()]
        offsets, sizes = rows["offset"].tolist(), rows["size"].tolist()
        plans = [self._members(*sample) for sample in zip(keys, offsets, sizes, strict=True)]
        spans = [
            [(offs[image], size[image]), (offs[text], size[text])]
            for offs, size, (image, text) in zip(offsets, sizes, plans, strict=True)
        ]
        blobs = self._read_ranges(sorted({r for pair in spans for r in pair}))
        out = []
        for key, (image, text), (image_at, text_at) in zip(keys, plans, spans, strict=True):
            where = f"{self.url}: key {key}"
            name = f"{where} (member {key}.{SLOTS[image]})"
            segments = (
                ImageSegment(blobs[image_at], name),
                TextSegment(self._text(blobs[text_at], text, key, where)),
            )
            out.append(MultimodalDoc(where, segments))
        return out

    def _read_ranges(self, ranges: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """Bytes of each (offset, size), in few reads: runs of nearby ranges read together."""
        out: dict[tuple[int, int], bytes] = {}
        k = 0
        while k < len(ranges):
            lo, end, j = ranges[k][0], ranges[k][0] + ranges[k][1], k + 1
            while j < len(ranges):
                nxt, size = ranges[j]
                if nxt - end > GAP or nxt + size - lo > RUN_BYTES:
                    break
                end, j = max(end, nxt + size), j + 1
            blob = self.obj.pread(lo, end - lo)
            if len(blob) != end - lo:
                raise DataError(
                    f"{self.url}: file is shorter than its index ({lo + len(blob)} < {end} "
                    "bytes); was it changed while being read?"
                )
            for offset, size in ranges[k:j]:
                out[(offset, size)] = blob[offset - lo : offset - lo + size]
            k = j
        return out

    def _text(self, data: bytes, slot: int, key: str, where: str) -> str:
        member = f"{key}.{SLOTS[slot]}"
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{where}: member {member} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
        if slot == _TXT:
            return text
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: member {member} is not valid JSON ({exc.msg})") from None
        field = self.spec.text_field
        if not isinstance(record, dict) or field not in record:
            have = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"{where}: member {member} has no field '{field}' (has: {have})")
        if not isinstance(record[field], str):
            raise DataError(
                f"{where}: field '{field}' of member {member} must be a string, "
                f"got {type(record[field]).__name__}"
            )
        return record[field]


def open_webdataset(spec: SourceSpec, files: list[ByteObject], cache_dir: str) -> list[TarShard]:
    return [TarShard(obj, spec, cache_dir) for obj in files]


register_format(SourceFormat("webdataset", open_webdataset, suffixes=(".tar",), images=True))
