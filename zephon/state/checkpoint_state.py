"""The loader's checkpoint document: versioned JSON of cursors, never buffers.

Per lane it holds the lane's latest flush point consumed by the trainer and
the rows consumed since then; its size is O(lanes x sources). A fingerprint of
everything that must not change across a resume is checked field by field;
for a recipe with phases it holds one entry per phase that had produced a
batch, and only those are checked: later phases may be added, edited or
removed (docs/design.md, "Phases").

Version 2 (phases) keys the mixer counts by source name, may carry the
documents a phase boundary cut (`carry`), the lane-count changes still in use
(`deals`), the step where the lanes' segment started and their count.
Version 3 identifies the data by content, not by path: its recipe and phase
digests leave the source paths out, and `files` holds each source file's size
and sampled-block hashes (zephon/sources/content.py), so the same files reached
by another path resume and a changed file is refused by name. It also lists
the phases not started yet (`later_phases`), to explain a moved boundary.
Versions 1 and 2 are read by `upgrade` and their fingerprints checked as they
were written: digests over paths relative to the recipe folder
(docs/design.md §11).

A recipe with image sources adds the decode canary (zephon/images/pixels/canary.py)
to the fingerprint, and a resume whose canary differs is refused naming both
machines' decoder versions: the same recipe would give other pixels there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from zephon.errors import StateError
from zephon.sources.content import block_difference

STATE_FORMAT = "zephon.loader_state"
STATE_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)

# Checked in this order so the error names the most specific change first.
FINGERPRINT_FIELDS = (
    "seq_len",
    "global_batch_size",
    "lanes",
    "seed",
    "tokenizer",
    "tokenizer_choices",  # absent (None) unless the special tokens were configured
    "sources",
    "files",  # content fingerprints of each source's files (version 3)
    "remote",  # ETag (or size and mtime) of each remote file; absent for local data
    "image.decode",  # absent (None) unless [image] decode is not "exact"
    "recipe",
)
# A phase's entry (recipes with [[phase]] tables), checked in this order; its
# recipe digest covers the rest and is named only when nothing above changed.
PHASE_FIELDS = (
    "name",
    "start_step",
    "seq_len",
    "global_batch_size",
    "lanes",
    "weights",
    "sources",
    "recipe",
)
GLOBAL_FIELDS = ("seed", "tokenizer", "tokenizer_choices", "files", "remote", "image.decode")


def make_fingerprint(
    recipe: Any, readers: Sequence[Any], tok: Any, timeline: Any, legacy: bool = False
) -> dict[str, Any]:
    """Everything that defines a run's data, for the state (see FINGERPRINT_FIELDS).

    A recipe without phases gets the recipe digest, sources, seq_len, global
    batch size and lanes; one with phases gets an entry per phase (`phases`)
    instead. Digests leave the paths out and `files` holds the files' content
    fingerprints; `legacy`: the fingerprint a version 2 state of this run would
    hold instead (digests over paths relative to the recipe folder, no `files`),
    to check such a state against."""
    counts = {s.name: r.num_docs for s, r in zip(recipe.sources, readers, strict=True)}
    fingerprint: dict[str, Any] = {
        "tokenizer": tok.fingerprint,
        # Only when a special token differs from the bare tokenizer.json's (docs/design.md §11).
        **({"tokenizer_choices": tok.choices} if tok.choices else {}),
        "seed": recipe.seed,
    }
    if timeline.named:
        fingerprint["phases"] = [
            {
                "name": p.name,
                "start_step": p.start_step,
                "seq_len": p.seq_len,
                "global_batch_size": p.global_batch_size,
                "lanes": p.lanes,
                "weights": p.weights_by_name,
                "sources": {n: counts[n] for n in p.weights_by_name},
                "recipe": p.identity(recipe, paths=legacy),
            }
            for p in timeline.phases
        ]
    else:
        (only,) = timeline.phases
        fingerprint.update(
            recipe=recipe.digest(paths=legacy),
            sources=counts,
            seq_len=only.seq_len,
            global_batch_size=only.global_batch_size,
            lanes=recipe.lanes,
        )
    if legacy:  # never saved: for the message when such a state is refused
        fingerprint["relative_paths"] = {
            s["name"]: s["paths"] for s in recipe.data_identity(paths=True)["sources"]
        }
    else:
        fingerprint["files"] = {
            s.name: r.content_fingerprints() for s, r in zip(recipe.sources, readers, strict=True)
        }
    remote = {u: v for r in readers for u, v in r.remote_versions().items()}
    if remote:  # only for remote sources, so local fingerprints stay as they were
        fingerprint["remote"] = remote
    if any(s.multimodal for s in recipe.sources):  # likewise: text recipes have none
        from zephon.images.pixels.canary import decode_canary

        fingerprint["decode_canary"] = decode_canary(recipe.image)
        if recipe.image.decode != "exact":  # only then, so earlier states stay equal
            fingerprint["image.decode"] = recipe.image.decode
    return fingerprint


def check_state_data(
    state: dict[str, Any],
    fingerprint: dict[str, Any],
    recipe: Any,
    readers: Sequence[Any],
    tok: Any,
    timeline: Any,
) -> None:
    """Refuse a state (upgraded) whose data differs from this run's `fingerprint`. An
    older state, without `files`, is checked against the digests it recorded, over
    source paths relative to the recipe folder."""
    saved = state["fingerprint"]
    current = fingerprint
    if "files" not in saved:
        current = make_fingerprint(recipe, readers, tok, timeline, legacy=True)
    names = {r.spec.name: [f.url for f in r.content_files()] for r in readers}
    check_fingerprint(saved, current, int(state["step"]), state.get("later_phases"), names)


def fingerprint_at(fingerprint: dict[str, Any], steps_done: int) -> dict[str, Any]:
    """The fingerprint a state written after `steps_done` steps records: only the
    phases that had produced a batch by then."""
    if "phases" not in fingerprint:
        return fingerprint
    started = [p for p in fingerprint["phases"] if p["start_step"] < steps_done]
    return {**fingerprint, "phases": started}


def rank_state(
    fingerprint: dict[str, Any],
    timeline: Any,
    step: int,
    rank: int,
    segment: Any,
    lanes: dict[str, Any],
) -> dict[str, Any]:
    """A rank's state document after `step` steps: its lanes' entries in `segment`."""
    state: dict[str, Any] = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "fingerprint": fingerprint_at(fingerprint, step),
        "step": step,
        "rows_per_lane_per_step": timeline.phase_at(step).rows_per_lane,
        "rank": rank,
        "segment_start": segment.start_step,
        "num_lanes": segment.lanes,
        "lanes": lanes,
    }
    if timeline.named:
        state["phase"] = timeline.phase_at(step).name
        starting = [p.name for p in timeline.phases if p.start_step == step and step > 0]
        if starting:
            state["boundary_of"] = starting[0]
        later = [[p.name, p.start_step] for p in timeline.phases if p.start_step >= step]
        if later:  # not checked: names a phase whose boundary moved before `step`
            state["later_phases"] = later
    return state


def phases_of(fingerprint: dict[str, Any]) -> list[dict[str, Any]]:
    """A fingerprint's phase entries; a recipe without phases is one phase from step 0."""
    if "phases" in fingerprint:
        return list(fingerprint["phases"])
    keys = ("seq_len", "global_batch_size", "lanes", "sources", "recipe")
    return [{"name": None, "start_step": 0, **{k: fingerprint.get(k) for k in keys}}]


