"""The conventional per-rank loader ("hf"), kept as the baseline Zephon is compared against.

It behaves the way a typical Hugging Face `datasets` pipeline in a trainer does:
load and mix the sources, shuffle once, give each data-parallel rank its own
contiguous shard with `split_dataset_by_node`, then tokenize and pack that shard
into rows on the rank. Every rank keeps its own cursor and token buffer.

Consequences, which are the point of the baseline:

* the rows a rank sees, and so the global batch of a step, depend on the
  number of data-parallel ranks;
* the checkpointed state is per rank and cannot be redistributed, so a resume
  at another data-parallel size is refused (mode "refuse"), or approximated by
  skipping the globally consumed number of rows in the new shards (mode
  "skip"), which trains on a different data order.

Row format: each row has `seq_len + 1` tokens (documents concatenated, each
followed by the `<|endoftext|>` id, no padding; documents may span rows) and
per-token positions that restart at 0 at every document start and at every
row start. `Batch.step` is 0 for the first batch of a run and continues
across resumes.
"""

from __future__ import annotations

import base64
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon.batch import Batch, rows_to_batch
from zephon.digest import rows_digest
from zephon.errors import DataError, LayoutError, StateError, ZephonError
from zephon.recipe import Recipe, SourceSpec
from zephon.sources import default_cache_dir as zephon_cache_dir
from zephon.tokenize import load_tokenizer, tokenizer_file

LOADER_NAME = "hf"
STATE_VERSION = 1
RESUME_MODES = ("refuse", "skip")
_READ_CHUNK = 256  # documents fetched from the arrow table at a time


def default_cache_dir() -> str:
    """Where Hugging Face `datasets` keeps its arrow cache for this loader."""
    return os.path.join(zephon_cache_dir(), "hf_baseline")


# -- loading the corpus with Hugging Face datasets ---------------------------


def _load_source(spec: SourceSpec, cache_dir: str) -> Any:
    import datasets

    where = f"source '{spec.name}' ({', '.join(spec.paths)})"
    try:
        if spec.format == "jsonl":
            ds = datasets.load_dataset(
                "json", data_files=list(spec.paths), split="train", cache_dir=cache_dir
            )
        elif spec.format == "parquet":
            ds = datasets.load_dataset(
                "parquet", data_files=list(spec.paths), split="train", cache_dir=cache_dir
            )
        elif spec.format == "hf":
            ds = datasets.load_dataset(
                spec.hf_builder, data_files=list(spec.paths), split="train", cache_dir=cache_dir
            )
        elif spec.format == "hf_disk":
            if len(spec.paths) != 1:
                raise DataError(f"{where}: format 'hf_disk' expects exactly one folder")
            ds = datasets.load_from_disk(spec.paths[0])
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise DataError(
                        f"{where}: the saved DatasetDict has no 'train' split "
                        f"(splits: {', '.join(ds)})"
                    )
                ds = ds["train"]
        else:
            raise DataError(f"{where}: format {spec.format!r} is not supported by the hf loader")
    except DataError:
        raise
    except Exception as exc:  # datasets raises many types; report them with the source
        raise DataError(f"{where}: cannot be read as {spec.format!r}: {exc}") from exc
    return ds


def _normalise_source(ds: Any, spec: SourceSpec, index: int) -> Any:
    """Keep only the document column, renamed to a common name, plus the source index."""
    import datasets

    column = spec.token_field or spec.text_field
    if column not in ds.column_names:
        kind = "token_field" if spec.token_field else "text_field"
        raise DataError(
            f"source '{spec.name}' ({', '.join(spec.paths)}): {kind} {column!r} not found; "
            f"columns are: {', '.join(ds.column_names)}"
        )
    ds = ds.select_columns([column])
    target = "tokens" if spec.pretokenized else "text"
    if column != target:
        ds = ds.rename_column(column, target)
    feature = (
        datasets.Sequence(datasets.Value("int64"))
        if spec.pretokenized
        else datasets.Value("string")
    )
    try:
        if ds.features[target] != feature:
            ds = ds.cast(datasets.Features({target: feature}))
    except Exception as exc:
        raise DataError(
            f"source '{spec.name}': field {column!r} must hold "
            f"{'lists of token ids' if spec.pretokenized else 'strings'}: {exc}"
        ) from exc
    return ds.add_column("source", [index] * len(ds))


