"""Zephon: a deterministic, elastic, checkpointable data pipeline.

The global batch of every step is a pure function of (recipe, tokenizer,
seq_len, global batch size, lanes, seed, step) -- with phases, of the recipe's
phases and the step -- never of the number of data-parallel ranks, worker
threads, prefetch depth or micro-batch size.

This module is the public face: the trainer, the scripts and the benchmarks
import from here (and from the stage facades `zephon.images` and
`zephon.sources`), never from a stage's internal modules, so those stay free
to move (tests/unit/test_layering.py holds the trainer to it). The stages,
one package each (docs/architecture.md):

- recipe/:   the TOML spec, its phases over steps, the layout of lanes over ranks;
- sources/:  one module per storage format behind the `Source` protocol, and
             the format registry;
- lanes/:    which documents a lane reads, in what order, packed into rows;
- demand/:   what to read and tokenize next, and the worker threads doing it;
- tokenize/: the tokenizer and long documents in pieces;
- state/:    the checkpoint state, the flush log, restore, boundaries;
- images/:   image-text documents; images/pixels/ is the pixel definition;
- tools/:    the `zephon` command line.
"""

from zephon.batch import IGNORE_INDEX, Batch, rows_to_batch
from zephon.digest import global_batch_digest, rows_digest
from zephon.errors import DataError, LayoutError, RecipeError, StateError, ZephonError
from zephon.files import atomic_write
from zephon.loader import ZephonLoader
from zephon.recipe.layout import Layout, lanes_of_rank, resolve_layout
from zephon.recipe.phases import Phase, PhaseTimeline, resolve_phases
from zephon.recipe.spec import Recipe, SourceSpec, load_recipe
from zephon.state.checkpoint_state import boundary_of, merge_rank_states
from zephon.tokenize.tokenizer import TokenizerInfo, load_tokenizer, tokenizer_file
from zephon.tools.mixture_report import MixtureRow

__all__ = [
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
    "resolve_layout",
    "resolve_phases",
    "rows_digest",
    "rows_to_batch",
    "tokenizer_file",
]
