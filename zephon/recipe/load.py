"""A recipe file into a `Recipe`, in three steps with one hand-off each: parse (the
TOML, strictly: parse.py), check (what the values mean together: check.py), and
resolve (where the files are, the only step that touches storage: resolve.py)."""

from __future__ import annotations

import os
from typing import Any

from zephon.errors import RecipeError
from zephon.recipe import check, parse, resolve
from zephon.schema.recipe import Recipe
from zephon.schema.toml import KeyLines, read_toml


def parse_recipe(data: dict[str, Any], file: str, lines: KeyLines | None = None) -> Recipe:
    """The recipe of a TOML document already read (`file` names it in messages):
    parsed, checked and resolved."""
    reader = parse.Reader(file, lines)
    draft = parse.parse_recipe(data, file, lines)
    check.check_recipe(draft, reader)
    return resolve.resolve_recipe(draft, reader)


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Read, check and resolve a recipe file; a RecipeError names the file, the line
    and the key."""
    file = os.fspath(path)
    data, lines = read_toml(file, RecipeError, "recipe file")
    return parse_recipe(data, file, lines)
