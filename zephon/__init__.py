"""Zephon: a deterministic, elastic, checkpointable data pipeline.

The global batch of every step is a pure function of (recipe, tokenizer,
seq_len, global batch size, lanes, seed, step) -- with phases, of the recipe's
phases and the step -- never of the number of data-parallel ranks, worker
threads, prefetch depth or micro-batch size.

This module is the public face: the trainer, the scripts and the benchmarks
import from here (and from the stage facades `zephon.images`, `zephon.schema`
and `zephon.sources`), never from a stage's internal modules, so those stay
free to move (tests/unit/test_layering.py holds them to it; one benchmark,
bench_image_work, times the image stage's own parts and is the exception it
names). The stages, one package each, in the order data flows
(docs/architecture.md, "Package order"):

- schema/:   what a recipe may say, as data, and strict TOML reading;
- sources/:  one module per storage format behind the `Source` protocol, and
             the format registry;
- recipe/:   a recipe file parsed, checked and resolved; its phases over steps,
             the layout of lanes over ranks;
- tokenize/: the tokenizer and long documents in pieces;
- images/:   image-text documents; images/pixels/ is the pixel definition;
- lanes/:    the rules of a lane: which documents, in what order, packed into rows;
- demand/:   what to read and tokenize next, and the worker threads doing it;
- state/:    the checkpoint state, the flush log, the lane-count deal;
- streams/:  each lane running over the demand's feeds: restore, boundaries;
- tools/:    the `zephon` command line.

The names are imported on first use (PEP 562), so that importing one stage
(an image decode process imports only zephon.images) does not load the
loader and its sources.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module that defines it.
_HOME = {
    "Batch": "zephon.batch",
    "IGNORE_INDEX": "zephon.batch",
    "rows_to_batch": "zephon.batch",
    "global_batch_digest": "zephon.digest",
    "rows_digest": "zephon.digest",
    "DataError": "zephon.errors",
    "LayoutError": "zephon.errors",
    "RecipeError": "zephon.errors",
    "StateError": "zephon.errors",
    "ZephonError": "zephon.errors",
    "atomic_write": "zephon.files",
    "ZephonLoader": "zephon.loader",
    "Layout": "zephon.recipe.layout",
    "lanes_of_rank": "zephon.recipe.layout",
    "resolve_layout": "zephon.recipe.layout",
    "STAGES": "zephon.stage_profile",
    "per_token": "zephon.stage_profile",
    "Phase": "zephon.recipe.phases",
    "PhaseTimeline": "zephon.recipe.phases",
    "resolve_phases": "zephon.recipe.phases",
    "Recipe": "zephon.schema.recipe",
    "SourceSpec": "zephon.schema.recipe",
    "load_recipe": "zephon.recipe.load",
    "boundary_of": "zephon.state.checkpoint_state",
    "merge_rank_states": "zephon.state.checkpoint_state",
    "TokenizerInfo": "zephon.tokenize.tokenizer",
    "load_tokenizer": "zephon.tokenize.tokenizer",
    "tokenizer_file": "zephon.tokenize.tokenizer",
    "MixtureRow": "zephon.tools.mixture_report",
}

__all__ = [  # the names of _HOME
    "Batch",
    "DataError",
    "IGNORE_INDEX",
    "Layout",
    "LayoutError",
    "MixtureRow",
    "Phase",
    "PhaseTimeline",
    "Recipe",
    "RecipeError",
    "STAGES",
    "SourceSpec",
    "StateError",
    "TokenizerInfo",
    "ZephonError",
    "ZephonLoader",
    "atomic_write",
    "boundary_of",
    "global_batch_digest",
    "lanes_of_rank",
    "load_recipe",
    "load_tokenizer",
    "merge_rank_states",
    "per_token",
    "resolve_layout",
    "resolve_phases",
    "rows_digest",
    "rows_to_batch",
    "tokenizer_file",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'zephon' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


if TYPE_CHECKING:  # what type checkers and editors see
    from zephon.batch import IGNORE_INDEX, Batch, rows_to_batch
    from zephon.digest import global_batch_digest, rows_digest
    from zephon.errors import DataError, LayoutError, RecipeError, StateError, ZephonError
    from zephon.files import atomic_write
    from zephon.loader import ZephonLoader
    from zephon.recipe.layout import Layout, lanes_of_rank, resolve_layout
    from zephon.recipe.load import load_recipe
    from zephon.recipe.phases import Phase, PhaseTimeline, resolve_phases
    from zephon.schema.recipe import Recipe, SourceSpec
    from zephon.stage_profile import STAGES, per_token
    from zephon.state.checkpoint_state import boundary_of, merge_rank_states
    from zephon.tokenize.tokenizer import TokenizerInfo, load_tokenizer, tokenizer_file
    from zephon.tools.mixture_report import MixtureRow
