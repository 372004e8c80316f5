"""The manifest of a checkpoint step (`COMPLETE.json`) and its verification.

A step folder is a resume point only if its manifest, written last, lists
every file of the step with its size and checksum, and the step in the folder
name, the manifest and the loader state agree (the DCP train-state step is
compared after the model load, see `check_loaded_step`). Each rank checksums
the files it wrote right after writing them; rank 0 gathers the entries and
writes the manifest.

Verification modes: "full" re-reads and checksums every file (xxh3-64, about
as fast as the disk delivers the bytes), "size" only compares sizes and the
steps (cheap whatever the model size). Folders written before manifests
existed (`COMPLETE.json` without a file list) are accepted with a warning.

`python -m torchtitan.components.checkpoint verify DIR` checks one step folder, or every
step of a checkpoint folder, on its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import xxhash

logger = logging.getLogger("torchtitan")

COMPLETE_FILE = "COMPLETE.json"
LOADER_FILE = "dataloader.json"
MANIFEST_FORMAT = "torchtitan.checkpoint_manifest"
MANIFEST_VERSION = 1
CHECKSUM = "xxh3_64"
VERIFY_MODES = ("full", "size")
STEP_DIR = re.compile(r"^step-(\d+)$")
_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that was asked for cannot be used."""


def file_checksum(path: str) -> str:
    """xxh3-64 of a file's bytes, hex, streamed in 8 MiB chunks."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_entries(step_dir: str, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{name: {"size", "xxh3_64"}} of the named files of a step folder."""
    out = {}
    for name in sorted(names):
        path = os.path.join(step_dir, name)
        out[name] = {"size": os.path.getsize(path), CHECKSUM: file_checksum(path)}
    return out


def files_of_rank(step_dir: str, rank: int) -> list[str]:
    """The files a rank writes itself: its DCP shards `__<rank>_<n>.distcp`;
    rank 0 also owns every other file (`.metadata`, the loader state...)."""
    out = []
    for name in os.listdir(step_dir):
        if name == COMPLETE_FILE or name.startswith(".tmp-"):
            continue
        m = _RANK_FILE.match(name)
        owner = int(m.group(1)) if m else 0
        if owner == rank:
            out.append(name)
    return out


def manifest_document(
    step: int,
    world_size: int,
    files: dict[str, Any],
    finite: bool = True,
    loss: float | None = None,
) -> dict[str, Any]:
    """`finite`: the step's update was applied (its loss and gradient norm were
    finite, and no spike); pruning keeps the two newest finite steps (see
    `steps_to_prune`). `loss`: the step's global loss, when the trainer computed it."""
    doc = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "step": step,
        "world_size": world_size,
        "time": time.time(),
        "checksum": CHECKSUM,
        "finite": finite,
        "files": dict(sorted(files.items())),
    }
    if loss is not None:
        doc["loss"] = loss
    return doc


@dataclass
class Verified:
    step: int
    legacy: bool  # written before manifests existed: nothing but the marker to check


def folder_step(step_dir: str) -> int:
    m = STEP_DIR.match(os.path.basename(os.path.normpath(step_dir)))
    if not m:
        raise CheckpointError(f"{step_dir}: not a step folder (expected a name step-N)")
    return int(m.group(1))


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from None


def loader_state_step(doc: Any, path: str) -> int:
    """The step a loader-state document (Zephon or hf baseline) was written at."""
    if isinstance(doc, dict) and isinstance(doc.get("step"), int):
        return int(doc["step"])
    ranks = doc.get("ranks") if isinstance(doc, dict) else None
    if isinstance(ranks, list) and ranks:
        steps = {r.get("steps") for r in ranks if isinstance(r, dict)}
        if len(steps) == 1 and isinstance(next(iter(steps)), int):
            return int(next(iter(steps)))
    raise CheckpointError(f"{path}: no step recorded in the loader state")


