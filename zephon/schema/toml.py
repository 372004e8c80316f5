"""Strict TOML reading, shared by the data recipe (zephon/recipe/parse.py) and the
trainer's job config (torchtitan/config/job_config.py).

A configuration file is read once and every value is taken by name with the
type it must have, so a typo never falls back to a default in silence: an
unknown table or key is an error with the nearest known name ("did you mean"),
a value of another type is an error naming what was expected (a TOML boolean is
never an integer, nor the reverse), and every message names the file, the line
of the key where the text shows it, the table and the key. The error class is
the caller's (RecipeError, ConfigError), so each configuration reports in its
own terms.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import MISSING, Field, fields
from typing import Any

# (table path as written, e.g. "training" or "source[2]"; key) -> line number
KeyLines = dict[tuple[str, str], int]

_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*')\s*=")


def did_you_mean(name: str, known: Iterable[str], fmt: str = "{!r}") -> str:
    """`; did you mean 'x'?` for the known name closest to `name`, or ""."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {fmt.format(close[0])}?" if close else ""


def key_lines(text: str) -> KeyLines:
    """Where each key of a TOML text stands: tables by their header, an array of
    tables' entries as `name[i]` (0-based), top-level keys under the table "".
    Keys inside inline tables and multi-line values are not located."""
    lines: KeyLines = {}
    table = ""
    counts: dict[str, int] = {}
    in_string = False
    for number, line in enumerate(text.splitlines(), start=1):
        if in_string:  # the body of a multi-line string
            in_string = line.count('"""') % 2 == 0 and line.count("'''") % 2 == 0
            continue
        header = _HEADER.match(line)
        if header:
            name = header.group(2).replace('"', "").replace("'", "").strip()
            if header.group(1) == "[[":
                counts[name] = counts.get(name, -1) + 1
                name = f"{name}[{counts[name]}]"
            table = name
            lines[(table, "")] = number
            continue
        key = _KEY.match(line)
        if key:
            lines.setdefault((table, key.group(1).strip("\"'")), number)
            value = line.split("=", 1)[1]
            in_string = value.count('"""') % 2 == 1 or value.count("'''") % 2 == 1
    return lines


def read_toml(path: str, error: type[Exception], what: str) -> tuple[dict[str, Any], KeyLines]:
    """The document at `path` and where its keys stand; one `error` naming the file
    (`what` says what it is: "recipe file", "config file") when it cannot be read."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise error(f"{path}: {what} is a folder, expected a TOML file") from None
    except OSError as exc:  # no permission...
        raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not valid TOML: not UTF-8 ({exc.reason})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message gives the line and column
        raise error(f"{path}: not valid TOML: {exc}") from None
    return data, key_lines(text)


def kind_name(kinds: tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kinds)


def matches(value: Any, kinds: tuple[type, ...]) -> tuple[bool, Any]:
    """(whether a TOML value is of one of `kinds`, the value): an integer is
    taken as a float where a float is expected; a boolean is never a number."""
    if isinstance(value, bool):
        return bool in kinds, value
    if float in kinds and isinstance(value, int):
        return True, float(value)
    return isinstance(value, kinds), value


def field_default(f: Field[Any]) -> Any:
    """A dataclass field's default (its factory's value), or MISSING."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def field_defaults(spec: type) -> dict[str, Any]:
    """The defaults a dataclass declares, by field name (defaults are written once)."""
    return {f.name: d for f in fields(spec) if (d := field_default(f)) is not MISSING}


class Table:
    """One TOML table taken key by key; what is left at `finish` is unknown."""

    def __init__(
        self,
        file: str,
        where: str,
        data: Any,
        error: type[Exception],
        lines: KeyLines | None = None,
        spec: type | None = None,
        path: str | None = None,
    ):
        """`where`: the table as messages name it ("source 'web'"); `path`: as the
        file writes it, to find lines ("source[0]"; default `where`); `spec`: the
        dataclass the table fills, whose defaults make keys optional."""
        if not isinstance(data, dict):
            raise error(f"{file}: [{where}] must be a table, got {type(data).__name__}")
        self.file, self.where, self.data, self.error = file, where, dict(data), error
        self.path = where if path is None else path
        self.lines = lines or {}
        self.defaults = field_defaults(spec) if spec is not None else {}
        self.known: list[str] = []  # every key asked for, for `finish`

    def at(self, key: str = "") -> str:
        """`file:line: table.key` (the line where the file shows it)."""
        line = self.lines.get((self.path, key)) or self.lines.get((self.path, ""))
        place = f"{self.file}:{line}" if line else self.file
        return f"{place}: {self.where}.{key}" if key else f"{place}: [{self.where}]"

    def err(self, key: str, msg: str) -> Exception:
        return self.error(f"{self.at(key)}: {msg}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        self.known.append(key)
        if default is ...:
            default = self.defaults.get(key, ...)
        if key not in self.data:
            if default is ...:
                raise self.err(key, "is required")
            return default
        value = self.data.pop(key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok, value = matches(value, kinds)
        if not ok:
            raise self.err(
                key, f"expected {kind_name(kinds)}, got {value!r} ({type(value).__name__})"
            )
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            hint = did_you_mean(value, choices)
            raise self.err(key, f"expected one of {', '.join(choices)}; got {value!r}{hint}")
        return value

    def positive_int(self, key: str, default: Any = ..., minimum: int = 1) -> int:
        value = self.get(key, int, default)
        if value < minimum:
            raise self.err(key, f"expected an integer >= {minimum}, got {value}")
        return value

    def finish(self) -> None:
        """Every key of the table was taken: else one error naming the unknown ones
        (at the first one's line), the known name nearest the first, and every key
        the table takes."""
        if not self.data:
            return
        unknown = sorted(self.data)
        known = sorted(set(self.known))
        line = self.lines.get((self.path, unknown[0])) or self.lines.get((self.path, ""))
        place = f"{self.file}:{line}" if line else self.file
        raise self.error(
            f"{place}: [{self.where}] has unknown key(s): {', '.join(unknown)}"
            f"{did_you_mean(unknown[0], known)}; expected only: {', '.join(known)}"
        )