def started_phases(state: dict[str, Any]) -> list[tuple[str | None, int]]:
    """(name, start_step) of each phase that had produced a batch when the state was
    written (name None: a recipe without phases)."""
    if int(state["step"]) == 0:
        return []
    return [(p["name"], int(p["start_step"])) for p in phases_of(state["fingerprint"])]


def boundary_of(state: dict[str, Any]) -> str | None:
    """The phase whose boundary checkpoint this state is (written exactly at its
    start_step), or None."""
    return state.get("boundary_of")


def upgrade(state: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """An older state as the current version. Version 1: mixer counts by source
    name (`names`: the recipe's sources the version 1 run mixed, in its order).
    Version 2 has the current layout; its fingerprint (no `files`) is checked as
    it was written (`check_fingerprint`)."""
    if state.get("version") == 2:
        return {**state, "version": STATE_VERSION}
    if state.get("version") != 1:
        return state
    lanes = {}
    for k, entry in state["lanes"].items():
        flush = dict(entry["flush"])
        mix = flush["mix"]
        if len(mix) != len(names):
            raise StateError(
                f"loader state: lane {k} has {len(mix)} mixer counts, the recipe's first "
                f"phase mixes {len(names)} sources ({', '.join(names)})"
            )
        flush["mix"] = dict(zip(names, mix, strict=True))
        lanes[k] = {**entry, "flush": flush}
    out = {**state, "version": STATE_VERSION, "lanes": lanes}
    out.setdefault("segment_start", 0)
    out.setdefault("num_lanes", state["fingerprint"]["lanes"])
    return out


def check_header(state: Any, origin: str = "loader state") -> None:
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise StateError(f"{origin}: not a Zephon loader state (expected format {STATE_FORMAT!r})")
    if state.get("version") not in READABLE_VERSIONS:
        raise StateError(
            f"{origin}: state version {state.get('version')!r}; this Zephon reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    for key in ("fingerprint", "step", "lanes"):
        if key not in state:
            raise StateError(f"{origin}: missing field {key!r}")


def _shown(field: str, value: Any) -> Any:
    if field in ("recipe", "tokenizer") and value is not None:
        return str(value)[:12] + "…"
    if field == "image.decode":  # the pixels differ
        return repr(value or "exact")
    return value


def check_fingerprint(
    saved: dict[str, Any],
    current: dict[str, Any],
    step: int | None = None,
    later: Sequence[Sequence[Any]] | None = None,
    files: dict[str, list[str]] | None = None,
) -> None:
    """Refuse a resume whose data-defining settings changed, naming each field.

    With phases, `saved` holds the phases that had produced a batch by the
    checkpoint's `step`: exactly those must be this run's phases starting before
    `step`, unchanged (naming the phase and the field); later ones are free
    (`later`: the state's phases not started, [name, start_step], to name a
    moved boundary). A decode canary that differs is refused first, with its
    own message.

    A fingerprint with `files` (version 3) is checked by content: each file of
    the sources it used must have the same size and sampled blocks (`files`:
    this run's file names by source, for the message); a remote object reached
    by the same URL must also keep its ETag. One without (version 2 and older)
    is checked as written: `current` must then be this run's legacy fingerprint
    (make_fingerprint(..., legacy=True)), digests over relative paths."""
    if "decode_canary" in saved and "decode_canary" in current:
        from zephon.images.pixels.canary import canary_mismatch

        mismatch = canary_mismatch(saved["decode_canary"], current["decode_canary"])
        if mismatch is not None:
            raise StateError(f"cannot resume: {mismatch}")
    by_content = "files" in saved
    changed = []
    if "phases" not in saved and "phases" not in current:
        fields: Sequence[str] = FINGERPRINT_FIELDS
    else:
        fields = GLOBAL_FIELDS
    # The sources the checkpoint's batches came from: its started phases' (a recipe
    # without phases lists no weights: all of them).
    used = sorted(
        {n for p in phases_of(saved) for n in (p.get("weights") or saved.get("files", {}))}
    )
    for field in fields:
        old, new = saved.get(field), current.get(field)
        if field == "files":
            if by_content:
                changed += _file_changes(old, new or {}, used, files or {})
        elif field == "remote" and by_content:
            changed += _remote_changes(old or {}, new or {})
        elif old != new:
            changed.append(
                f"{field}: checkpoint has {_shown(field, old)}, this run has {_shown(field, new)}"
            )
    if fields is GLOBAL_FIELDS:
        changed += _phase_changes(phases_of(saved), phases_of(current), step, later)
    if changed:
        if not by_content and any("recipe: checkpoint has" in c for c in changed):
            changed.append(_legacy_note(current.get("relative_paths")))
        raise StateError(
            "cannot resume: settings that define the data changed since the checkpoint "
            "(resuming would silently train on different batches):\n  "
            + "\n  ".join(changed)
            + "\nRestore the original values, or start a new run without this checkpoint."
        )


def _file_changes(
    saved: dict[str, Any], current: dict[str, Any], used: Sequence[str], names: dict[str, list[str]]
) -> list[str]:
    """Each file of the sources `used` whose size or sampled blocks differ, by name."""
    out = []
    for source in used:
        old, new = saved.get(source), current.get(source)
        if old is None or new is None:
            continue  # a source renamed or removed: the phases' fields name it
        if len(old) != len(new):
            out.append(
                f"source '{source}': checkpoint has {len(old)} file(s), this run has {len(new)}"
            )
            continue
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            why = block_difference(a, b)
            if why is not None:
                shown = names.get(source, [])
                where = f", {shown[i]}" if i < len(shown) else ""
                out.append(f"source '{source}': file {i + 1} of {len(new)}{where}: {why}")
    return out


def _remote_changes(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """Objects reached by the same URL whose version (ETag...) changed. A URL in
    only one run is another path to data whose content `files` checks."""
    old = {u: v for u, v in saved.items() if u in current and current[u] != v}
    if not old:
        return []
    return [f"remote: checkpoint has {old}, this run has { {u: current[u] for u in old} }"]


def _legacy_note(paths: dict[str, list[str]] | None) -> str:
    where = "; ".join(f"{n}: {', '.join(p)}" for n, p in (paths or {}).items())
    return (
        "this checkpoint was written by an older Zephon (loader state version 2 or "
        "older), whose recipe digests include each source's paths relative to the recipe "
        f"folder ({where or 'see the recipe'}): a copied recipe or moved data changes "
        "them. Resume once with the recipe and its data where they were relative to each "
        "other; checkpoints written after that identify the data by content, wherever it is."
    )


def _phase_changes(
    saved: list[dict[str, Any]],
    current: list[dict[str, Any]],
    step: int | None,
    later: Sequence[Sequence[Any]] | None = None,
) -> list[str]:
    """Each started phase matched by name (or, renamed, by its start step) with
    this run's phase, and the fields that differ; phases started in only one
    (`later`: the checkpoint's phases not started by then, to say a boundary moved)."""
    now = current[: len(saved)] if step is None else [p for p in current if p["start_step"] < step]
    names = {p["name"] for p in saved}
    by_name = {p["name"]: p for p in now if p["name"] is not None}
    spare = [p for p in now if p["name"] not in names]
    starts = {p["name"]: p["start_step"] for p in current if p["name"] is not None}
    out = []
    for old in saved:
        name = old["name"] if old["name"] is not None else "(the recipe's only phase)"
        new = by_name.get(old["name"])
        if new is None:  # renamed, or a recipe without phases on one side
            new = next((p for p in spare if p["start_step"] == old["start_step"]), None)
            if new is not None:
                spare.remove(new)
        if new is None:
            moved = (
                f"its start step moved from {old['start_step']} to {starts[old['name']]}"
                if old["name"] in starts
                else "this run's recipe does not start it by then"
            )
            out.append(
                f"phase '{name}' (from step {old['start_step']}) had started by the "
                f"checkpoint's step {step}; {moved}"
            )
            continue
        diffs: list[str] = []
        for field in PHASE_FIELDS:
            a, b = old.get(field), new.get(field)
            if (a is None or b is None) and field in ("name", "weights"):
                continue  # a recipe without phases names none and lists no weights
            if a != b and (field != "recipe" or not diffs):
                diffs.append(
                    f"phase '{name}': {field}: checkpoint has {_shown(field, a)}, "
                    f"this run has {_shown(field, b)}"
                )
        out += diffs
    planned = {n: int(at) for n, at in later} if later is not None else None
    for extra in spare:
        head = (
            f"phase '{extra['name']}' starts at step {extra['start_step']}, before the "
            f"checkpoint's step {step}"
        )
        if planned is not None and extra["name"] in planned:
            out.append(
                f"{head}, but the checkpoint's run had it start at step "
                f"{planned[extra['name']]}: its start step moved from "
                f"{planned[extra['name']]} to {extra['start_step']}, which a resume past "
                f"step {extra['start_step']} cannot accept (the checkpoint's batches after it "
                f"were not the phase's); start it at step {step} or later"
            )
        elif planned is not None:
            out.append(f"{head}, but the checkpoint's run had no such phase")
        else:  # a state of an older Zephon: it does not say which phases were to come
            out.append(
                f"{head}, but the checkpoint's run had not started it by then (it had no "
                "such phase, or started it later: a moved start step cannot be accepted "
                "once a resume is past it)"
            )
    return out


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
    total = first.get("num_lanes", first["fingerprint"].get("lanes"))
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
