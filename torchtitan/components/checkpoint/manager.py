"""DCP checkpoints in `<dump>/<folder>/step-N/`, with the loader state beside them.

A step folder holds the DCP files (model, optimizer, LR scheduler, train
state), `dataloader.json` (the loader state of all ranks as one document) and,
written last, `COMPLETE.json`. Only folders with that marker are resume
points, so a save interrupted at any moment is never resumed from. DCP
reshards model and optimizer when the number of processes or the mesh changes.
The step after which a data phase starts is saved whatever the interval, and
`keep_latest_k` neither prunes nor counts it (boundaries.py).

Parameters that are not all finite are never saved; the manifest records
whether the step's update was applied (finite), and `keep_latest_k` pruning
keeps the newest finite step whatever its age (divergence.py).

With `checkpoint.async_mode = "async"` the DCP files are written in the
background: the loader state is captured at the saved step (synchronously),
and the folder is finalised (loader state, then marker) only once the DCP
files are durable, at the next save or at the end of training.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from torchtitan.components.checkpoint import manifest
from torchtitan.components.checkpoint.boundaries import prunable_steps
from torchtitan.components.checkpoint.manifest import COMPLETE_FILE, LOADER_FILE, CheckpointError
from torchtitan.components.divergence import params_finite
from torchtitan.config.job_config import Checkpoint as CheckpointConfig
from torchtitan.distributed.utils import all_gather_objects
from zephon import atomic_write

logger = logging.getLogger("torchtitan")

__all__ = ["COMPLETE_FILE", "LOADER_FILE", "CheckpointError", "CheckpointManager"]
# Test hook: simulate a crash after the DCP files of step N and before the loader state.
FAULT_ENV = "TORCHTITAN_FAULT_CRASH_BEFORE_LOADER_STATE"


def complete_steps(folder: str) -> list[int]:
    """Steps whose save finished (marker present), oldest first."""
    return manifest.marked_steps(folder)


def checkpoint_folder(cfg: CheckpointConfig, dump_folder: str) -> str:
    return os.path.join(dump_folder, cfg.folder)


def resume_step(cfg: CheckpointConfig, dump_folder: str) -> int | None:
    """The step to resume from: `load_step`, or the latest complete one, verified
    against its manifest (see manifest.py). Collective when a group is up: rank 0
    checks sizes and steps, every rank checksums its share of the files, and all
    ranks get the same verdict, so all raise the same error."""
    if not cfg.enable:
        return None
    folder = checkpoint_folder(cfg, dump_folder)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return manifest.select_resume_step(folder, cfg.load_step, cfg.verify)
    rank, world = dist.get_rank(), dist.get_world_size()
    verdict: list[Any] = [None]
    if rank == 0:
        try:
            step = manifest.select_resume_step(folder, cfg.load_step, cfg.verify, (0, world))
            verdict[0] = ("ok", step)
        except CheckpointError as exc:
            verdict[0] = ("error", str(exc))
    dist.broadcast_object_list(verdict, src=0)
    kind, step = verdict[0]
    if kind == "error":
        raise CheckpointError(step)
    if step is None or cfg.verify != "full":
        return step
    t0 = time.perf_counter()
    step_dir = os.path.join(folder, f"step-{step}")
    mine = manifest.verify_share(step_dir, rank, world) if rank else None
    errors = [e for e in all_gather_objects(mine) if e]
    if errors:
        message: list[Any] = [None]
        if rank == 0:
            message[0] = manifest.refusal(folder, step, cfg.verify, errors[0], cfg.load_step >= 0)
        dist.broadcast_object_list(message, src=0)
        raise CheckpointError(message[0])
    logger.info(
        f"verified {step_dir} (full, checksums on {world} ranks) in {time.perf_counter() - t0:.2f}s"
    )
    return step


def read_loader_state(cfg: CheckpointConfig, dump_folder: str, step: int) -> dict[str, Any]:
    path = os.path.join(checkpoint_folder(cfg, dump_folder), f"step-{step}", LOADER_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read the loader state: {exc}") from None


class _TrainState(Stateful):
    """Model, optimizer, LR scheduler and step as one DCP-stateful object."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, lr_scheduler: Any):
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_sd,
            "optimizer": optim_sd,
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "train_state": {"step": self.step},
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        # A parameter group's list of names is saved once (DCP keeps one copy of a
        # value every rank writes), so it holds the saving rank's parameters only;
        # under pipeline parallelism other ranks hold others. The groups' settings
        # are the same on every rank: keep them, with this rank's own names.
        own = get_state_dict(self.model, self.optimizer)[1]["param_groups"]
        saved = sd["optimizer"]["param_groups"]
        if len(own) != len(saved):
            raise CheckpointError(
                f"the checkpoint's optimizer has {len(saved)} parameter group(s), this "
                f"model's {len(own)}: it was written by another optimizer setup"
            )
        for group, mine in zip(saved, own, strict=True):
            group["params"] = mine["params"]
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=sd["model"],
            optim_state_dict=sd["optimizer"],
        )
        self.lr_scheduler.load_state_dict(sd["lr_scheduler"])
        self.step = int(sd["train_state"]["step"])


