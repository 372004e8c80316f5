"""What one part of a source offers the SourceReader: the protocol every format's parts meet.

A part is one file of a source (a JSONL file, a Parquet file and its row groups,
a token array and its offsets file, a tar shard), or one dataset a library loads
(a saved Hugging Face dataset). The reader numbers the documents of its parts
one after another, in the order the format's factory returns them
(zephon/sources/formats.py), and asks each part only for what is below.

Every method is required; `read_docs` has a default, kept by a part that
subclasses `SourcePart` explicitly (parts that can read scattered documents
faster, JSONL and WebDataset, override it). No capability is looked up by
attribute name: a part that has more than one file (a token array's offsets
file) lists them all in `content_files`.
"""

from __future__ import annotations

from typing import Any, Protocol

from zephon.sources.storage import ByteObject


class SourcePart(Protocol):
    """One part of a source: `len(part)` documents, numbered 0..len-1 in file order.

    The order is a pure function of the bytes of `content_files()`: the same bytes
    give the same documents at the same numbers on every rank, every run.
    """

    def __len__(self) -> int:
        """How many documents the part holds (known once the part is opened)."""
        ...

    def read(self, a: int, b: int) -> list[Any]:
        """Values of documents [a, b) (0 <= a < b <= len): text, token ids (a list or
        an integer array) or a MultimodalDoc. A record that cannot be read raises a
        DataError naming the file and the record; the bad_records policy decides
        what becomes of it (bad_records.py)."""
        ...

    def read_docs(self, docs: list[int]) -> list[Any]:
        """Values of documents `docs` (any order, repeats allowed), in that order,
        each as `read(i, i + 1)` gives it; the first bad one raises. By default one
        `read` per document."""
        return [self.read(i, i + 1)[0] for i in docs]

    def content_files(self) -> list[ByteObject]:
        """Every file whose bytes define the part's documents, in a fixed order. A
        checkpoint records their content fingerprints (content.py), so a resume on
        changed files is refused, and the ETags of the remote ones."""
        ...
