"""The data schedule as the trainer sees it: the recipe's phases, resolved with the
job config, and what the training loop needs of them at each step.

The recipe owns the schedule (`zephon/recipe/phases.py`): phases change the mixture,
the global batch size, seq_len and the lane count at given steps. The job
config gives the first phase's seq_len and global batch size where the recipe
does not; where the user set one on purpose and the recipe's first phase says
otherwise, that is one error naming both. Micro-batches follow each phase:
`training.local_batch_size` rows, or `training.local_batch_tokens` / seq_len
rows, so memory stays flat when seq_len grows. A recipe without phases is one
phase of the job's shape, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.config.job_config import JobConfig
from zephon import Layout, Phase, PhaseTimeline, Recipe, RecipeError, load_recipe, resolve_phases


def micro_rows(local_batch_size: int, local_batch_tokens: int | None, seq_len: int) -> int:
    """Rows per micro-batch at `seq_len`: local_batch_tokens / seq_len when set."""
    return local_batch_tokens // seq_len if local_batch_tokens else local_batch_size


@dataclass(frozen=True)
class DataTimeline:
    """The resolved phases of `[data] recipe` and the micro-batch rule of the job."""

    timeline: PhaseTimeline
    local_batch_size: int
    local_batch_tokens: int | None
    recipe_path: str

    @classmethod
    def from_config(cls, cfg: JobConfig, recipe: Recipe | None = None) -> DataTimeline:
        t = cfg.training
        recipe = recipe or load_recipe(cfg.data.recipe)
        try:
            timeline = resolve_phases(recipe, t.seq_len, t.global_batch_size, cfg.explicit_shape())
        except RecipeError as exc:  # say where the job's value came from
            where = "; ".join(f"training.{n} from {cfg.set_by('training', n)}"
                              for n in cfg.explicit_shape())  # fmt: skip
            raise RecipeError(f"{exc} ({where})") from None
        return cls(timeline, t.local_batch_size, t.local_batch_tokens or None, cfg.data.recipe)

    @property
    def phases(self) -> tuple[Phase, ...]:
        return self.timeline.phases

    @property
    def named(self) -> bool:
        """The recipe has `[[phase]]` tables."""
        return self.timeline.named

    def phase_at(self, step: int) -> Phase:
        """The phase of the trainer's step `step` (counted from 1)."""
        return self.timeline.phase_at(step)

    def micro_rows(self, phase: Phase) -> int:
        """Rows per micro-batch in `phase` (the startup check made them whole)."""
        return micro_rows(self.local_batch_size, self.local_batch_tokens, phase.seq_len)

    def step_tokens(self, phase: Phase) -> int:
        """Tokens of one global batch of `phase` (model inputs: seq_len per row)."""
        return phase.global_batch_size * phase.seq_len

    def unfinished(self, steps_done: int) -> tuple[Phase, ...]:
        """The phases with steps still to train after `steps_done` steps."""
        return self.timeline.unfinished(steps_done)

    def boundaries(self) -> tuple[int, ...]:
        """The steps after which a phase starts: its boundary checkpoint's step."""
        return tuple(p.start_step for p in self.phases if p.start_step > 0)

    def describe(self, phase: Phase) -> str:
        """A few words for the log: the phase, its steps and shape."""
        end = "end" if phase.end_step is None else str(phase.end_step)
        name = f"phase {phase.name!r}" if phase.name is not None else "data"
        return (
            f"{name}: steps {phase.start_step + 1}..{end}, global batch "
            f"{phase.global_batch_size} x {phase.seq_len} tokens, {phase.lanes} lanes, "
            f"micro-batch {self.micro_rows(phase)} rows, mix "
            + " ".join(f"{n} {w:g}" for n, w in phase.weights_by_name.items())
        )

    def report(self, layouts: dict[str | None, Layout], steps_done: int) -> list[str]:
        """Start-up log lines: every phase still to come with its layout, and the
        padding of any layout that pads (refused above parallelism.max_idle_share)."""
        lines = []
        for phase in self.unfinished(steps_done):
            if self.named:
                lines.append(self.describe(phase))
            if layout := layouts.get(phase.name):
                lines.append(f"data layout {layout.describe()}")
                if note := layout.imbalance():
                    lines.append(f"{note} (refuse above parallelism.max_idle_share)")
        return lines
