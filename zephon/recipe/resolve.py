"""Resolve: where a checked recipe's sources are. This is where a recipe touches
storage: path patterns become files (globs, relative to the recipe's folder;
remote URLs listed through fsspec), and `format = "auto"` is guessed from the
first file; a guessed format's image fields are then checked like a named one's.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import replace

from zephon.errors import RecipeError, ZephonError
from zephon.recipe.check import check_source_format
from zephon.recipe.parse import Reader
from zephon.schema.recipe import Recipe, SourceSpec, is_url
from zephon.sources import formats
from zephon.sources.remote import glob as remote_glob


def resolve_recipe(recipe: Recipe, reader: Reader) -> Recipe:
    """`recipe` with every source's files and format."""
    sources = tuple(
        _resolve_source(spec, reader, f"source[{i}]") for i, spec in enumerate(recipe.sources)
    )
    return replace(recipe, sources=sources)


def _resolve_source(spec: SourceSpec, reader: Reader, path: str) -> SourceSpec:
    at = reader.at(path, "path")
    where = f"{at}: source '{spec.name}'"
    paths = resolve_paths(spec, where, reader.file)
    fmt = spec.format
    if fmt == "auto":
        fmt = formats.guess_format(paths[0])
        if fmt is None:
            raise RecipeError(
                f"{where}.format: cannot guess the format of {paths[0]}; "
                f"set format = one of {', '.join(formats.format_names())}"
            )
        check_source_format(replace(spec, format=fmt), reader.at(path))
    return replace(spec, paths=paths, format=fmt)


def resolve_paths(spec: SourceSpec, where: str, file: str) -> tuple[str, ...]:
    """The files of a source's patterns, in pattern order, each pattern's matches
    sorted; `where`: `file:line: source 'name'` for messages."""
    base = os.path.dirname(os.path.abspath(file))
    storage = json.loads(spec.storage) if spec.storage else {}
    folders = spec.format != "auto" and formats.get_format(spec.format).folders
    found: list[str] = []
    for pattern in spec.patterns:
        if is_url(pattern):
            try:
                urls = remote_glob(pattern, storage)
            except ZephonError as exc:
                raise RecipeError(f"{where}.path: {exc}") from None
            if not urls:
                raise RecipeError(f"{where}.path: {pattern!r} matches nothing")
            found.extend(urls)
            continue
        if pattern.startswith("file://"):
            pattern = pattern[len("file://") :]
        full = os.path.normpath(os.path.join(base, os.path.expanduser(pattern)))
        matches = sorted(glob.glob(full)) if glob.has_magic(full) else [full]
        matches = [m for m in matches if os.path.exists(m)]
        if not matches:
            raise RecipeError(
                f"{where}.path: {pattern!r} matches nothing "
                f"(resolved against the recipe folder to {full})"
            )
        for m in matches:
            if not folders and os.path.isdir(m):
                raise RecipeError(
                    f"{where}.path: {m} is a folder; format {spec.format!r} expects files "
                    "(use a glob such as 'folder/*.jsonl')"
                )
            found.append(m)
    if len(set(found)) != len(found):
        raise RecipeError(f"{where}.path: the patterns match some files twice")
    return tuple(found)
