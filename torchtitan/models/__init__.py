"""The model registry: `[model] name` -> the module that defines its `SPEC`.

Adding a model is a folder `torchtitan/models/<name>/` whose `spec.py` defines
`SPEC` (a `ModelSpec`, see spec.py), plus one line in `_SPEC_MODULES`. The
table names modules rather than holding specs, so reading the names (the job
config checks `[model] name` against them) imports no model code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchtitan.models.spec import ModelSpec

_SPEC_MODULES: dict[str, str] = {
    "llama3": "torchtitan.models.llama3.spec",
    "vlm": "torchtitan.models.vlm.spec",
}
MODEL_NAMES: tuple[str, ...] = tuple(_SPEC_MODULES)


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered as `name`; ValueError naming the known models."""
    if name not in _SPEC_MODULES:
        known = ", ".join(repr(n) for n in MODEL_NAMES)
        raise ValueError(f"unknown model {name!r}: expected one of {known}")
    return importlib.import_module(_SPEC_MODULES[name]).SPEC
