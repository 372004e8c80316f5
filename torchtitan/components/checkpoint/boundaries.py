"""Phase boundary checkpoints: kept whatever `checkpoint.keep_latest_k` says.

The `step-b` checkpoint of a phase starting at step b is where branches of a
run (several anneal mixes, say) start from, so it is written at every boundary
and never pruned. Which folders are boundaries is read from the loader state
saved in them (`boundary_of`, zephon/state/checkpoint_state.py), not from this run's recipe: a
boundary of an earlier recipe version stays protected too.
"""

from __future__ import annotations

import json
import os

from torchtitan.components.checkpoint.manifest import LOADER_FILE
from zephon import boundary_of


def prunable_steps(folder: str, steps: list[int], known: dict[str, bool]) -> list[int]:
    """`steps` (complete step folders under `folder`, oldest first) without the
    phase boundary checkpoints: what `keep_latest_k` counts and prunes."""
    return [
        s for s in steps if not is_boundary_checkpoint(os.path.join(folder, f"step-{s}"), known)
    ]


def is_boundary_checkpoint(step_dir: str, known: dict[str, bool] | None = None) -> bool:
    """Whether the loader state in `step_dir` marks a phase boundary. `known` caches
    answers by folder (a complete folder's state never changes). An unreadable
    state is not a boundary: the manifest check reports it on resume."""
    if known is not None and step_dir in known:
        return known[step_dir]
    try:
        with open(os.path.join(step_dir, LOADER_FILE), encoding="utf-8") as f:
            doc = json.load(f)
        answer = isinstance(doc, dict) and boundary_of(doc) is not None
    except (OSError, ValueError):
        answer = False
    if known is not None:
        known[step_dir] = answer
    return answer
