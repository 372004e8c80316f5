"""What a fault-tolerant run says about its replica groups (docs/fault_tolerance.md):
which groups trained each step, and one line per recovery: which group left or
joined, at which step, how many steps were made again and the seconds lost. Pure
bookkeeping, fed by the training loop; no collectives, no clocks of its own."""

from __future__ import annotations

import time


class RecoveryLog:
    def __init__(self, replica_id: int):
        self.replica_id = replica_id
        self.quorum: int | None = None
        """The quorum id of the latest committed step (None before the first)."""
        self.ids: list[int] = []
        """Replica ids of the groups of the latest committed step, in their order."""
        self.started_the_job = False
        """Whether this group's first committed step came without a copy from a peer."""
        self._before: list[int] | None = None  # the groups before a membership change
        self._redone = 0
        self._failed_at: float | None = None  # the first failed step's start (perf_counter)
        self._commits = 0

    def joined_quorum(self, quorum: int, ids: list[int]) -> None:
        """A new quorum (taken by a committed step) with these groups."""
        if self._before is None:
            self._before = self.ids
        self.quorum, self.ids = quorum, ids

    def failed(self, step: int, t0: float) -> None:
        """Step `step`, started at `t0`, did not commit: it is made again."""
        self._redone += 1
        if self._failed_at is None:
            self._failed_at = t0

    def committed(self, step: int, t0: float, healed: bool, now: float | None = None) -> str | None:
        """Step `step` committed; returns the recovery line when it ends one."""
        now = time.perf_counter() if now is None else now
        first = self._commits == 0
        self._commits += 1
        if first:
            self.started_the_job = not healed
        before, self._before = self._before, None
        changed = before is not None and before != self.ids and (before or healed)
        if not changed and not self._redone:
            return None
        parts = []
        if healed:
            parts.append(f"group {self.replica_id} joined at step {step}, copied from a live peer")
        elif changed and before is not None:
            left = sorted(set(before) - set(self.ids))
            joined = sorted(set(self.ids) - set(before))
            for word, which in (("left", left), ("joined", joined)):
                if which:
                    parts.append(
                        f"group{'s' * (len(which) > 1)} {_ids(which)} {word} at step {step}"
                    )
        since = self._failed_at if self._failed_at is not None else t0
        redone = self._redone
        self._redone, self._failed_at = 0, None
        return (
            f"recovery: {'; '.join(parts) or f'step {step} made again'}; groups now "
            f"{_ids(self.ids)}; {redone} step{'s' * (redone != 1)} redone; "
            f"{now - since:.1f} s from the failed step's start to this commit"
            if redone
            else f"recovery: {'; '.join(parts)}; groups now {_ids(self.ids)}; no step redone"
        )


def _ids(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids) or "-"
