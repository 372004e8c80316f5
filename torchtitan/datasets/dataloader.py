"""The trainer's data glue: build this rank's loader from `[data]` and run the
collectives around it: the global batch digest, the checkpoint state of all
ranks, the dropped-records count, and the merged state every rank needs before
the first step of a phase that changes the lane count. It speaks only the
loader contract (`contract.RankLoader`), so it never asks which loader kind
runs. The startup checks of `[data]` and `[validation]` live here too.

Collectives run over the data-parallel group (one per coordinate of the other
dimensions: tensor parallel, pipeline stage), never the world: the processes
of one data-parallel coordinate (its *coordinate group*: TP peers and pipeline
stages) hold the same batch and would otherwise be counted more than once. Only
one of them loads it: the others receive it by broadcast
(`coordinate_loader.py`), so the loading peers' data-parallel group holds every
loader state, and rank 0 is one of them."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from torchtitan.config.job_config import ConfigError, JobConfig
from torchtitan.datasets.contract import RankLoader, TrainBatch
from torchtitan.datasets.coordinate_loader import batch_digest, one_loader_per_coordinate
from torchtitan.datasets.hf_adapter import HFBaselineAdapter
from torchtitan.datasets.phase_timeline import DataTimeline, micro_rows
from torchtitan.datasets.zephon_adapter import ZephonAdapter
from torchtitan.distributed.replica_groups import OneGroup, ReplicaGroups
from torchtitan.torch_compat import all_gather_tensor
from zephon import Layout, LayoutError, Recipe, global_batch_digest, load_recipe, resolve_layout

logger = logging.getLogger("torchtitan")

DIGEST_BYTES = 32

# `data.loader` -> the adapter that implements the contract for it.
LOADERS: dict[str, Callable[[JobConfig, Recipe, int, int], RankLoader]] = {
    "zephon": ZephonAdapter,
    "hf": HFBaselineAdapter,
}


class TrainDataLoader:
    """One rank's loader plus the collective operations the trainer needs around it."""

    def __init__(
        self,
        loader: RankLoader,
        dp_size: int,
        dp_group: dist.ProcessGroup | None = None,
        coordinate_group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
        groups: ReplicaGroups | None = None,
    ):
        """`dp_group`: the data-parallel ranks (None = the world); `coordinate_group`: the
        processes of this data-parallel coordinate (TP peers, pipeline stages),
        whose batches must agree; `device`: where the
        collectives run (a CUDA device under NCCL); `groups`: the replica groups whose
        ranks, with this group's, make up `dp_size` (fault tolerance; else one group)."""
        self.loader = loader
        self.dp_size = dp_size
        self.groups: ReplicaGroups = groups or OneGroup()
        # The document gather_state made since the last batch (a checkpoint of this
        # step), reused when the next step changes the lane count.
        self._gathered: dict[str, Any] | None = None
        self.dp_group, self.coordinate_group = dp_group, coordinate_group
        self.device = device or torch.device("cpu")

    @classmethod
    def from_config(
        cls,
        cfg: JobConfig,
        dp_rank: int,
        dp_size: int,
        recipe_path: str | None = None,
        for_validation: bool = False,
        dp_group: dist.ProcessGroup | None = None,
        coordinate_group: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
        groups: ReplicaGroups | None = None,
    ) -> TrainDataLoader:
        """The `[data]` loader at data-parallel coordinate `dp_rank` of `dp_size`;
        validation always reads with Zephon (the same batches at any size).
        Collective over `coordinate_group`: its rank 0 builds the loader, the other peers
        receive its batches (one loader per data-parallel coordinate)."""
        kind = "zephon" if for_validation else cfg.data.loader
        recipe = load_recipe(recipe_path or cfg.data.recipe)
        device = device or torch.device("cpu")
        loader = one_loader_per_coordinate(
            lambda: LOADERS[kind](cfg, recipe, dp_rank, dp_size), coordinate_group, device
        )
        return cls(loader, dp_size, dp_group, coordinate_group, device, groups)

    @property
    def source_names(self) -> tuple[str, ...]:
        return self.loader.source_names

    def next_batch(self) -> TrainBatch | None:
        """This rank's batch, or None when the data ended on this rank.

        Collective before the first step of a phase that changes the lane count
        (every rank asks the same schedule, so all or none call it): the new lanes
        are dealt from every old lane's boundary point, so every rank first gets
        the merged state of all ranks: the one the boundary checkpoint just
        gathered, or one gather here."""
        if self.loader.needs_merged_state():
            how = "the boundary checkpoint's" if self._gathered is not None else "gathered now"
            doc = self._gathered if self._gathered is not None else self.gather_state()
            self.restore(doc)
            logger.info(f"lane-count change: every rank took the merged loader state of "
                        f"{self.dp_size} data-parallel ranks ({how})")  # fmt: skip
        self._gathered = None
        return self.loader.next_batch()

    def global_digest(self, batch: TrainBatch) -> str:
        """Collective: SHA-256 of the global batch in canonical order.

        Each rank contributes its own number of 32-byte unit digests (its lanes,
        or rows for the hf loader); gathered in rank order they are in canonical
        order. The processes of a coordinate group must hold byte-identical batches: each
        hashes the whole batch it holds (every field, images included: what a
        receiving peer got, what the loading peer loaded) and the hashes must agree."""
        if self.coordinate_group is not None:
            mine = batch_digest(batch)
            peers = gather_digests([mine], self.coordinate_group, self.device)
            if any(p != [mine] for p in peers):
                raise RuntimeError(
                    f"the processes of one data-parallel coordinate received different batches at step {batch.step}: "
                    "a peer holds other bytes than its loading peer (a broadcast lost or "
                    "changed a field) or their data-parallel coordinates disagree"
                )
        parts = gather_digests(batch.digests, self.dp_group, self.device)
        mine = b"".join(d for part in parts for d in part)
        groups = self.groups.gather_bytes(mine)
        if groups is None:  # a replica group failed inside the step: it is made again
            return ""
        every = b"".join(groups)
        return global_batch_digest(
            [every[i : i + DIGEST_BYTES] for i in range(0, len(every), DIGEST_BYTES)]
        )

    def bad_records_dropped(self) -> int | None:
        """Collective when the loader drops bad records: how many all ranks dropped
        so far; None (no collective) when it does not."""
        mine = self.loader.dropped_records()
        if mine is None:
            return None
        n = torch.tensor([mine], dtype=torch.int64, device=self.device)
        dist.all_reduce(n, group=self.dp_group)  # TP peers hold the same lanes: not counted
        self.groups.sum_(n)
        return int(n.item())

    def gather_state(self) -> dict[str, Any] | None:
        """Collective: the loader state of all data-parallel ranks as one document
        (on every rank); `dp_size` in it is the data-parallel size. With replica
        groups, every group's ranks (in membership order); None when one of them
        failed inside the step."""
        states: list[Any] = [None] * dist.get_world_size(self.dp_group)
        dist.all_gather_object(states, self.loader.state_dict(), group=self.dp_group)
        groups = self.groups.gather_bytes(pickle.dumps(states))
        if groups is None:
            return None
        every = [s for part in groups for s in pickle.loads(part)]
        self._gathered = self.loader.merge_states(every)
        return self._gathered

    def check_resumable(self, doc: dict[str, Any]) -> None:
        """Fail before any training step if the saved data state cannot be continued."""
        self.loader.check_resumable(doc)

    def restore(self, doc: dict[str, Any]) -> None:
        self.loader.check_resumable(doc)
        self.loader.load_state(doc)

    def work_summary(self) -> dict[str, int]:
        """Collective over the world: every process's `work_done` counts summed by
        name, with `processes` and `loaders` (processes that ran a loader; the
        others received their batches)."""
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, self.loader.work_done())
        total: dict[str, int] = {"processes": len(parts)}
        for part in parts:
            for name, n in part.items():
                total[name] = total.get(name, 0) + int(n)
        total["loaders"] = len(parts) - total.get("receivers", 0)
        return total

    def close(self) -> None:
        self.loader.close()