def load_mixed_corpus(recipe: Recipe, cache_dir: str | None = None) -> Any:
    """All sources of the recipe as one shuffled map-style `datasets.Dataset`.

    Columns: "text" (or "tokens" for pretokenized sources) and "source" (the
    index of the source in the recipe).
    """
    import datasets

    kinds = {s.pretokenized for s in recipe.sources}
    if len(kinds) > 1:
        raise DataError(
            f"{recipe.path}: the hf loader cannot mix pretokenized sources (token_field) "
            "with text sources (text_field)"
        )
    cache = cache_dir or default_cache_dir()
    parts = [
        _normalise_source(_load_source(spec, cache), spec, i)
        for i, spec in enumerate(recipe.sources)
    ]
    if len(parts) == 1:
        mixed = parts[0]
    else:
        total = sum(s.weight for s in recipe.sources)
        mixed = datasets.interleave_datasets(
            parts,
            probabilities=[s.weight / total for s in recipe.sources],
            seed=recipe.seed,
            stopping_strategy="all_exhausted",
        )
    return mixed.shuffle(seed=recipe.seed)


# -- the per-rank packing stream --------------------------------------------


def _row_positions(doc_starts: list[int], length: int) -> np.ndarray:
    """Positions for a row: 0 at the row start and at every document start, else +1."""
    flags = np.zeros(length, dtype=bool)
    flags[0] = True
    flags[[s for s in doc_starts if s < length]] = True
    idx = np.arange(length)
    last_start = np.maximum.accumulate(np.where(flags, idx, 0))
    return idx - last_start


def _worker_share(total: int, worker: int, workers: int) -> int:
    return total // workers + (1 if worker < total % workers else 0)