def verify_step_dir(step_dir: str, mode: str = "full", share: tuple[int, int] = (0, 1)) -> Verified:
    """Check one step folder; raises CheckpointError naming the first bad file.

    `share` = (k, n): checksum only every n-th listed file from the k-th (the
    other ranks check the rest with `verify_share`); sizes and steps always
    cover every file."""
    if mode not in VERIFY_MODES:
        raise CheckpointError(f"checkpoint.verify = {mode!r}: expected one of {VERIFY_MODES}")
    step = folder_step(step_dir)
    marker = os.path.join(step_dir, COMPLETE_FILE)
    doc = _read_json(marker)
    if not isinstance(doc, dict) or "step" not in doc:
        raise CheckpointError(f"{marker}: not a checkpoint manifest")
    if doc["step"] != step:
        raise CheckpointError(
            f"{marker}: records step {doc['step']}, but the folder is step {step}"
        )
    files = doc.get("files")
    if files is None:
        legacy = True
    else:
        legacy = False
        for name, want in files.items():
            path = os.path.join(step_dir, name)
            if not os.path.isfile(path):
                raise CheckpointError(f"{path}: missing (listed in {COMPLETE_FILE})")
            size = os.path.getsize(path)
            if size != want["size"]:
                raise CheckpointError(
                    f"{path}: {size} bytes, the manifest says {want['size']} (truncated or "
                    "overwritten)"
                )
    # The loader state's step before any checksum: cheap, and the clearest message.
    loader_path = os.path.join(step_dir, LOADER_FILE)
    if os.path.isfile(loader_path) or not legacy:
        saved = loader_state_step(_read_json(loader_path), loader_path)
        if saved != step:
            raise CheckpointError(
                f"{loader_path}: loader state of step {saved} in the folder of step {step}"
            )
    if mode == "full" and files is not None:
        _check_checksums(step_dir, doc, share)
    return Verified(step, legacy)


def _check_checksums(step_dir: str, doc: dict[str, Any], share: tuple[int, int]) -> None:
    k, n = share
    algo = doc.get("checksum", CHECKSUM)
    for i, (name, want) in enumerate(sorted(doc["files"].items())):
        if i % n != k:
            continue
        path = os.path.join(step_dir, name)
        got = file_checksum(path)
        if got != want[algo]:
            raise CheckpointError(
                f"{path}: checksum {got} differs from the manifest's {want[algo]} "
                "(the file's content changed after the save)"
            )


def verify_share(step_dir: str, rank: int, world: int) -> str | None:
    """Rank `rank`'s share of the checksums of a step that rank 0 has checked
    otherwise; the error message, or None."""
    try:
        doc = _read_json(os.path.join(step_dir, COMPLETE_FILE))
        if isinstance(doc, dict) and doc.get("files") is not None:
            _check_checksums(step_dir, doc, (rank, world))
    except (CheckpointError, OSError) as exc:
        return str(exc)
    return None


def step_dirs(folder: str) -> list[int]:
    """Steps that have a folder (complete or not), oldest first."""
    if not os.path.isdir(folder):
        return []
    steps = [int(m.group(1)) for n in os.listdir(folder) if (m := STEP_DIR.match(n))]
    return sorted(steps)


def marked_steps(folder: str) -> list[int]:
    """Steps whose folder has a `COMPLETE.json`, oldest first."""
    return [
        s
        for s in step_dirs(folder)
        if os.path.isfile(os.path.join(folder, f"step-{s}", COMPLETE_FILE))
    ]