def describe_work(work: dict[str, int]) -> str:
    """One log line of `TrainDataLoader.work_summary`."""
    counts = ", ".join(
        f"{name} {work[name]:,}"
        for name in ("tokens_tokenized", "docs_tokenized", "images_decoded")
        if name in work
    )
    line = (
        f"data loading work: {work['loaders']} loader(s) on {work['processes']} process(es)"
        f"{': ' + counts if counts else ' (no counts kept by this loader kind)'}"
    )
    if work.get("receivers"):
        line += (
            f"; {work['broadcast_batches']:,} batches broadcast to {work['receivers']} "
            f"receiving peer(s): {work['broadcast_bytes'] / 2**20:.1f} MiB sent in "
            f"{work['broadcast_us'] / 1e6:.2f} s"
        )
    return line


def gather_digests(
    digests: list[bytes], group: dist.ProcessGroup | None, device: torch.device
) -> list[list[bytes]]:
    """Collective: every group member's 32-byte digests, in group-rank order.

    Members may send different numbers (uneven lanes), so the counts are gathered
    first; then one fixed-size uint8 all-gather, each member padded to the
    largest count, and the padding is cut off again."""
    if any(len(d) != DIGEST_BYTES for d in digests):
        raise ValueError(f"batch digests must be {DIGEST_BYTES} bytes each")
    count = torch.tensor([len(digests)], dtype=torch.int64, device=device)
    counts = _all_gather(count, group).view(-1).tolist()
    width = max(counts)
    if width == 0:
        return [[] for _ in counts]
    local = torch.zeros((width, DIGEST_BYTES), dtype=torch.uint8)
    if digests:
        raw = torch.frombuffer(bytearray(b"".join(digests)), dtype=torch.uint8)
        local[: len(digests)] = raw.view(-1, DIGEST_BYTES)
    parts = _all_gather(local.to(device), group).cpu().numpy()
    return [[parts[r, i].tobytes() for i in range(n)] for r, n in enumerate(counts)]


