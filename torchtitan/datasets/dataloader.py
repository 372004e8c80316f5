"""The trainer's data side: build the `[data]` loader, gather its checkpoint
state and the global batch digest across the data-parallel ranks, and restore
it on resume. Collectives run over the data-parallel group (one per
tensor-parallel coordinate), never the world: tensor-parallel peers hold the
same batch and would otherwise be counted twice."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from torchtitan.config.job_config import ConfigError, JobConfig
from torchtitan.datasets.hf_baseline import HFBaselineLoader
from zephon import (
    Batch,
    Layout,
    LayoutError,
    StateError,
    ZephonLoader,
    global_batch_digest,
    load_recipe,
    merge_rank_states,
    plan_layout,
)
from zephon.recipe import Recipe
from zephon.state import check_fingerprint, check_header

HF_STATE_FORMAT = "hf_baseline.rank_states"


class TrainDataLoader:
    """One rank's loader (Zephon or the conventional hf baseline) plus the
    collective operations the trainer needs around it."""

    def __init__(
        self,
        cfg: JobConfig,
        dp_rank: int,
        dp_size: int,
        recipe_path: str | None = None,
        for_validation: bool = False,
        dp_group: dist.ProcessGroup | None = None,
        tp_group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
    ):
        """`dp_group`: the data-parallel ranks (None = the world); `tp_group`: this
        rank's tensor-parallel peers, whose batches must agree; `device`: where the
        digest collective runs (a CUDA device under NCCL)."""
        self.dp_group, self.tp_group = dp_group, tp_group
        self.dp_size = dp_size
        self.device = device or torch.device("cpu")
        self.kind = "zephon" if for_validation else cfg.data.loader
        recipe = load_recipe(recipe_path or cfg.data.recipe)
        t = cfg.training
        workers = None if cfg.data.num_workers < 0 else cfg.data.num_workers
        if self.kind == "zephon":
            self.loader: ZephonLoader | HFBaselineLoader = ZephonLoader(
                recipe,
                cfg.data.tokenizer,
                t.seq_len,
                t.global_batch_size,
                t.local_batch_size,
                dp_rank,
                dp_size,
                num_workers=workers,
                prefetch=None if cfg.data.prefetch < 0 else cfg.data.prefetch,
            )
        else:
            self.loader = HFBaselineLoader(
                recipe,
                cfg.data.tokenizer,
                t.seq_len,
                t.global_batch_size,
                dp_rank,
                dp_size,
                num_workers=0 if workers is None else workers,
            )
        self.resume_mode = cfg.data.hf_resume

    def next_batch(self) -> Batch | None:
        """This rank's batch, or None when the data ended on this rank."""
        try:
            return self.loader.next_batch()
        except StopIteration:
            return None

    def global_digest(self, batch: Batch) -> str:
        """Collective: SHA-256 of the global batch in canonical order.

        Every rank contributes the same number of 32-byte unit digests (its lanes,
        or rows for the hf loader), so one fixed-size uint8 all-gather in rank
        order yields them in canonical order. Tensor-parallel peers must hold
        byte-identical batches; that is checked here too."""
        local = torch.frombuffer(bytearray(b"".join(batch.digests)), dtype=torch.uint8)
        local = local.view(-1, 32).to(self.device)
        if self.tp_group is not None:
            peers = _all_gather(local, self.tp_group)
            if not bool((peers == local.unsqueeze(0)).all()):
                raise RuntimeError(
                    f"tensor-parallel peers received different batches at step {batch.step}: "
                    "their data-parallel coordinates disagree"
                )
        parts = _all_gather(local, self.dp_group).cpu().reshape(-1, 32).numpy()
        return global_batch_digest([row.tobytes() for row in parts])

    def bad_records_dropped(self) -> int | None:
        """Collective when the recipe drops bad records: how many all ranks
        dropped so far; None (no collective) under the default policy."""
        if self.kind != "zephon" or self.loader.recipe.bad_records != "drop":
            return None
        assert isinstance(self.loader, ZephonLoader)
        n = torch.tensor([self.loader.dropped_records()], dtype=torch.int64, device=self.device)
        dist.all_reduce(n, group=self.dp_group)  # TP peers hold the same lanes: not counted
        return int(n.item())

    def gather_state(self) -> dict[str, Any] | None:
        """Collective: the loader state of all data-parallel ranks as one document
        (on every rank); `dp_size` in it is the data-parallel size."""
        states: list[Any] = [None] * self.dp_size
        dist.all_gather_object(states, self.loader.state_dict(), group=self.dp_group)
        if self.kind == "zephon":
            return merge_rank_states(states)
        return {"format": HF_STATE_FORMAT, "ranks": states}

    def check_resumable(self, doc: dict[str, Any]) -> None:
        """Fail before any training step if the saved data state cannot be continued."""
        if self.kind == "zephon":
            if doc.get("format") == HF_STATE_FORMAT:
                raise StateError(
                    "the checkpoint's data state was written by the hf loader; "
                    "resume it with --data.loader hf"
                )
            check_header(doc)
            check_fingerprint(doc["fingerprint"], self.loader.fingerprint)
        elif doc.get("format") != HF_STATE_FORMAT:
            raise StateError(
                "the checkpoint's data state was written by the zephon loader; "
                "resume it with --data.loader zephon"
            )

    def restore(self, doc: dict[str, Any]) -> None:
        self.check_resumable(doc)
        if self.kind == "zephon":
            self.loader.load_state_dict(doc)
        else:
            self.loader.load_state_dict(doc["ranks"], mode=self.resume_mode)

    def close(self) -> None:
        self.loader.close()


