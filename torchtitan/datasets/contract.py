"""The loader contract: what the trainer needs from one rank's loader.

The trainer's data glue (`dataloader.TrainDataLoader`) runs the collectives
around a loader and nothing else; each loader kind (Zephon, the hf baseline,
later ones) implements this Protocol in an adapter of its own, so neither the
glue nor the training loop ever asks which kind is running.

Room kept for what comes next: a batch may carry more than the fields below (a
phase name, padded rows, image tensors); the glue reads only these. Padded
rows count through `num_valid_tokens`, and each rank may contribute a
different number of digests to the global batch digest (uneven lanes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TrainBatch(Protocol):
    """One rank's batch of one step, as the trainer reads it."""

    step: int
    digests: list[bytes]
    """32-byte digests of the units this rank adds to the global batch digest, in
    canonical order; their number may differ between ranks."""

    def num_valid_tokens(self) -> int:
        """Tokens whose labels count in the loss (fully ignored rows count 0)."""
        ...

    def micro_batches(self, rows: int) -> Sequence[Any]:
        """The batch cut into micro-batches of `rows` rows, for gradient accumulation;
        a rank with fewer rows than others pads with fully ignored rows, so every
        data-parallel rank runs the same number (FSDP's collectives line up)."""
        ...


@runtime_checkable
class RankLoader(Protocol):
    """One data-parallel rank's loader. Tensor-parallel peers share one: the
    peer that loads wraps it, the others receive its batches and implement this
    contract without a loader (`coordinate_loader.py`)."""

    @property
    def source_names(self) -> tuple[str, ...]:
        """The recipe's source names, in the order of the batch's per-source counts."""
        ...

    def next_batch(self) -> TrainBatch | None:
        """This rank's next batch; None once the data ended on this rank."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """This rank's state after the batches returned so far (JSON-serialisable)."""
        ...

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Every data-parallel rank's `state_dict()`, in rank order, as the one
        document saved beside the checkpoint. Deterministic: every rank gets the same."""
        ...

    def check_resumable(self, doc: dict[str, Any]) -> None:
        """Raise (naming the field) if the saved document cannot be continued by this
        loader; called before any training step and before the model is built."""
        ...

    def load_state(self, doc: dict[str, Any]) -> None:
        """Continue from a saved document (after `check_resumable` passed)."""
        ...

    def needs_merged_state(self) -> bool:
        """Whether the next step starts a phase with another lane count that this
        rank cannot enter alone: it needs `load_state` of every rank's merged state
        first. The same answer on every rank (the glue runs a collective on it)."""
        ...

    def dropped_records(self) -> int | None:
        """Bad records this rank dropped so far; None when this loader does not
        drop records (the same answer on every rank of a data-parallel group, so
        the glue can skip the collective consistently)."""
        ...

    def work_done(self) -> dict[str, int]:
        """Counts of the work this process did for the data so far, by name
        (`tokens_tokenized`, `docs_tokenized`, `images_decoded`, broadcast bytes);
        the glue sums each name over the job. Empty when nothing is counted."""
        ...

    def close(self) -> None:
        """Stop background work (threads, worker processes)."""
        ...


class WrappedLoader:
    """What every adapter does alike around the loader it wraps (`self.loader`,
    built from a recipe): the sources' names, batches until the end (None there),
    its own per-rank state, and closing it."""

    loader: Any

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.loader.recipe.sources)

    def next_batch(self) -> Any:
        try:
            return self.loader.next_batch()
        except StopIteration:
            return None

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def close(self) -> None:
        self.loader.close()
