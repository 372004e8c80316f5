"""The value of an image-text document, and how table columns become one.

A source whose records hold images (WebDataset shards, Parquet / Hugging Face
tables with an image column, interleaved documents) gives each document as a
`MultimodalDoc`: an ordered tuple of segments, each a `TextSegment` or an
`ImageSegment` (the encoded bytes, still undecoded: decoding is a worker's
job, see zephon/images/). Every segment and document carries the name of its
record (file and key or row), so any later error can say where it came from.

Tables hold images as raw bytes (a binary column) or as the `{bytes, path}`
struct the `datasets` library writes; interleaved documents (OBELICS style)
as two parallel list columns, `texts` and `images`, with a null in one
wherever the other holds the segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon.errors import DataError
from zephon.schema.recipe import SourceSpec


@dataclass(frozen=True)
class TextSegment:
    text: str


@dataclass(frozen=True)
class ImageSegment:
    data: bytes  # encoded (JPEG, PNG, WebP), not yet decoded
    name: str  # the record it came from, for error messages


Segment = TextSegment | ImageSegment


@dataclass(frozen=True)
class MultimodalDoc:
    name: str  # file and key or row
    segments: tuple[Segment, ...]

    @property
    def images(self) -> list[ImageSegment]:
        return [s for s in self.segments if isinstance(s, ImageSegment)]

    @property
    def text(self) -> str:
        """The text segments joined (for display; the model sees the segments)."""
        return "".join(s.text for s in self.segments if isinstance(s, TextSegment))


def _image_type_ok(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return True
    if pa.types.is_struct(kind):
        names = [kind.field(i).name for i in range(kind.num_fields)]
        return "bytes" in names and _image_type_ok(kind.field("bytes").type)
    return False


def _text_type_ok(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _list_of(kind: Any, ok: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and ok(kind.value_type)


_IMAGE_TYPE = "binary image bytes or the {bytes, path} struct of datasets' Image feature"


class TableRecords:
    """The columns a multimodal table source reads, and its rows as MultimodalDocs."""

    def __init__(self, spec: SourceSpec):
        self.spec = spec
        self.interleaved = bool(spec.images_field)
        if self.interleaved:
            self.columns = [spec.texts_field, spec.images_field]
        else:
            self.columns = [spec.image_field, spec.text_field]

    def check_schema(self, label: str, schema: Any) -> None:
        """Every column exists with a type it can be read as; else a DataError naming it."""
        names = list(schema.names)
        for name in self.columns:
            if name not in names:
                raise DataError(f"{label}: no column '{name}' (columns: {', '.join(names)})")
        first, second = (schema.field(c).type for c in self.columns)
        if self.interleaved:
            checks = [  # (column, its type, readable, what was expected, holds images)
                (self.columns[0], first, _list_of(first, _text_type_ok), "a list of strings", 0),
                (self.columns[1], second, _list_of(second, _image_type_ok), "a list of images", 1),
            ]
        else:
            checks = [
                (self.columns[0], first, _image_type_ok(first), "images", 1),
                (self.columns[1], second, _text_type_ok(second), "strings", 0),
            ]
        for name, kind, ok, expected, images in checks:
            if not ok:
                # OBELICS and many caption sets hold image URLs: say why those cannot work
                urls = images and "string" in str(kind)
                raise DataError(
                    f"{label}: column '{name}' has type {kind}; expected {expected}"
                    + (f" ({_IMAGE_TYPE})" if images else "")
                    + (" - URLs or paths? the image bytes must be in the table" if urls else "")
                )

    def doc(self, values: list[Any], where: str) -> MultimodalDoc:
        """The document of one row: `values` are its column values, in `columns` order."""
        if self.interleaved:
            return _interleaved(values[0], values[1], where, self.spec)
        image = image_bytes(values[0], where, self.spec.image_field)
        text = values[1]
        if not isinstance(text, str):
            raise DataError(
                f"{where}: field '{self.spec.text_field}' must be a string, got {type(text).__name__}"
            )
        return MultimodalDoc(where, (ImageSegment(image, where), TextSegment(text)))


def image_bytes(value: Any, where: str, field: str) -> bytes:
    """The encoded bytes of an image cell: raw bytes, or a {bytes, path} struct."""
    data = value.get("bytes") if isinstance(value, dict) else value
    if data is None:
        path = value.get("path") if isinstance(value, dict) else None
        detail = f" (only a path, {path!r}: embed the image bytes)" if path else " (null)"
        raise DataError(f"{where}: field '{field}' holds no image bytes{detail}")
    if not isinstance(data, bytes):
        raise DataError(
            f"{where}: field '{field}' must hold image bytes, got {type(data).__name__}"
        )
    if not data:
        raise DataError(f"{where}: field '{field}' holds a zero-size image")
    return data


def _null_image(value: Any) -> bool:
    """A missing image: null, or a {bytes, path} struct with both null."""
    if isinstance(value, dict):
        return value.get("bytes") is None and not value.get("path")
    return value is None


def _interleaved(texts: Any, images: Any, where: str, spec: SourceSpec) -> MultimodalDoc:
    """Segments from parallel lists: at each position a text or an image, the other
    null; positions where both are null are skipped."""
    for field, value in ((spec.texts_field, texts), (spec.images_field, images)):
        if not isinstance(value, list):
            raise DataError(f"{where}: field '{field}' must be a list, got {type(value).__name__}")
    if len(texts) != len(images):
        raise DataError(
            f"{where}: '{spec.texts_field}' has {len(texts)} entries but "
            f"'{spec.images_field}' has {len(images)}; they must be parallel"
        )
    segments: list[Segment] = []
    for k, (text, image) in enumerate(zip(texts, images, strict=True)):
        if text is not None and not _null_image(image):
            raise DataError(
                f"{where}: position {k} holds both a text and an image; one of them must be null"
            )
        if text is not None:
            if not isinstance(text, str):
                raise DataError(
                    f"{where}: '{spec.texts_field}'[{k}] must be a string, got {type(text).__name__}"
                )
            segments.append(TextSegment(text))
        elif not _null_image(image):
            name = f"{where} image {k}"
            segments.append(ImageSegment(image_bytes(image, name, spec.images_field), name))
    return MultimodalDoc(where, tuple(segments))
