"""The model registry: `[model] name` -> the module that defines its `SPEC`.

Adding a model is a folder `torchtitan/models/<name>/` whose `spec.py` defines
`SPEC` (a `ModelSpec`, see spec.py), plus one line in `_SPEC_MODULES`. The
table names modules rather than holding specs, so reading the names (the
launcher checks `[model] name` against them before any worker starts) imports no
model code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from torchtitan.config.job_config import ConfigError, JobConfig
from zephon.schema import did_you_mean

if TYPE_CHECKING:
    from torchtitan.models.spec import ModelSpec

_SPEC_MODULES: dict[str, str] = {
    "llama3": "torchtitan.models.llama3.spec",
    "vlm": "torchtitan.models.vlm.spec",
    "moe": "torchtitan.models.moe.spec",
}
MODEL_NAMES: tuple[str, ...] = tuple(_SPEC_MODULES)


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered as `name`; ValueError naming the known models."""
    if name not in _SPEC_MODULES:
        known = ", ".join(repr(n) for n in MODEL_NAMES)
        raise ValueError(f"unknown model {name!r}: expected one of {known}")
    return importlib.import_module(_SPEC_MODULES[name]).SPEC


def check_model_name(cfg: JobConfig) -> None:
    """`[model] name` is a registered model, and the mixture-of-experts settings are
    set only for one: else a ConfigError naming where it was set and what was
    expected."""
    name = cfg.model.name
    if name not in _SPEC_MODULES:
        source = cfg.provenance.get(("model", "name"), "default")
        known = ", ".join(repr(n) for n in MODEL_NAMES)
        raise ConfigError(
            f"{source}: [model] name = {name!r} is invalid: expected one of {known}"
            f"{did_you_mean(name, MODEL_NAMES)}"
        )
    if get_model_spec(name).training_hooks is not None:
        return
    moe_settings = sorted(k for (section, k) in cfg.provenance if section == "moe")
    if cfg.parallelism.expert_parallel_degree != 1:
        moe_settings.insert(0, "parallelism.expert_parallel_degree")
    if moe_settings:
        first = moe_settings[0] if "." in moe_settings[0] else f"moe.{moe_settings[0]}"
        raise ConfigError(
            f"{first} is set, but the {name} model has no experts: expected a mixture-of-"
            'experts model ([model] name = "moe") or the setting left out'
        )
