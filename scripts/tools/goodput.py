"""Where a job's time went: the goodput breakdown of a dump folder, and its timeline.

    python scripts/tools/goodput.py outputs/llama3_debugmodel
    python scripts/tools/goodput.py outputs/llama3_debugmodel --png timeline.png

Reads the ledgers under DUMP/goodput/ (every attempt and replica group; the
trainer appends them) and prints the goodput and the badput by cause; `--json`
prints what `goodput.json` holds. `--png` draws the timeline: one row per
attempt, the job's own row on top (matplotlib). A ledger cut short by a crash
or from another version is read as far as it goes, with a note naming what is
missing. Exit 2 when the folder holds no ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from torchtitan.components.goodput import FORMAT, SUMMARY, Summary, report, summarize

COLOURS = {
    "productive": "#2ca02c",
    "startup": "#7f7f7f",
    "checkpoint_restore": "#17becf",
    "checkpoint_save": "#1f77b4",
    "data_wait": "#ff7f0e",
    "validation": "#bcbd22",
    "recovery": "#d62728",
    "steps_redone": "#9467bd",
    "between_attempts": "#ffffff",
    "other": "#c7c7c7",
}


def draw(summary: Summary, png: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [("job", summary.timeline), *summary.attempt_lanes]
    fig, ax = plt.subplots(figsize=(11, 1.6 + 0.45 * len(rows)))
    for y, (_, segments) in enumerate(reversed(rows)):
        # An attempt's own intervals overlap (its lifetime is `other` under the rest):
        # drawn lowest cause first, so the specific ones show on top.
        for a, b, cause in sorted(segments, key=lambda s: s[2] != "other"):
            if cause != "between_attempts":
                ax.broken_barh([(a, b - a)], (y - 0.4, 0.8), color=COLOURS[cause], linewidth=0)
    ax.set_yticks(range(len(rows)), [name for name, _ in reversed(rows)])
    ax.set_xlabel("seconds since the job's launch")
    ax.set_title(f"{title}: goodput {100 * summary.goodput:.1f}%")
    used = {c for _, segs in rows for _, _, c in segs} - {"between_attempts"}
    handles = [Patch(color=COLOURS[c], label=c) for c in COLOURS if c in used]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _older_summary(folder: str) -> list[str]:
    """A folder with goodput.json and no ledger: what that file says, as far as this
    version reads it."""
    path = os.path.join(folder, SUMMARY)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"{path}: not readable ({exc})"]
    lines = []
    if doc.get("format") != FORMAT:
        lines.append(f"{path}: format {doc.get('format')!r}, this version writes {FORMAT}: "
                     "shown as far as its fields are known")  # fmt: skip
    for key in ("job_seconds", "productive_seconds", "goodput"):
        lines.append(f"  {key}: {doc[key]}" if key in doc else f"  {key}: missing")
    for cause, secs in (doc.get("badput_seconds") or {}).items():
        lines.append(f"  badput {cause}: {secs}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump_folder")
    p.add_argument("--png", help="draw the timeline here")
    p.add_argument("--json", action="store_true", help="print goodput.json's fields")
    args = p.parse_args(argv)
    try:
        summary = summarize(args.dump_folder)
    except FileNotFoundError as exc:
        if os.path.isfile(os.path.join(args.dump_folder, SUMMARY)):
            print(f"{exc}; its {SUMMARY} says:")
            print("\n".join(_older_summary(args.dump_folder)))
            return 0
        print(f"error: {exc} (the trainer writes one in every run's dump folder)", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary.to_json(), indent=1))
    else:
        print("\n".join(report(summary, args.dump_folder)))
    if args.png:
        draw(summary, args.png, os.path.basename(os.path.normpath(args.dump_folder)))
        print(f"timeline: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
