"""The hf baseline loader: one rank's shard of the mixed corpus
(`split_dataset_by_node`), packed by `RankPackingStream` in a torchdata
StatefulDataLoader, with per-rank state that resumes exactly at the same
data-parallel size and is refused (or approximated by skipping rows) at another."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from torchtitan.datasets.hf_baseline.corpus import load_mixed_corpus
from torchtitan.datasets.hf_baseline.packing import RankPackingStream
from torchtitan.datasets.hf_baseline.state_codec import from_json, to_json
from zephon import (
    Batch,
    LayoutError,
    Recipe,
    StateError,
    ZephonError,
    load_tokenizer,
    rows_digest,
    rows_to_batch,
)

LOADER_NAME = "hf"
STATE_VERSION = 1
RESUME_MODES = ("refuse", "skip")


class HFBaselineLoader:
    """Per-rank HF `datasets` loader: the data order depends on the data-parallel size."""

    def __init__(
        self,
        recipe: Recipe,
        tokenizer_path: str,
        seq_len: int,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        num_workers: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if len(recipe.phases) > 1:
            raise ZephonError(
                f"{recipe.path}: the hf baseline loader reads one fixed mixture; this recipe "
                f"has {len(recipe.phases)} phases ({', '.join(p.name for p in recipe.phases)}); "
                "use --data.loader zephon"
            )
        if dp_size < 1:
            raise LayoutError(f"dp_size must be >= 1, got {dp_size}")
        if not 0 <= dp_rank < dp_size:
            raise LayoutError(f"dp_rank must be in [0, {dp_size}), got {dp_rank}")
        if global_batch_size < 1 or global_batch_size % dp_size:
            raise LayoutError(
                f"global_batch_size {global_batch_size} must be a positive multiple of "
                f"the data-parallel size {dp_size}"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        # The same tokenizer checks and EOS as Zephon, so the two loaders differ
        # only in how they split, pack and checkpoint.
        tok = load_tokenizer(tokenizer_path, recipe.tokenizer, recipe.path)
        if tok.add_bos:
            raise ZephonError(
                f"{recipe.path}: the hf baseline loader does not prepend a beginning-of-text "
                "token; use --data.loader zephon, or set [tokenizer] add_bos = false"
            )
        eos_id = tok.eos_id

        from datasets.distributed import split_dataset_by_node

        self.recipe = recipe
        self.tokenizer_path = tokenizer_path
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.num_workers = num_workers
        self.local_batch_size = global_batch_size // dp_size
        self._eos_id = int(eos_id)
        corpus = load_mixed_corpus(recipe, cache_dir)
        self._shard = split_dataset_by_node(corpus, rank=dp_rank, world_size=dp_size)
        self._repeat_sources = frozenset(
            i for i, s in enumerate(recipe.sources) if s.on_exhausted == "repeat"
        )
        self._steps = 0
        self._rows_consumed = 0
        self._start_fresh(skip_rows=0)

    # -- internals -------------------------------------------------------

    def _start_fresh(self, skip_rows: int) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.close()
        self._dataset = RankPackingStream(
            self._shard,
            self.tokenizer_path,
            self._eos_id,
            self.seq_len,
            self._repeat_sources,
            pretokenized=self.recipe.sources[0].pretokenized,
            where=f"hf loader rank {self.dp_rank}/{self.dp_size}",
        )
        self._dataset.skip_rows = skip_rows
        with warnings.catch_warnings():
            # torchdata 0.11 calls a deprecated torch API in its constructor
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            self._dl = StatefulDataLoader(
                self._dataset,
                batch_size=self.local_batch_size,
                num_workers=self.num_workers,
                drop_last=True,
            )
        self._iter: Iterator[dict[str, torch.Tensor]] | None = None
        self._exhausted = False
        # Before the first batch, state_dict() reports this instead of asking the
        # dataloader (None = a fresh stream that still has `skip_rows` to drop).
        self._pending_dl_state: dict[str, Any] | None = None
        self._pending_skip = skip_rows

    def _fingerprint(self) -> dict[str, Any]:
        return {
            # The baseline keeps the conventional identity: paths relative to the recipe.
            "recipe_digest": self.recipe.digest(paths=True),
            "tokenizer": os.path.basename(self.tokenizer_path),
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
            "num_workers": self.num_workers,
        }

    # -- public API --------------------------------------------------------

    def next_batch(self) -> Batch:
        """This rank's next `global_batch_size // dp_size` rows; StopIteration at the end."""
        if self._exhausted:
            raise StopIteration
        if self._iter is None:
            self._iter = iter(self._dl)
        try:
            item = next(self._iter)
        except StopIteration:
            self._exhausted = True
            raise
        self._pending_dl_state = None
        self._pending_skip = 0
        tokens = item["tokens"].numpy()
        positions = item["positions"].numpy()
        digests = [rows_digest(t, p) for t, p in zip(tokens, positions, strict=True)]
        batch = rows_to_batch(self._steps, tokens, positions, digests)
        self._steps += 1
        self._rows_consumed += int(tokens.shape[0])
        return batch

    def state_dict(self) -> dict[str, Any]:
        """This rank's state after the batches returned so far (JSON-serialisable)."""
        if self._iter is None:
            dl_state = self._pending_dl_state
        else:
            dl_state = to_json(self._dl.state_dict())
        return {
            "loader": LOADER_NAME,
            "version": STATE_VERSION,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "rows_consumed": self._rows_consumed,
            "steps": self._steps,
            "skip_rows": self._pending_skip if self._iter is None else 0,
            "config": self._fingerprint(),
            "dataloader": dl_state,
        }

    def load_state_dict(self, rank_states: list[dict[str, Any]], mode: str = "refuse") -> None:
        """Restore from every rank's saved state (indexed by rank).

        Same data-parallel size: this rank continues its stream exactly. Another
        size: mode "refuse" raises StateError; mode "skip" starts this rank's new
        shard fresh and drops `total rows consumed // dp_size` rows.
        """
        if mode not in RESUME_MODES:
            raise ValueError(
                f"unknown hf resume mode {mode!r}; expected one of {', '.join(RESUME_MODES)}"
            )
        saved_size = self._check_states(rank_states)
        if saved_size == self.dp_size:
            state = rank_states[self.dp_rank]
            if state["dp_rank"] != self.dp_rank:
                raise StateError(
                    f"hf loader state at index {self.dp_rank} belongs to rank {state['dp_rank']}; "
                    "rank_states must be indexed by rank"
                )
            self._start_fresh(skip_rows=int(state.get("skip_rows", 0)))
            if state["dataloader"] is not None:
                self._dl.load_state_dict(from_json(state["dataloader"]))
                self._pending_dl_state = state["dataloader"]
            self._steps = int(state["steps"])
            self._rows_consumed = int(state["rows_consumed"])
            return
        if mode == "refuse":
            raise StateError(
                f"checkpoint written with {saved_size} data-parallel ranks, this run has "
                f"{self.dp_size}; the hf loader keeps per-rank state and cannot redistribute "
                "it; use the zephon loader, or set --data.hf_resume skip to skip the globally "
                "consumed rows (the data order will differ)"
            )
        total = sum(int(s["rows_consumed"]) for s in rank_states)
        skip = total // self.dp_size
        self._start_fresh(skip_rows=skip)
        self._steps = int(rank_states[0]["steps"])
        self._rows_consumed = skip

    def close(self) -> None:
        """Stop any worker processes; the loader cannot be iterated afterwards until reloaded."""
        it = getattr(self, "_iter", None)
        if it is not None:
            shutdown = getattr(it, "_shutdown_workers", None)
            if callable(shutdown):
                shutdown()
        self._iter = None

    # -- validation ------------------------------------------------------------

    def _check_states(self, rank_states: list[dict[str, Any]]) -> int:
        if not isinstance(rank_states, list | tuple) or not rank_states:
            raise StateError("hf loader: rank_states must be a non-empty list of per-rank states")
        for i, s in enumerate(rank_states):
            if not isinstance(s, dict):
                raise StateError(f"hf loader: rank_states[{i}] is a {type(s).__name__}, not a dict")
            if s.get("loader") != LOADER_NAME:
                raise StateError(
                    f"hf loader: rank_states[{i}].loader is {s.get('loader')!r}; this state was "
                    f"not written by the {LOADER_NAME!r} loader"
                )
            if s.get("version") != STATE_VERSION:
                raise StateError(
                    f"hf loader: rank_states[{i}].version is {s.get('version')!r}; "
                    f"expected {STATE_VERSION}"
                )
            for key in ("dp_rank", "dp_size", "rows_consumed", "steps"):
                if not isinstance(s.get(key), int) or isinstance(s.get(key), bool):
                    raise StateError(
                        f"hf loader: rank_states[{i}].{key} must be an integer, got {s.get(key)!r}"
                    )
            if "dataloader" not in s:
                raise StateError(f"hf loader: rank_states[{i}] has no 'dataloader' entry")
        saved_size = rank_states[0]["dp_size"]
        if any(s["dp_size"] != saved_size for s in rank_states):
            sizes = sorted({s["dp_size"] for s in rank_states})
            raise StateError(f"hf loader: rank states disagree on dp_size: {sizes}")
        if len(rank_states) != saved_size:
            raise StateError(
                f"hf loader: got {len(rank_states)} rank states but they were written with "
                f"dp_size {saved_size}; pass every rank's state, indexed by rank"
            )
        steps = {s["steps"] for s in rank_states}
        if len(steps) != 1:
            raise StateError(f"hf loader: rank states disagree on steps: {sorted(steps)}")
        mine = self._fingerprint()
        saved = rank_states[0].get("config", {})
        for key in ("recipe_digest", "seq_len", "global_batch_size"):
            if key in saved and saved[key] != mine[key]:
                raise StateError(
                    f"hf loader: {key} changed since the checkpoint "
                    f"(saved {saved[key]!r}, now {mine[key]!r})"
                )
        if saved_size == self.dp_size and saved.get("num_workers", self.num_workers) != (
            self.num_workers
        ):
            raise StateError(
                f"hf loader: num_workers changed since the checkpoint (saved "
                f"{saved['num_workers']}, now {self.num_workers}); per-worker state cannot be "
                "restored into a different worker count"
            )
        return saved_size