def _all_gather(t: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``[group size, *t.shape]``: every member's ``t``, in group-rank order."""
    size = dist.get_world_size(group)
    out = torch.empty((size * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    all_gather_tensor(out, t, group)
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


def _micro_setting(cfg: JobConfig) -> str:
    t = cfg.training
    if t.local_batch_tokens:
        return f"training.local_batch_tokens={t.local_batch_tokens}"
    return f"training.local_batch_size={t.local_batch_size}"


def _job_micro_rows(cfg: JobConfig, seq_len: int) -> int:
    """Micro-batch rows at the job's own seq_len (a recipe without phases, the
    validation recipe, the hf baseline)."""
    t = cfg.training
    if t.local_batch_tokens and (t.local_batch_tokens % seq_len or t.local_batch_tokens < seq_len):
        raise LayoutError(
            f"training.local_batch_tokens {t.local_batch_tokens} is not a whole number of rows "
            f"of training.seq_len {seq_len}; use a multiple of {seq_len}"
        )
    return micro_rows(t.local_batch_size, t.local_batch_tokens or None, seq_len)


def check_startup(
    cfg: JobConfig, dp_size: int, lanes: int | None, max_seq_len: int, recipe: str = ""
) -> Layout | None:
    """The startup validator for the job's own shape (training.seq_len and
    global_batch_size): each failure is one message naming the numbers.
    Returns the Zephon layout (None for the hf loader): any data-parallel size up
    to the lane count, its padding refused only above `parallelism.max_idle_share`.
    The hf baseline splits the global batch evenly and keeps requiring G % D.
    A training recipe with phases is checked phase by phase (`check_phases`)."""
    t = cfg.training
    if t.seq_len > max_seq_len:
        raise LayoutError(
            f"training.seq_len {t.seq_len} exceeds the model's limit of {max_seq_len} tokens "
            f"(model.flavor {cfg.model.flavor!r}); use seq_len <= {max_seq_len}"
        )
    micro = _job_micro_rows(cfg, t.seq_len)
    if lanes is not None:
        try:
            return resolve_layout(
                lanes, dp_size, t.global_batch_size, micro, cfg.parallelism.max_idle_share
            )
        except LayoutError as exc:
            raise LayoutError(
                f"{exc} [training.global_batch_size={t.global_batch_size}, "
                f"{_micro_setting(cfg)}, data-parallel size={dp_size}, "
                f"parallelism.max_idle_share={cfg.parallelism.max_idle_share}, "
                f"lanes={lanes} from {recipe or cfg.data.recipe}]"
            ) from None
    local, rem = divmod(t.global_batch_size, dp_size)
    if rem or local % micro:
        raise LayoutError(
            f"training.global_batch_size {t.global_batch_size} must split into {dp_size} ranks "
            f"x whole micro-batches of {micro} rows ({_micro_setting(cfg)}): the hf "
            "baseline splits the global batch evenly (uneven data-parallel sizes are the "
            "zephon loader's)"
        )
    return None


def check_phases(
    cfg: JobConfig, plan: DataTimeline, dp_size: int, from_step: int, max_seq_len: int
) -> dict[str | None, Layout]:
    """Every phase of the training recipe not finished after `from_step` steps (the
    start or resume step), checked now rather than when it is reached: its seq_len
    within the model's limit, its layout for `dp_size` ranks with the micro-batch
    rule and `parallelism.max_idle_share`. Returns each phase's layout by name."""
    for p in plan.unfinished(from_step):
        if p.seq_len > max_seq_len:
            what = (
                "training.seq_len"
                if p.name is None
                else f"{p.label} (from step {p.start_step}): seq_len"
            )
            raise LayoutError(
                f"{what} {p.seq_len} exceeds the model's limit of {max_seq_len} tokens "
                f"(model.flavor {cfg.model.flavor!r}); use seq_len <= {max_seq_len}"
            )
    t = cfg.training
    try:
        return plan.timeline.layouts(
            dp_size,
            None if t.local_batch_tokens else t.local_batch_size,
            from_step,
            t.local_batch_tokens or None,
            cfg.parallelism.max_idle_share,
        )
    except LayoutError as exc:
        first = plan.phases[0]
        raise LayoutError(
            f"{exc} [{_micro_setting(cfg)}, data-parallel size={dp_size}, "
            f"parallelism.max_idle_share={cfg.parallelism.max_idle_share}, "
            f"global batch size {first.global_batch_size} and lanes={first.lanes} at the start, "
            f"from {plan.recipe_path}; phases checked from step {from_step}]"
        ) from None


def check_data_startup(
    cfg: JobConfig, dp_size: int, max_seq_len: int, plan: DataTimeline, from_step: int = 0
) -> dict[str | None, Layout]:
    """Every start-up check of `[data]` and `[validation]`, before the mesh and the
    model are built: the training recipe's phases not finished after `from_step`
    steps, each with its layout (none for the hf loader), and the validation recipe."""
    if cfg.data.loader == "zephon":
        layouts = check_phases(cfg, plan, dp_size, from_step, max_seq_len)
    else:
        first, t = plan.phases[0], cfg.training
        if (first.seq_len, first.global_batch_size) != (t.seq_len, t.global_batch_size):
            raise LayoutError(
                f"{plan.recipe_path}: {first.label} sets seq_len {first.seq_len} and global batch "
                f"size {first.global_batch_size}, but the hf baseline loader reads the job's "
                f"training.seq_len {t.seq_len} and global_batch_size {t.global_batch_size}; "
                "set them to the phase's, or use --data.loader zephon"
            )
        check_startup(cfg, dp_size, None, max_seq_len)
        layouts = {}
    if cfg.validation.enable:
        if not cfg.validation.recipe:
            raise ConfigError("validation.enable = true needs validation.recipe")
        val_recipe = load_recipe(cfg.validation.recipe)
        check_startup(cfg, dp_size, val_recipe.lanes, 1 << 30, cfg.validation.recipe)
        check_validation_ends(cfg, val_recipe)
    return layouts
