"""The source formats a recipe may name, each registered once by the module that reads it.

A format is a name (what `format = "..."` says in a `[[source]]` table), a
factory that opens the parts of a source (part.py's `SourcePart`: one per file,
or per loaded dataset), and the few facts the recipe checks before any file is
opened: the file name endings `format = "auto"` recognises, whether its paths
are folders, whether its records may hold images, whether it reads remote URLs.
The module of a format ends with one `register_format(SourceFormat(...))` call; the
recipe (zephon/recipe/check.py, resolve.py) and the SourceReader (reader.py) ask this module,
never a list of their own. docs/adding_a_source_format.md walks through adding one.

The built-in formats' modules are imported at the end of this module, in the
order of `BUILTIN_MODULES`, so that they are registered, in that order, before
anything can ask: recipe errors list the formats in registration order.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zephon.schema.recipe import SourceSpec
from zephon.sources.part import SourcePart
from zephon.sources.storage import ByteObject

# (source spec, its files, cache folder) -> its parts, in document order. `files`
# holds one byte object per path of the source, in the recipe's order, opened
# through storage.py (local, or remote by ranged reads); for a folder format,
# each is the folder. The cache folder is for derived metadata (indexes).
OpenParts = Callable[[SourceSpec, list[ByteObject], str], Sequence[SourcePart]]


@dataclass(frozen=True)
class SourceFormat:
    name: str  # as a recipe writes it: format = "name"
    open_parts: OpenParts
    # File name endings `format = "auto"` takes for this format (first match wins,
    # formats in registration order); none: the format is only used when named.
    suffixes: tuple[str, ...] = ()
    # The source's paths are folders (one part each), not files.
    folders: bool = False
    # Records may hold images: image_field / texts_field / images_field are allowed.
    images: bool = False
    # Paths may be URLs (s3://...), read through the files' byte objects. False:
    # the format hands local paths to a library, and a remote source is refused.
    remote: bool = True


_formats: dict[str, SourceFormat] = {}


def register_format(fmt: SourceFormat) -> SourceFormat:
    """Add a format; its name must be new (and not "auto", which means "guess")."""
    if not fmt.name or fmt.name == "auto" or fmt.name != fmt.name.strip():
        raise ValueError(f"source format name {fmt.name!r}: expected a word other than 'auto'")
    if fmt.name in _formats:
        raise ValueError(f"source format {fmt.name!r} is registered already")
    _formats[fmt.name] = fmt
    return fmt


def unregister_format(name: str) -> None:
    """Remove a registered format (tests register formats of their own)."""
    if _formats.pop(name, None) is None:
        raise KeyError(f"source format {name!r} is not registered")


def format_names() -> tuple[str, ...]:
    """Every registered format's name, in registration order."""
    return tuple(_formats)


def registered_formats() -> tuple[SourceFormat, ...]:
    return tuple(_formats.values())


def get_format(name: str) -> SourceFormat:
    """The format called `name`; a KeyError listing the registered ones if none is."""
    try:
        return _formats[name]
    except KeyError:
        raise KeyError(
            f"unknown source format {name!r}; registered formats: {', '.join(_formats)}"
        ) from None


def guess_format(path: str) -> str | None:
    """The format `format = "auto"` takes for a source whose first path is `path`:
    the first folder format for a folder, else the first whose suffixes end it."""
    folder = os.path.isdir(path)
    for fmt in _formats.values():
        if folder:
            if fmt.folders:
                return fmt.name
        elif fmt.suffixes and path.endswith(fmt.suffixes):
            return fmt.name
    return None


def one_of(names: Sequence[str]) -> str:
    """'a, b or c': names for a sentence."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


BUILTIN_MODULES = ("jsonl", "parquet", "hf", "tokens", "webdataset")


def _register_builtins() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(f"zephon.sources.{module}")


_register_builtins()
