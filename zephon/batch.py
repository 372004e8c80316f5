"""The batch handed to the trainer, and its cut into micro-batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported on first use: the CLI starts faster without it
    import torch

    from zephon.images.batch import ImageBatch

IGNORE_INDEX = -100


@dataclass
class Batch:
    """A rank's rows for one step.

    input_ids, labels, positions: int64 tensors of shape [rows, seq_len].
    labels are the inputs shifted by one, IGNORE_INDEX on padding.
    positions restart at 0 at every document start (and at row starts).
    digests: 32-byte digests of the units this rank contributes to the
    global batch digest, in canonical order (lanes for Zephon). Ranks may
    contribute different numbers of units (e.g. when ranks own different
    numbers of lanes): the global digest hashes the ranks' lists concatenated
    in rank order, whatever their lengths. With images, a lane's digest is
    computed when first read (zephon.images.assembly.LaneDigests: SHA-256 of
    its pixels, on the reading thread, or by the producer while it waits for
    the trainer); it equals the list of its values.
    source_tokens, source_docs: int64 arrays in recipe source order (Zephon
    only; None otherwise): tokens of this batch's rows (seq_len + 1 each,
    padding excluded) that came from each source, and the documents whose
    first token is in these rows. Summed over ranks they are the same for
    every data-parallel size. Not part of the digest.
    source_names: the recipe's source names, in that order.
    phase: the name of the recipe phase the step belongs to (None: a recipe
    without phases).
    num_padded_rows: rows at the end whose labels are all IGNORE_INDEX, added
    so that every rank runs the same micro-steps (0 when ranks are even).
    padded_to: the rows every rank runs this step (the layout's rows_per_rank;
    0: this batch's own rows). The loader hands over its real rows only;
    `micro_batches` appends padding rows up to it (inputs `pad_id`, labels all
    ignored, positions 0), so padding never enters a digest, the per-source
    counts or the valid-token count.
    images: the images of the rows (`zephon.images.batch.ImageBatch`, in
    canonical order); None for text-only rows. Padding rows have none.
    """

    step: int
    input_ids: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    digests: Sequence[bytes]
    source_tokens: np.ndarray | None = None
    source_docs: np.ndarray | None = None
    source_names: tuple[str, ...] = field(default_factory=tuple)
    phase: str | None = None
    num_padded_rows: int = 0
    images: ImageBatch | None = None
    padded_to: int = 0
    pad_id: int = 0

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def num_valid_tokens(self) -> int:
        labels = self.labels
        if labels.device.type == "cpu":
            # Counted in numpy: a reduction this small would wake torch's intra-op
            # threads, which then spin for a while and take the cores from the
            # loader's tokenizer (about 5 ms of CPU per 64 x 2048 step, timed by hand).
            return int(np.count_nonzero(labels.numpy() != IGNORE_INDEX))
        return int((labels != IGNORE_INDEX).sum())

    def micro_batches(self, rows: int) -> list[Batch]:
        """The batch cut into micro-batches of `rows` rows, padded first to `padded_to`
        rows: every rank gets the same number of micro-batches."""
        total = self.padded_to or self.num_rows
        if total < self.num_rows:
            raise ValueError(f"cannot pad a batch of {self.num_rows} rows to {total}")
        if rows <= 0 or total % rows:
            raise ValueError(f"cannot cut {total} rows into micro-batches of {rows}")
        whole = self._padded(total - self.num_rows)
        real = total - whole.num_padded_rows  # padded rows come last
        return [
            Batch(
                self.step,
                whole.input_ids[i : i + rows],
                whole.labels[i : i + rows],
                whole.positions[i : i + rows],
                [],
                phase=self.phase,
                num_padded_rows=min(rows, max(0, i + rows - real)),
                images=None if self.images is None else self.images.select_rows(i, i + rows),
            )
            for i in range(0, total, rows)
        ]

    def _padded(self, extra: int) -> Batch:
        """This batch with `extra` padding rows appended (itself when 0)."""
        if not extra:
            return self
        import torch

        seq = self.input_ids.shape[1]
        return Batch(
            self.step,
            torch.cat([self.input_ids, self.input_ids.new_full((extra, seq), self.pad_id)]),
            torch.cat([self.labels, self.labels.new_full((extra, seq), IGNORE_INDEX)]),
            torch.cat([self.positions, self.positions.new_zeros((extra, seq))]),
            self.digests,
            phase=self.phase,
            num_padded_rows=self.num_padded_rows + extra,
            images=self.images,
        )


def rows_to_batch(
    step: int, tokens: np.ndarray, positions: np.ndarray, digests: Sequence[bytes]
) -> Batch:
    """Turn packed rows (seq_len + 1 tokens; position -1 marks padding) into a Batch."""
    import torch

    # numpy first, one conversion per tensor: cheap in the prefetch thread and
    # independent of torch's intra-op thread pool. No temporaries the size of the
    # batch beyond the three tensors: fresh memory costs a page fault per 4 KiB.
    labels = tokens[:, 1:].astype(np.int64)
    labels[positions[:, 1:] < 0] = IGNORE_INDEX
    inputs = tokens[:, :-1].astype(np.int64)
    pos = positions[:, :-1].astype(np.int64)
    np.maximum(pos, 0, out=pos)
    return Batch(
        step=step,
        input_ids=torch.from_numpy(inputs),
        labels=torch.from_numpy(labels),
        positions=torch.from_numpy(pos),
        digests=digests,
    )
