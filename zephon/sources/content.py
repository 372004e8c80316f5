"""Content fingerprints: what a checkpoint records of a source file's bytes.

A file's fingerprint is its size and an xxh3-64 hash of each sampled block:
the first, middle and last `BLOCK` bytes, or the whole file when it is at most
three blocks long. It never depends on the path, so the same bytes reached
another way (a copied recipe, a corpus on another mount, an `s3://` object
mirrored to disk) give the same fingerprint; a file of another size, or with
other bytes where the blocks are read, gives another. Reading it costs at most
three ranged reads of `BLOCK` bytes per file, whatever the file's size
(docs/design.md §11).

A source's fingerprints are computed once per node: cached (cache.py) under a
key made of its files' identities (path, size and mtime; a remote object's URL
and ETag), so other ranks and later starts read one small JSON file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import xxhash

from zephon.errors import DataError
from zephon.files import atomic_write
from zephon.sources.cache import build_once, cache_key
from zephon.sources.storage import ByteObject

BLOCK = 64 << 10

# A file's fingerprint: [size, [hex hash of each sampled block, in offset order]].
FileFingerprint = list[Any]


def sampled_blocks(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the blocks a fingerprint reads from a file of `size` bytes."""
    if size <= 3 * BLOCK:
        return [(0, size)]
    return [(0, BLOCK), ((size - BLOCK) // 2, BLOCK), (size - BLOCK, BLOCK)]


def file_fingerprint(obj: ByteObject) -> FileFingerprint:
    """The fingerprint of one file, by ranged reads (uncached for remote objects)."""
    hashes = []
    for offset, n in sampled_blocks(obj.size):
        data = obj.sample(offset, n)
        if len(data) != n:  # the file shrank since it was opened
            raise DataError(
                f"{obj.url}: read {len(data)} of {n} bytes at {offset}: the file changed "
                "while the loader started"
            )
        hashes.append(xxhash.xxh3_64_hexdigest(data))
    return [obj.size, hashes]


def source_fingerprints(objects: Sequence[ByteObject], cache_dir: str) -> list[FileFingerprint]:
    """The fingerprints of a source's files in order, built once per node."""
    key = cache_key("content", BLOCK, *(o.identity() for o in objects))
    path = os.path.join(cache_dir, "content", key + ".json")

    def build() -> None:
        atomic_write(path, json.dumps([file_fingerprint(o) for o in objects]), durable=False)

    build_once(cache_dir, key, [path], build)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def block_difference(old: FileFingerprint, new: FileFingerprint) -> str | None:
    """What differs between two fingerprints of a file, in words; None if nothing."""
    if old == new:
        return None
    if old[0] != new[0]:
        return f"size: checkpoint has {old[0]} bytes, this run has {new[0]}"
    for (offset, n), a, b in zip(sampled_blocks(int(new[0])), old[1], new[1], strict=False):
        if a != b:
            return (
                f"content fingerprint of bytes {offset}..{offset + n - 1} (same size, "
                f"{new[0]} bytes): checkpoint has {a}, this run has {b}"
            )
    return f"content fingerprint: checkpoint has {old[1]}, this run has {new[1]}"
