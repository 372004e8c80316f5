"""The hf baseline's per-rank packing stream: one rank's shard tokenized and packed
into rows, with the cursor-plus-buffer state that torchdata's StatefulDataLoader
checkpoints (per worker, so the rows also depend on the worker count)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon import DataError, StateError, tokenizer_file

_READ_CHUNK = 256  # documents fetched from the arrow table at a time


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


class RankPackingStream(IterableDataset):
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