class CheckpointManager:
    def __init__(
        self,
        cfg: CheckpointConfig,
        dump_folder: str,
        model: torch.nn.Module,
        optimizer: Any,
        lr_scheduler: Any,
        boundaries: Collection[int] = (),
        shared: bool = False,
    ):
        """`boundaries`: steps after which a data phase starts; each is saved
        whatever the interval, and never pruned. `shared`: other jobs write into
        this folder too (replica groups), so an unfinished save may be one in flight:
        it is left alone (a resume never picks it)."""
        self.cfg = cfg
        self.boundaries = frozenset(boundaries)
        self._boundary_dirs: dict[str, bool] = {}
        self.folder = checkpoint_folder(cfg, dump_folder)
        self.shared = shared
        self.state = _TrainState(model, optimizer, lr_scheduler)
        self.rank = dist.get_rank()
        self._device = next(model.parameters()).device
        # (step, loader document, DCP future, finite) of an asynchronous save in flight.
        self._pending: tuple[int, dict[str, Any] | None, Future, bool, float | None] | None = None
        self._async_pg: dist.ProcessGroup | None = None
        if cfg.async_mode == "async":
            # The background writer runs its collectives on a (CPU) group of its
            # own, so they never interleave with the training's collectives.
            self._async_pg = dist.new_group(backend="gloo")
        if self.rank == 0 and cfg.enable and not shared:
            self._prune_incomplete()

    def _prune_incomplete(self) -> None:
        """Remove step folders of saves that never finished (no COMPLETE.json).
        Only the lock holder (rank 0) runs this, so no live save is touched."""
        complete = set(manifest.marked_steps(self.folder))
        for step in manifest.step_dirs(self.folder):
            if step not in complete:
                logger.warning(f"removing {self.step_dir(step)}: a save that never finished")
                shutil.rmtree(self.step_dir(step), ignore_errors=True)

    def step_dir(self, step: int) -> str:
        return os.path.join(self.folder, f"step-{step}")

    def complete_steps(self) -> list[int]:
        return complete_steps(self.folder)

    def load(self, step: int) -> int:
        """Load model, optimizer and scheduler of `step` (resharding as needed)."""
        t0 = time.perf_counter()
        try:
            dcp.load({"train": self.state}, checkpoint_id=self.step_dir(step))
        except Exception as exc:  # DCP's errors are long and name no file
            good = manifest.newest_verified(self.folder, self.cfg.verify, below=step)
            raise CheckpointError(
                f"{self.step_dir(step)}: cannot load the model checkpoint "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                f"the newest older step that verifies is {good}"
            ) from None
        manifest.check_loaded_step(self.step_dir(step), self.state.step)
        logger.info(f"loaded checkpoint {self.step_dir(step)} in {time.perf_counter() - t0:.2f}s")
        return self.state.step

    def should_save(self, step: int, last_step: int) -> bool:
        return self.cfg.enable and (
            step % self.cfg.interval == 0 or step == last_step or step in self.boundaries
        )

    def newest_finite(self, below: int | None = None) -> tuple[int, str, float | None] | None:
        """(step, folder, loss) of the newest complete checkpoint recorded finite
        (of a step below `below`, if given)."""
        step = manifest.newest_finite(self.folder, below)
        if step is None:
            return None
        return step, self.step_dir(step), manifest.step_loss(self.folder, step)

    def save(
        self,
        step: int,
        loader_state: Callable[[], dict[str, Any] | None],
        finite: bool = True,
        wait: bool = False,
        loss: float | None = None,
    ) -> bool:
        """Save `step` (collective); `finite`: its update was applied; `loss`: its global
        loss, for the manifest (the divergence advice names it). `loader_state` is
        collective; it returns the document on rank 0. Parameters that are not all
        finite are never written: returns False and logs why. `wait`: finish an
        asynchronous save before returning."""
        self.wait()  # one save in flight at a time
        if not params_finite(self.state.model.parameters(), self._device):
            logger.warning(f"step {step}: parameters are not finite: checkpoint NOT written")
            return False
        t0 = time.perf_counter()
        path = self.step_dir(step)
        if self.shared and os.path.exists(os.path.join(path, COMPLETE_FILE)):
            # Replica groups: a complete checkpoint is the job's history; whoever
            # writes this step again is not its writer (job_fence.py).
            logger.warning(f"checkpoint {path} is complete already: NOT written again")
            return False
        if self.rank == 0:
            if os.path.isdir(path):
                # Leftovers of an earlier save of this step: marker first, so a
                # half-deleted folder never looks complete.
                marker = os.path.join(path, COMPLETE_FILE)
                if os.path.exists(marker):
                    os.remove(marker)
                shutil.rmtree(path)
            os.makedirs(path)
        dist.barrier()
        self.state.step = step
        if self.cfg.async_mode == "async":
            # The loader state of this step, taken now: training goes on meanwhile.
            doc = loader_state()
            result = dcp.async_save(
                {"train": self.state}, checkpoint_id=path, process_group=self._async_pg
            )
            future = getattr(result, "upload_completion", result)
            self._pending = (step, doc, future, finite, loss)
            logger.info(f"checkpoint {path}: staged in {time.perf_counter() - t0:.2f}s, writing")
            if wait:
                self.wait()
            return True
        dcp.save({"train": self.state}, checkpoint_id=path)
        self.finalize_step_folder(step, loader_state(), finite, loss)
        logger.info(f"saved checkpoint {path} in {time.perf_counter() - t0:.2f}s")
        return True

    def save_and_verify(
        self,
        step: int,
        loader_state: Callable[[], dict[str, Any] | None],
        finite: bool,
        loss: float | None,
    ) -> tuple[str, float] | None:
        """Collective: save `step`, wait for it and verify it (a stop's checkpoint);
        (folder, seconds), or None when checkpoints are off or nothing was written."""
        t0 = time.perf_counter()
        if not self.cfg.enable or not self.save(step, loader_state, finite, wait=True, loss=loss):
            return None
        self.verify(step)
        return self.step_dir(step), time.perf_counter() - t0

    def verify(self, step: int) -> None:
        """Collective: check the files of a step just written against its manifest
        (checksums split across the ranks); raises CheckpointError naming the file."""
        path, rank, world = self.step_dir(step), self.rank, dist.get_world_size()
        error: str | None = None
        if rank == 0:
            try:
                manifest.verify_step_dir(path, self.cfg.verify, (0, world))
            except CheckpointError as exc:
                error = str(exc)
        elif self.cfg.verify == "full":
            error = manifest.verify_share(path, rank, world)
        errors = [e for e in all_gather_objects(error) if e]
        if errors:
            raise CheckpointError(
                f"{path}: the checkpoint just written does not verify: {errors[0]}"
            )

    def wait(self) -> None:
        """Collective: finish an asynchronous save in flight, if any."""
        if self._pending is None:
            return
        step, doc, future, finite, loss = self._pending
        self._pending = None
        t0 = time.perf_counter()
        future.result()  # raises if writing the DCP files failed
        self.finalize_step_folder(step, doc, finite, loss)
        logger.info(
            f"saved checkpoint {self.step_dir(step)} (waited {time.perf_counter() - t0:.2f}s)"
        )

    def finalize_step_folder(
        self, step: int, doc: dict[str, Any] | None, finite: bool = True, loss: float | None = None
    ) -> None:
        """Collective, once the DCP files of `step` are durable on every rank: write
        the loader state, then the completion marker that makes it a resume point."""
        path = self.step_dir(step)
        dist.barrier()  # every shard and .metadata written before anyone lists files
        # Each rank checksums the files it wrote (rank 0: after the loader state).
        mine = {}
        if self.rank != 0:
            mine = manifest.file_entries(path, manifest.files_of_rank(path, self.rank))
        if os.environ.get(FAULT_ENV) == str(step):
            logger.error(f"{FAULT_ENV}={step}: crashing after the model files, as asked")
            os._exit(17)
        if self.rank == 0:
            atomic_write(os.path.join(path, LOADER_FILE), json.dumps(doc, indent=1, sort_keys=True))
        if self.rank == 0:
            mine = manifest.file_entries(path, manifest.files_of_rank(path, 0))
        entries: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(entries, mine)
        if self.rank == 0:
            files = {k: v for part in entries for k, v in part.items()}
            marker = manifest.manifest_document(step, dist.get_world_size(), files, finite, loss)
            atomic_write(os.path.join(path, COMPLETE_FILE), json.dumps(marker, indent=1))
            self._purge()
        dist.barrier()

    def _purge(self) -> None:
        candidates = prunable_steps(self.folder, self.complete_steps(), self._boundary_dirs)
        for old in manifest.steps_to_prune(self.folder, self.cfg.keep_latest_k, candidates):
            # Marker first: a half-deleted folder must not look complete.
            os.remove(os.path.join(self.step_dir(old), COMPLETE_FILE))
            shutil.rmtree(self.step_dir(old), ignore_errors=True)
