"""Zephon: a deterministic, elastic, checkpointable data pipeline.

The global batch of every step is a pure function of (recipe, tokenizer,
seq_len, global batch size, lanes, seed, step) -- with phases, of the recipe's
schedule and the step -- never of the number of data-parallel ranks, worker
threads, prefetch depth or micro-batch size.
"""

from zephon.batch import IGNORE_INDEX, Batch
from zephon.digest import global_batch_digest, rows_digest
from zephon.errors import DataError, LayoutError, RecipeError, StateError, ZephonError
from zephon.layout import Layout, lanes_of_rank, plan_layout
from zephon.loader import ZephonLoader
from zephon.phases import Phase, Schedule, resolve_schedule
from zephon.recipe import Recipe, load_recipe
from zephon.state import merge_rank_states
from zephon.tokenize import TokenizerInfo, load_tokenizer

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "DataError",
    "Layout",
    "Phase",
    "LayoutError",
    "Recipe",
    "RecipeError",
    "Schedule",
    "StateError",
    "TokenizerInfo",
    "ZephonError",
    "ZephonLoader",
    "global_batch_digest",
    "lanes_of_rank",
    "load_recipe",
    "load_tokenizer",
    "merge_rank_states",
    "plan_layout",
    "resolve_schedule",
    "rows_digest",
]
