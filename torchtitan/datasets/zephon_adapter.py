"""The Zephon loader behind the trainer's loader contract (`contract.RankLoader`).

Zephon's own API stays as it is; this adapter maps it onto the contract: the
end of the data becomes None, rank states merge into one document with
`merge_rank_states`, and a resume is checked (header, fingerprint) before any
training step. The job config tells the loader which of seq_len and the global
batch size the user set on purpose (a recipe's first phase may not disagree)
and the micro-batch rule (rows, or tokens per micro-batch, phase by phase).
"""

from __future__ import annotations

from typing import Any

from torchtitan.config.job_config import JobConfig
from torchtitan.datasets.contract import WrappedLoader
from torchtitan.datasets.hf_adapter import HF_STATE_FORMAT
from zephon import Recipe, StateError, ZephonLoader, merge_rank_states


class ZephonAdapter(WrappedLoader):
    """One data-parallel rank's Zephon loader: its lanes of the global batch."""

    def __init__(self, cfg: JobConfig, recipe: Recipe, dp_rank: int, dp_size: int) -> None:
        t, d = cfg.training, cfg.data
        self.loader = ZephonLoader(
            recipe,
            d.tokenizer,
            t.seq_len,
            t.global_batch_size,
            None if t.local_batch_tokens else t.local_batch_size,
            dp_rank,
            dp_size,
            num_workers=None if d.num_workers < 0 else d.num_workers,
            prefetch=None if d.prefetch < 0 else d.prefetch,
            explicit=cfg.explicit_shape(),
            micro_batch_tokens=t.local_batch_tokens or None,
        )
        self._carried: dict[str, int] = {}  # work counted before the last restore

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_rank_states(states)

    def check_resumable(self, doc: dict[str, Any]) -> None:
        if doc.get("format") == HF_STATE_FORMAT:
            raise StateError(
                "the checkpoint's data state was written by the hf loader; "
                "resume it with --data.loader hf"
            )
        self.loader.check_resumable(doc)

    def load_state(self, doc: dict[str, Any]) -> None:
        self._carried = self.work_done()  # a restore counts the loader's work from zero
        self.loader.load_state_dict(doc)

    def needs_merged_state(self) -> bool:
        return self.loader.needs_boundary_state

    def dropped_records(self) -> int | None:
        if self.loader.recipe.bad_records != "drop":
            return None
        return self.loader.dropped_records()

    def work_done(self) -> dict[str, int]:
        """Documents and tokens made (tokenized, pretokenized or image-text) and
        images decoded since this adapter was built, prefetch included."""
        stats = self.loader.stats()
        now = {
            "tokens_tokenized": stats["tokens_tokenized"],
            "docs_tokenized": stats["docs_tokenized"],
            "images_decoded": stats["work"].get("images_decoded", 0),
        }
        return {k: v + self._carried.get(k, 0) for k, v in now.items()}
