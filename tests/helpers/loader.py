"""Helpers shared by the Zephon tests: simulate D ranks in one process."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from zephon import ZephonLoader, global_batch_digest, load_tokenizer, merge_rank_states
from zephon.batch import Batch

SEQ_LEN = 32
GLOBAL_BATCH = 16


_tokenizer = lru_cache(maxsize=4)(load_tokenizer)


def make_ranks(recipe: Any, tok: Any, dp: int, **kw: Any) -> list[ZephonLoader]:
    if isinstance(tok, str):
        tok = _tokenizer(tok)  # parse tokenizer.json once per test session
    kw.setdefault("seq_len", SEQ_LEN)
    kw.setdefault("global_batch_size", GLOBAL_BATCH)
    return [ZephonLoader(recipe, tok, dp_rank=r, dp_size=dp, **kw) for r in range(dp)]


def step_digests(
    loaders: list[ZephonLoader], steps: int, batches: list[list[Batch]] | None = None
) -> list[str]:
    """Global digest of each step, lanes gathered in rank order. At a phase that
    changes the lane count every rank gets the merged state first, as the trainer
    gives it. `batches`: if given, each step's batches (in rank order) are appended."""
    out = []
    for _ in range(steps):
        if any(loader.needs_boundary_state for loader in loaders):
            state = save(loaders)
            for loader in loaders:
                loader.load_state_dict(state)
        step = [loader.next_batch() for loader in loaders]
        if batches is not None:
            batches.append(step)
        out.append(global_batch_digest([d for batch in step for d in batch.digests]))
    return out


def save(loaders: list[ZephonLoader]) -> dict[str, Any]:
    return merge_rank_states([loader.state_dict() for loader in loaders])


def close(loaders: list[ZephonLoader]) -> None:
    for loader in loaders:
        loader.close()
