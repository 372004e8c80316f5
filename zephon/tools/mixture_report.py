"""The realised mixture against the recipe's schedule, step by step (`zephon mixture`).

Each batch counts what it holds of every source (`Batch.source_tokens`, or
`source_docs` when the recipe mixes by documents); the share of a source in a
step is set against the weight its phase gives it. Over a phase the realised
shares converge to the weights (each lane stays within one document of its
mixture), and at a boundary the new weights take over at once: the mixer
counts restart (docs/design.md, "Phases").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from zephon.batch import Batch
from zephon.recipe.phases import PhaseTimeline


@dataclass
class MixtureRow:
    """One step: its phase, the scheduled and the realised share of every source,
    and the realised share over the phase so far."""

    step: int  # the trainer's step, counted from 1
    phase: str | None
    scheduled: dict[str, float]
    realised: dict[str, float]
    phase_so_far: dict[str, float] = field(default_factory=dict)


def _shares(counts: np.ndarray, names: tuple[str, ...]) -> dict[str, float]:
    total = float(counts.sum())
    return {n: (float(c) / total if total else 0.0) for n, c in zip(names, counts, strict=True)}


def measure(
    timeline: PhaseTimeline, steps: Iterable[list[Batch]], by_documents: bool
) -> list[MixtureRow]:
    """The rows of the report, from each step's batches of every rank."""
    rows: list[MixtureRow] = []
    phase_counts: np.ndarray | None = None
    for batches in steps:
        first = batches[0]
        names = first.source_names
        counts = sum(
            np.asarray(b.source_docs if by_documents else b.source_tokens, dtype=np.int64)
            for b in batches
        )
        assert isinstance(counts, np.ndarray)
        step = first.step + 1
        phase = timeline.phase_at(step)
        if not rows or rows[-1].phase != phase.name:
            phase_counts = np.zeros_like(counts)
        assert phase_counts is not None
        phase_counts = phase_counts + counts
        total_w = sum(phase.weights)
        rows.append(
            MixtureRow(
                step,
                phase.name,
                {n: w / total_w for n, w in zip(phase.source_names, phase.weights, strict=True)},
                _shares(counts, names),
                _shares(phase_counts, names),
            )
        )
    return rows


def table(rows: list[MixtureRow]) -> list[str]:
    """Text lines: per step, each source's realised share over its phase so far,
    the step's own share and the scheduled share."""
    if not rows:
        return []
    names = list(rows[0].scheduled)
    head = "step  phase         " + "  ".join(f"{n[:16]:>24}" for n in names)
    out = [head, " " * 20 + "  ".join(f"{'phase/step/schedule':>24}" for _ in names)]
    for r in rows:
        cells = [
            f"{r.phase_so_far[n]:.3f}/{r.realised[n]:.3f}/{r.scheduled[n]:.3f}".rjust(24)
            for n in names
        ]
        out.append(f"{r.step:>4}  {str(r.phase)[:12]:<12}  " + "  ".join(cells))
    return out


def plot(rows: list[MixtureRow], path: str, title: str) -> None:
    """A PNG of the realised shares (per step, and over the phase so far) against
    the schedule (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in rows]
    starts = [i for i, r in enumerate(rows) if i and r.phase != rows[i - 1].phase]
    spans = list(zip([0, *starts], [*starts, len(rows)], strict=True))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, name in enumerate(rows[0].scheduled):
        color = f"C{k}"
        ax.step(steps, [r.scheduled[name] for r in rows], where="mid", ls="--", color=color)
        ax.plot(steps, [r.realised[name] for r in rows], color=color, alpha=0.35, lw=1)
        for a, b in spans:  # over each phase so far: one line per phase
            ax.plot(
                steps[a:b],
                [r.phase_so_far[name] for r in rows[a:b]],
                color=color,
                lw=2,
                marker="." if b - a == 1 else None,
                label=name if a == 0 else None,
            )
    for i in starts:
        ax.axvline(steps[i] - 0.5, color="grey", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("share of the batch")
    ax.set_ylim(0, 1)
    ax.set_title(title + "\n(dashed: schedule; thin: each step; thick: over the phase so far)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