def _all_gather(t: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``[group size, *t.shape]``: every member's ``t``, in group-rank order."""
    size = dist.get_world_size(group)
    out = torch.empty((size * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    dist.all_gather_single(out, t, group=group)
    return out.view(size, *t.shape)


def check_validation_ends(cfg: JobConfig, recipe: Recipe) -> None:
    """`validation.steps = -1` reads until the data ends: refuse a recipe that never ends."""
    if cfg.validation.steps != -1:
        return
    endless = [s.name for s in recipe.sources if s.on_exhausted == "repeat"]
    if endless:
        raise ConfigError(
            f"validation.steps = -1 validates until the data ends, but validation recipe "
            f"{cfg.validation.recipe} repeats source(s) {', '.join(endless)} forever; set "
            'validation.steps to a number of batches, or on_exhausted = "stop" in the recipe'
        )


def check_startup(
    cfg: JobConfig, dp_size: int, lanes: int | None, max_seq_len: int
) -> Layout | None:
    """The startup validator: each failure is one message naming the numbers.
    Returns the Zephon layout (None for the hf loader)."""
    t = cfg.training
    if t.seq_len > max_seq_len:
        raise LayoutError(
            f"training.seq_len {t.seq_len} exceeds the model's limit of {max_seq_len} tokens "
            f"(model.flavor {cfg.model.flavor!r}); use seq_len <= {max_seq_len}"
        )
    if lanes is not None:
        try:
            return plan_layout(lanes, dp_size, t.global_batch_size, t.local_batch_size)
        except LayoutError as exc:
            raise LayoutError(
                f"{exc} [training.global_batch_size={t.global_batch_size}, "
                f"training.local_batch_size={t.local_batch_size}, data-parallel size={dp_size}, "
                f"lanes={lanes} from {cfg.data.recipe}]"
            ) from None
    local, rem = divmod(t.global_batch_size, dp_size)
    if rem or local % t.local_batch_size:
        raise LayoutError(
            f"training.global_batch_size {t.global_batch_size} must split into {dp_size} ranks "
            f"x whole micro-batches of training.local_batch_size {t.local_batch_size}"
        )
    return None
