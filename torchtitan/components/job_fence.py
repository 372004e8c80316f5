"""One writer per generation: what keeps a stale replica group from writing the job's
history (docs/fault_tolerance.md "Groups that come back late", design §16).

A replica group paused longer than the timeouts (a slow node, a long pause, a
network partition) is dropped by the others; when it wakes up it still holds the
step it had, and with nobody left to heal from it would train those steps again
alone and write them: checkpoints replaced, records trimmed and written twice.
The dump folder therefore holds the job's fence (`job/`), written only by the
process that writes the job's records (the first group's rank 0):

- `generation.json`: the job's **generation** and the last step it committed. A
  generation begins when the job starts without a live peer to copy from (its
  first launch, or every group relaunched from a checkpoint); a group that joins
  by copying from a peer takes the peer's generation. The writer moves the step
  after every committed step.
- `finished.json`: the job reached its last step (written after its final
  checkpoint).

At every step start a group asks `JobFence.verdict`: a group whose generation is
not the job's, or whose next step the job has committed already, is stale; a
group whose job finished at or past its own last step has nothing to do. Either
way it writes nothing more and leaves (train.py says how). Pure file logic: the
caller decides who reads and writes, and shares the verdict with its ranks.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from torchtitan.components.checkpoint import CheckpointError
from zephon import atomic_write

FENCE_FOLDER = "job"
GENERATION_FILE = "generation.json"
FINISHED_FILE = "finished.json"
_FIX = "; with no replica group of this job running, remove it and start them again"


@dataclass(frozen=True)
class Leave:
    """Why a group stops writing and leaves: its job `finished` (exit 0), or it is
    `stale`, or it lost the lighthouse (the preemption status: run it again to
    rejoin)."""

    reason: str  # "finished", "stale" or "lighthouse lost"
    line: str

    @property
    def finished(self) -> bool:
        return self.reason == "finished"


@dataclass(frozen=True)
class FenceState:
    generation: int
    step: int


class JobFence:
    def __init__(self, dump_folder: str, who: str):
        """`who` names this process's group in messages ("replica group 1")."""
        self.folder = os.path.join(dump_folder, FENCE_FOLDER)
        self.who = who
        self.generation: int | None = None
        """This group's generation: None until it started one or copied one."""

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            with open(self._path(name), encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{self._path(name)}: unreadable ({exc}){_FIX}") from None
        if not isinstance(doc, dict):
            raise CheckpointError(f"{self._path(name)}: expected a JSON object{_FIX}")
        return doc

    def state(self) -> FenceState | None:
        """The job's generation and last committed step, or None before any."""
        doc = self._read(GENERATION_FILE)
        if doc is None:
            return None
        try:
            return FenceState(int(doc["generation"]), int(doc["step"]))
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(
                f"{self._path(GENERATION_FILE)}: expected integer 'generation' and 'step'{_FIX}"
            ) from None

    def finished_at(self) -> int | None:
        """The step the job finished at, or None while it has not."""
        doc = self._read(FINISHED_FILE)
        if doc is None:
            return None
        try:
            return int(doc["step"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(
                f"{self._path(FINISHED_FILE)}: expected an integer 'step'{_FIX}"
            ) from None

    def _write(self, step: int) -> None:
        assert self.generation is not None
        os.makedirs(self.folder, exist_ok=True)
        doc = {"generation": self.generation, "step": step, "by": self.who, "time": time.time()}
        atomic_write(self._path(GENERATION_FILE), json.dumps(doc))

    def begin_generation(self, step: int) -> int:
        """The job starts at `step` with no peer to copy from: a new generation (any
        group still running an older one is stale from now on)."""
        old = self.state()
        self.generation = (old.generation if old is not None else 0) + 1
        try:
            os.remove(self._path(FINISHED_FILE))  # trained on past its end: not finished
        except FileNotFoundError:
            pass
        self._write(step)
        return self.generation

    def adopt(self, generation: int) -> None:
        """This group copied its state from a peer of `generation`."""
        self.generation = generation

    def committed(self, step: int) -> None:
        """The writer: the job committed `step`."""
        self._write(step)

    def finish(self, step: int) -> None:
        """The writer: the job reached its last step, `step`."""
        os.makedirs(self.folder, exist_ok=True)
        doc = {"step": step, "generation": self.generation, "by": self.who, "time": time.time()}
        atomic_write(self._path(FINISHED_FILE), json.dumps(doc))

    def verdict(self, next_step: int, last_step: int) -> Leave | None:
        """Whether this group, about to train `next_step` of a job ending at
        `last_step`, must leave instead (None: go on)."""
        # The generation first, the marker second: a group paused between the two
        # reads (SIGSTOP, a long pause) while the job went on to its end then sees the
        # marker, not a last commit without it (which would call it stale).
        state = self.state()
        done = self.finished_at()
        if done is not None and done >= last_step:
            return Leave(
                "finished",
                f"{self.who}: the job finished at step {done} while this group was away "
                f"(it was at step {next_step - 1}); it wrote nothing and leaves",
            )
        if state is None or self.generation is None:
            return None
        if state.generation != self.generation:
            return Leave(
                "stale",
                f"{self.who}: stale, its generation {self.generation} is not the job's "
                f"({state.generation}, {self._path(GENERATION_FILE)}): the job was started "
                "again without it; it wrote nothing more and leaves (run it again to join)",
            )
        if state.step >= next_step:
            return Leave(
                "stale",
                f"{self.who}: stale, the job committed step {state.step} while this group was "
                f"at step {next_step - 1} with no live peer to copy from; it wrote nothing "
                "more and leaves (run it again to join or resume)",
            )
        return None
