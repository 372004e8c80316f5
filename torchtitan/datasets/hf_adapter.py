"""The conventional hf baseline behind the trainer's loader contract
(`contract.RankLoader`).

Its state is per rank and is saved as the list of every rank's state, so the
merged document only wraps them; whether a resume at another data-parallel
size is refused or approximated is `data.hf_resume`.
"""

from __future__ import annotations

from typing import Any

from torchtitan.config.job_config import JobConfig
from torchtitan.datasets.contract import WrappedLoader
from torchtitan.datasets.hf_baseline import HFBaselineLoader
from zephon import Recipe, StateError

HF_STATE_FORMAT = "hf_baseline.rank_states"


class HFBaselineAdapter(WrappedLoader):
    """One data-parallel rank's hf baseline loader: its shard of the corpus."""

    def __init__(
        self,
        cfg: JobConfig,
        recipe: Recipe,
        dp_rank: int,
        dp_size: int,
        cache_dir: str | None = None,
    ) -> None:
        t, d = cfg.training, cfg.data
        self.loader = HFBaselineLoader(
            recipe,
            d.tokenizer,
            t.seq_len,
            t.global_batch_size,
            dp_rank,
            dp_size,
            num_workers=max(d.num_workers, 0),
            cache_dir=cache_dir,
        )
        self.resume_mode = d.hf_resume

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        return {"format": HF_STATE_FORMAT, "ranks": states}

    def check_resumable(self, doc: dict[str, Any]) -> None:
        if doc.get("format") != HF_STATE_FORMAT:
            raise StateError(
                "the checkpoint's data state was written by the zephon loader; "
                "resume it with --data.loader zephon"
            )

    def load_state(self, doc: dict[str, Any]) -> None:
        self.loader.load_state_dict(doc["ranks"], mode=self.resume_mode)

    def needs_merged_state(self) -> bool:
        return False  # one fixed mixture and lane-free: no lane-count changes

    def dropped_records(self) -> int | None:
        return None  # the baseline keeps no count of dropped records

    def work_done(self) -> dict[str, int]:
        return {}  # its DataLoader workers tokenize out of sight: nothing counted
