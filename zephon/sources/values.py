"""Checks on the value of one document: text must be a string, token ids a
list (or integer array) of non-negative ints. Errors name where the document
is and what was found."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from zephon.errors import DataError
from zephon.schema.recipe import SourceSpec

Where = str | Callable[[], str]


def _value_ok(value: Any, spec: SourceSpec) -> bool:
    if spec.pretokenized:
        return isinstance(value, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
        )
    return isinstance(value, str)


def check_value(value: Any, spec: SourceSpec, where: Where) -> Any:
    """Check a document's value; `where` is a string or a callable giving one
    (so a costly location, such as a line number, is only computed on error)."""
    if _value_ok(value, spec):
        return value
    where = where() if callable(where) else where
    if spec.pretokenized:
        got = type(value).__name__
        if isinstance(value, list):
            k = next(k for k, t in enumerate(value) if not _value_ok([t], spec))
            got = f"{value[k]!r} at index {k}"
        raise DataError(
            f"{where}: field '{spec.token_field}' must be a list of non-negative "
            f"token ids, got {got}"
        )
    raise DataError(
        f"{where}: field '{spec.text_field}' must be a string, got {type(value).__name__}"
    )


def check_token_array(values: np.ndarray, field: str, where: Where) -> None:
    """Token ids held as one integer array (many documents at once): all >= 0.

    Vectorised: no Python work per token. The vocabulary bound is checked
    later, against the tokenizer (tokenize.check_token_ids).
    """
    if values.dtype.kind == "u" or len(values) == 0:
        return
    if values.dtype.kind != "i":
        where = where() if callable(where) else where
        raise DataError(
            f"{where}: field '{field}' must hold integer token ids, got dtype {values.dtype}"
        )
    bad = np.flatnonzero(values < 0)
    if len(bad):
        where = where() if callable(where) else where
        raise DataError(
            f"{where}: field '{field}' must be a list of non-negative token ids, "
            f"got {int(values[bad[0]])}"
        )
