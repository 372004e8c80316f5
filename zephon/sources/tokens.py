"""Token arrays: documents tokenized offline, stored as two `.npy` files.

`NAME.tokens.npy` is a flat 1-D array of token ids (uint16 or uint32; any
integer type works) and `NAME.offsets.npy` beside it holds the start of every
document in it plus a final end: n + 1 non-decreasing integers from 0 to
len(tokens). Document k is tokens[offsets[k]:offsets[k+1]]; EOS is appended
by the loader, as for `token_field`. Local files are read through
`numpy.memmap`; remote ones by byte-range reads of the same layout.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.schema.recipe import SourceSpec
from zephon.sources.formats import SourceFormat, register_format
from zephon.sources.part import SourcePart
from zephon.sources.storage import ByteObject, is_remote, open_object
from zephon.sources.values import check_token_array

TOKENS_SUFFIX = ".tokens.npy"
OFFSETS_SUFFIX = ".offsets.npy"
_HEADER_BYTES = 1 << 16  # a .npy header is far shorter than this


def offsets_path(tokens_path: str) -> str:
    if not tokens_path.endswith(TOKENS_SUFFIX):
        raise DataError(
            f"{tokens_path}: format 'tokens' expects files named NAME{TOKENS_SUFFIX}, "
            f"each with its document offsets in NAME{OFFSETS_SUFFIX} beside it"
        )
    return tokens_path[: -len(TOKENS_SUFFIX)] + OFFSETS_SUFFIX


class NpyArray:
    """A 1-D integer .npy file, read by slices without loading it whole."""

    def __init__(self, obj: ByteObject):
        self.obj = obj
        head = io.BytesIO(obj.pread(0, _HEADER_BYTES))
        try:
            version = np.lib.format.read_magic(head)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(head)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(head)
        except (ValueError, OSError) as exc:
            raise DataError(f"{obj.url}: not a .npy array file: {exc}") from None
        if len(shape) != 1 or dtype.kind not in "iu":
            raise DataError(
                f"{obj.url}: expected a 1-D integer array, got shape {shape} dtype {dtype}"
            )
        self.dtype, self.offset, self.len = dtype, head.tell(), int(shape[0])
        if obj.size < self.offset + self.len * dtype.itemsize:
            raise DataError(f"{obj.url}: file is shorter than its .npy header says")
        self._map: Any = None
        if not is_remote(obj.url) and self.len:
            self._map = np.memmap(obj.url, dtype, "r", self.offset, (self.len,))

    def __len__(self) -> int:
        return self.len

    def slice(self, a: int, b: int) -> np.ndarray:
        if self._map is not None:
            return self._map[a:b]
        size = self.dtype.itemsize
        raw = self.obj.pread(self.offset + a * size, (b - a) * size)
        return np.frombuffer(raw, dtype=self.dtype)


class TokenArrayFile(SourcePart):
    def __init__(
        self, obj: ByteObject, storage: dict[str, Any] | None = None, cache_dir: str | None = None
    ):
        self.path = obj.url
        self.offsets_path = offsets_path(obj.url)
        self.tokens = NpyArray(obj)
        try:
            off_obj = open_object(self.offsets_path, storage, cache_dir)
        except DataError:
            raise DataError(
                f"{self.path}: its document offsets file {self.offsets_path} is missing"
            ) from None
        self.offsets = NpyArray(off_obj)
        n = len(self.offsets)
        first = int(self.offsets.slice(0, 1)[0]) if n else None
        last = int(self.offsets.slice(n - 1, n)[0]) if n else None
        if first != 0 or last != len(self.tokens):
            raise DataError(
                f"{self.offsets_path}: expected n + 1 offsets from 0 to {len(self.tokens)} "
                f"(the length of {self.path}), got {n} from {first} to {last}"
            )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def content_files(self) -> list[ByteObject]:
        return [self.tokens.obj, self.offsets.obj]

    def read(self, a: int, b: int) -> list[np.ndarray]:
        offsets = self.offsets.slice(a, b + 1).astype(np.int64)
        if np.any(offsets[1:] < offsets[:-1]):
            k = a + int(np.flatnonzero(offsets[1:] < offsets[:-1])[0])
            raise DataError(
                f"{self.offsets_path}: offsets must not decrease, but offset {k + 1} "
                f"({int(offsets[k + 1 - a])}) < offset {k} ({int(offsets[k - a])})"
            )
        lo, hi = int(offsets[0]), int(offsets[-1])
        values = self.tokens.slice(lo, hi)
        check_token_array(values, "tokens", lambda: f"{self.path}: documents {a} to {b - 1}")
        rel = offsets - lo
        return [values[rel[k] : rel[k + 1]] for k in range(b - a)]


def open_tokens(spec: SourceSpec, files: list[ByteObject], cache_dir: str) -> list[TokenArrayFile]:
    storage = spec.storage_options  # for each offsets file, opened beside its tokens
    return [TokenArrayFile(obj, storage, cache_dir) for obj in files]


register_format(SourceFormat("tokens", open_tokens, suffixes=(TOKENS_SUFFIX,)))
