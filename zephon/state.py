"""The loader's checkpoint document: versioned JSON of cursors, never buffers.

Per lane it holds the lane's latest flush point consumed by the trainer and
the rows consumed since then; its size is O(lanes x sources). A fingerprint of
everything that must not change across a resume is checked field by field.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from zephon.errors import StateError

STATE_FORMAT = "zephon.loader_state"
STATE_VERSION = 1

# Checked in this order so the error names the most specific change first.
FINGERPRINT_FIELDS = (
    "seq_len",
    "global_batch_size",
    "lanes",
    "seed",
    "tokenizer",
    "tokenizer_choices",  # absent (None) unless the special tokens were configured
    "sources",
    "remote",  # ETag (or size and mtime) of each remote file; absent for local data
    "recipe",
)


def make_fingerprint(
    recipe: Any, readers: Sequence[Any], tok: Any, seq_len: int, global_batch_size: int
) -> dict[str, Any]:
    """Everything that defines a run's data, for the state (see FINGERPRINT_FIELDS)."""
    fingerprint = {
        "recipe": recipe.digest(),
        "sources": {s.name: r.num_docs for s, r in zip(recipe.sources, readers, strict=True)},
        "tokenizer": tok.fingerprint,
        # Only when a special token differs from the bare tokenizer.json's (docs/design.md §11).
        **({"tokenizer_choices": tok.choices} if tok.choices else {}),
        "seq_len": seq_len,
        "global_batch_size": global_batch_size,
        "lanes": recipe.lanes,
        "seed": recipe.seed,
    }
    remote = {u: v for r in readers for u, v in r.remote_versions().items()}
    if remote:  # only for remote sources, so local fingerprints stay as they were
        fingerprint["remote"] = remote
    return fingerprint


def check_header(state: Any, origin: str = "loader state") -> None:
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise StateError(f"{origin}: not a Zephon loader state (expected format {STATE_FORMAT!r})")
    if state.get("version") != STATE_VERSION:
        raise StateError(
            f"{origin}: state version {state.get('version')!r}; this Zephon reads version "
            f"{STATE_VERSION}"
        )
    for key in ("fingerprint", "step", "lanes"):
        if key not in state:
            raise StateError(f"{origin}: missing field {key!r}")


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse a resume whose data-defining settings changed, naming each field."""
    changed = []
    for field in FINGERPRINT_FIELDS:
        old, new = saved.get(field), current.get(field)
        if old != new:
            if field in ("recipe", "tokenizer"):
                old, new = str(old)[:12] + "…", str(new)[:12] + "…"
            changed.append(f"{field}: checkpoint has {old}, this run has {new}")
    if changed:
        raise StateError(
            "cannot resume: settings that define the data changed since the checkpoint "
            "(resuming would silently train on different batches):\n  "
            + "\n  ".join(changed)
            + "\nRestore the original values, or start a new run without this checkpoint."
        )


def merge_rank_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine every rank's state into one document covering all lanes."""
    if not states:
        raise StateError("no rank states to merge")
    for s in states:
        check_header(s)
    first = states[0]
    lanes: dict[str, Any] = {}
    for s in states:
        if s["fingerprint"] != first["fingerprint"] or s["step"] != first["step"]:
            raise StateError("rank states disagree on fingerprint or step; ranks are out of sync")
        lanes.update(s["lanes"])
    total = first["fingerprint"]["lanes"]
    if sorted(int(k) for k in lanes) != list(range(total)):
        raise StateError(f"rank states cover lanes {sorted(lanes)}, expected all {total}")
    merged = {k: v for k, v in first.items() if k not in ("lanes", "rank")}
    merged["lanes"] = {str(k): lanes[str(k)] for k in range(total)}
    merged["dp_size"] = len(states)
    if any("dropped_records" in s for s in states):  # bad_records = "drop": union of ranks
        dropped: dict[str, set[int]] = {}
        for s in states:
            for name, ids in s.get("dropped_records", {}).items():
                dropped.setdefault(name, set()).update(ids)
        merged["dropped_records"] = {k: sorted(v) for k, v in sorted(dropped.items())}
    return merged


def dumps(state: dict[str, Any]) -> str:
    return json.dumps(state, indent=1, sort_keys=True)


def load_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        raise StateError(f"{path}: loader state file not found") from None
    except OSError as exc:
        raise StateError(f"{path}: cannot read the loader state: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StateError(f"{path}: not valid JSON: {exc}") from None
    check_header(state, path)
    return state