def step_finite(folder: str, step: int) -> bool:
    """Whether a marked step was recorded finite; manifests written before the field
    existed (or unreadable ones, which verification reports) count as finite."""
    try:
        with open(os.path.join(folder, f"step-{step}", COMPLETE_FILE), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return True
    return not (isinstance(doc, dict) and doc.get("finite") is False)


def finite_steps(folder: str, below: int | None = None) -> list[int]:
    """The marked steps recorded finite (below `below`, if given), oldest first."""
    steps = [s for s in marked_steps(folder) if step_finite(folder, s)]
    return [s for s in steps if below is None or s < below]


def newest_finite(folder: str, below: int | None = None) -> int | None:
    """The newest marked step recorded finite (below `below`, if given), or None."""
    steps = finite_steps(folder, below)
    return steps[-1] if steps else None


def step_loss(folder: str, step: int) -> float | None:
    """The loss a step's manifest recorded, if any."""
    try:
        doc = _read_json(os.path.join(folder, f"step-{step}", COMPLETE_FILE))
    except CheckpointError:
        return None
    loss = doc.get("loss") if isinstance(doc, dict) else None
    return float(loss) if isinstance(loss, int | float) else None


def steps_to_prune(
    folder: str, keep_latest_k: int, candidates: list[int] | None = None
) -> list[int]:
    """Complete steps that `keep_latest_k` removes: all but the newest k of
    `candidates` (default: every complete step; the caller leaves out what is never
    pruned, e.g. phase boundaries), except the two newest finite steps, whatever
    their age: a run that diverged keeps its last good state, and the newest finite
    step may hold the very update that began the trouble (divergence.py). 0 keeps
    everything."""
    if keep_latest_k <= 0:
        return []
    keep = set(finite_steps(folder)[-2:])
    steps = marked_steps(folder) if candidates is None else candidates
    return [s for s in steps[:-keep_latest_k] if s not in keep]


def newest_verified(folder: str, mode: str, below: int | None = None) -> int | None:
    """The newest marked step (below `below`, if given) that passes verification."""
    for s in reversed(marked_steps(folder)):
        if below is not None and s >= below:
            continue
        try:
            verify_step_dir(os.path.join(folder, f"step-{s}"), mode)
        except CheckpointError:
            continue
        return s
    return None


def refusal(folder: str, step: int, mode: str, error: str, chosen: bool) -> str:
    """The message for a step that failed verification, pointing at the newest
    older step that verifies."""
    good = newest_verified(folder, mode, below=step)
    hint = (
        f"the newest step that verifies is {good}: resume from it explicitly with "
        f"--checkpoint.load_step {good}"
        if good is not None
        else "no older step verifies either"
    )
    what = (
        f"checkpoint.load_step = {step} fails verification"
        if chosen
        else (f"the latest checkpoint, step {step}, fails verification")
    )
    return f"{what}: {error}\n{hint}"


def select_resume_step(
    folder: str, load_step: int, mode: str, share: tuple[int, int] = (0, 1)
) -> int | None:
    """The step to resume from after verifying it: `load_step` (>= 0) or the
    newest marked step. Never falls back silently to an older step."""
    steps = marked_steps(folder)
    if load_step >= 0:
        if load_step not in steps:
            raise CheckpointError(
                f"checkpoint.load_step = {load_step}, but {folder} has no complete "
                f"checkpoint for that step (complete: {steps or 'none'})"
            )
        step = load_step
    elif not steps:
        return None
    else:
        step = steps[-1]
        if not step_finite(folder, step):
            good = newest_finite(folder)
            hint = (
                f"the newest finite one is step {good}: resume from it with "
                f"--checkpoint.load_step {good} (after changing what made the run diverge)"
                if good is not None
                else "no checkpoint is finite"
            )
            raise CheckpointError(
                f"the latest checkpoint, step {step}, is marked not finite (its update was "
                f"skipped as the run diverged: {folder}/step-{step}/{COMPLETE_FILE}); "
                f"{hint}, or pass --checkpoint.load_step {step} to resume from it anyway"
            )
    t0 = time.perf_counter()
    try:
        v = verify_step_dir(os.path.join(folder, f"step-{step}"), mode, share)
    except CheckpointError as exc:
        raise CheckpointError(refusal(folder, step, mode, str(exc), load_step >= 0)) from None
    if v.legacy:
        logger.warning(
            f"{folder}/step-{step} was written before checkpoint manifests: its files "
            "cannot be verified (resuming anyway)"
        )
    elif share == (0, 1):  # otherwise the caller reports once every share is checked
        logger.info(f"verified {folder}/step-{step} ({mode}) in {time.perf_counter() - t0:.2f}s")
    return step


def check_loaded_step(step_dir: str, loaded: int) -> None:
    """After the DCP load: the model's train-state step must be the folder's."""
    expected = folder_step(step_dir)
    if loaded != expected:
        raise CheckpointError(
            f"{step_dir}: the model checkpoint holds train step {loaded}, but the folder, "
            f"manifest and loader state are step {expected}"
        )