class _RankPackingStream(IterableDataset):
    """Tokenizes and packs one rank's shard into rows; its state is a cursor plus the
    leftover token buffer (shorter than one row), so StatefulDataLoader can checkpoint it.

    With DataLoader worker processes, each worker packs its own contiguous part of
    the shard (so the rows also depend on the worker count, as upstream).
    """

    def __init__(
        self,
        shard: Any,
        tokenizer_path: str,
        eos_id: int,
        seq_len: int,
        repeat_sources: frozenset[int],
        pretokenized: bool,
        where: str,
    ) -> None:
        super().__init__()
        self.shard = shard
        self.tokenizer_path = tokenizer_path
        self.eos_id = eos_id
        self.seq_len = seq_len
        self.repeat_sources = repeat_sources
        self.pretokenized = pretokenized
        self.where = where
        self._tokenizer: Any = None
        self.epoch = 0
        self.sample_idx = 0  # next document of this worker's part of the shard
        self.buffer: list[int] = []
        self.doc_starts: list[int] = []  # offsets in buffer where a document begins
        self.skip_rows = 0  # rows still to drop (resume mode "skip")
        self.skip_split = False  # whether skip_rows is already this worker's share

    # Stateful protocol used by torchdata's StatefulDataLoader
    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "sample_idx": self.sample_idx,
            "buffer": list(self.buffer),
            "doc_starts": list(self.doc_starts),
            "skip_rows": self.skip_rows,
            "skip_split": self.skip_split,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.epoch = int(state["epoch"])
            self.sample_idx = int(state["sample_idx"])
            self.buffer = [int(t) for t in state["buffer"]]
            self.doc_starts = [int(s) for s in state["doc_starts"]]
            self.skip_rows = int(state["skip_rows"])
            self.skip_split = bool(state["skip_split"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"{self.where}: malformed hf loader dataset state: {exc!r}") from exc

    def _encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(tokenizer_file(self.tokenizer_path))
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def _part(self) -> Any:
        info = get_worker_info()
        if info is None or info.num_workers == 1:
            return self.shard
        if not self.skip_split:
            self.skip_rows = _worker_share(self.skip_rows, info.id, info.num_workers)
            self.skip_split = True
        return self.shard.shard(num_shards=info.num_workers, index=info.id, contiguous=True)

    def _take_row(self) -> tuple[list[int], list[int]]:
        n = self.seq_len + 1
        row, starts = self.buffer[:n], [s for s in self.doc_starts if s < n]
        self.buffer = self.buffer[n:]
        self.doc_starts = [s - n for s in self.doc_starts if s >= n]
        return row, starts

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        part = self._part()
        key = "tokens" if self.pretokenized else "text"
        n = self.seq_len + 1
        while True:
            # Emit every complete row before reading on, so that the state seen at
            # each yield is exactly "after this row".
            while len(self.buffer) >= n:
                row, starts = self._take_row()
                if self.skip_rows > 0:
                    self.skip_rows -= 1
                    continue
                yield {
                    "tokens": torch.tensor(row, dtype=torch.int64),
                    "positions": torch.from_numpy(_row_positions(starts, n)),
                }
            if self.sample_idx >= len(part):
                if not self.repeat_sources:
                    return  # leftover tokens shorter than a row are dropped
                if self.sample_idx == 0 or not self._has_repeating_docs(part):
                    raise DataError(
                        f"{self.where}: no documents to repeat in this shard "
                        "(the corpus is too small for this many ranks/workers)"
                    )
                self.epoch += 1
                self.sample_idx = 0
            end = min(self.sample_idx + _READ_CHUNK, len(part))
            chunk = part[self.sample_idx : end]
            for doc, source in zip(chunk[key], chunk["source"], strict=True):
                self.sample_idx += 1
                if self.epoch > 0 and source not in self.repeat_sources:
                    continue  # a "stop" source is not read again after its first pass
                ids = list(doc) if self.pretokenized else self._encode(doc)
                self.doc_starts.append(len(self.buffer))
                self.buffer.extend(ids)
                self.buffer.append(self.eos_id)
                if len(self.buffer) >= n:
                    break  # emit rows now; resume reading at sample_idx

    def _has_repeating_docs(self, part: Any) -> bool:
        if len(part) == 0:
            return False
        sources = set(part.unique("source"))
        return bool(sources & self.repeat_sources)


# -- JSON encoding of the StatefulDataLoader state ---------------------------


def _to_json(value: Any) -> Any:
    """Make a StatefulDataLoader state JSON-serialisable, reversibly."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_to_json(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k.startswith("__") for k in value):
            return {k: _to_json(v) for k, v in value.items()}
        return {"__items__": [[_to_json(k), _to_json(v)] for k, v in value.items()]}
    if isinstance(value, torch.Tensor):
        return {
            "__tensor__": value.detach().cpu().tolist(),
            "dtype": str(value.dtype).removeprefix("torch."),
        }
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    raise StateError(
        f"hf loader: cannot store a {type(value).__name__} from the dataloader state as JSON"
    )


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(_from_json(v) for v in value["__tuple__"])
        if "__items__" in value:
            return {_from_json(k): _from_json(v) for k, v in value["__items__"]}
        if "__tensor__" in value:
            return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
        if "__bytes__" in value:
            return base64.b64decode(value["__bytes__"])
        return {k: _from_json(v) for k, v in value.items()}
    return value


# -- the loader ---------------------------------------------------------------


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
        self._dataset = _RankPackingStream(
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
            "recipe_digest": self.recipe.digest(),
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
            dl_state = _to_json(self._dl.state_dict())
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
                self._dl.load_state_dict(_from_json(state["dataloader"]))
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
