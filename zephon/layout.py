"""The layout of one step's global batch over data-parallel ranks.

One planner answers every layout question (which lanes and rows a rank owns,
how many micro-steps every rank runs, how many rows are padding, how much
compute idles), so the loader, the trainer's startup check, `zephon validate`
and the training loop can never disagree. See docs/design.md, "Lanes".

The rule today: `L % D == 0`, `G % L == 0`, `D <= L` and `(G / D) % micro == 0`;
rank r owns the contiguous lanes [r*L/D, (r+1)*L/D), so every rank has the
same rows and nothing is padded.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon.errors import LayoutError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _multiples(of: int, near: int) -> str:
    lo = max(of, (near // of) * of)
    return f"{lo} or {lo + of}" if lo != near else str(lo)


@dataclass(frozen=True)
class Layout:
    """A checked layout: build it with `plan_layout`."""

    lanes: int
    dp_size: int
    global_batch_size: int
    micro_batch_size: int

    @property
    def rows_per_lane(self) -> int:
        """Rows each lane gives per step."""
        return self.global_batch_size // self.lanes

    def lanes_of(self, dp_rank: int) -> range:
        """The contiguous lanes data-parallel rank r owns, in lane order."""
        return lanes_of_rank(self.lanes, self.dp_size, dp_rank)

    def rows_of(self, dp_rank: int) -> int:
        """The real (data) rows of rank r per step."""
        return len(self.lanes_of(dp_rank)) * self.rows_per_lane

    @property
    def rows_per_rank(self) -> int:
        """Rows every rank runs per step, padding included."""
        return max(self.rows_of(r) for r in range(self.dp_size))

    def padded_rows(self, dp_rank: int) -> int:
        """Rows of rank r that are padding (all labels ignored)."""
        return self.rows_per_rank - self.rows_of(dp_rank)

    @property
    def micro_steps(self) -> int:
        """Forward/backward passes every rank runs per step."""
        return self.rows_per_rank // self.micro_batch_size

    @property
    def idle_share(self) -> float:
        """Share of the rows run that are padding: compute spent on nothing."""
        return 1.0 - self.global_batch_size / (self.dp_size * self.rows_per_rank)

    def describe(self) -> str:
        return (
            f"lanes={self.lanes} dp={self.dp_size} global_batch={self.global_batch_size} "
            f"rows/lane/step={self.rows_per_lane} rows/rank={self.rows_per_rank} "
            f"micro_batch={self.micro_batch_size} micro_steps={self.micro_steps} "
            f"idle={self.idle_share:.1%}"
        )


def plan_layout(
    lanes: int, dp_size: int, global_batch_size: int, micro_batch_size: int | None = None
) -> Layout:
    """The layout of G rows over D ranks; raises LayoutError naming the numbers
    and what would work. `micro_batch_size` None means one micro-batch per step."""
    micro = micro_batch_size or max(global_batch_size // max(dp_size, 1), 1)
    if lanes < 1 or dp_size < 1 or global_batch_size < 1 or micro < 1:
        raise LayoutError(
            f"lanes ({lanes}), data-parallel size ({dp_size}), global batch size "
            f"({global_batch_size}) and micro-batch size ({micro}) must all be >= 1"
        )
    if dp_size > lanes:
        raise LayoutError(
            f"data-parallel size {dp_size} exceeds the lane count {lanes}: every rank needs at "
            f"least one lane; raise [recipe] lanes to a multiple of {dp_size}"
        )
    if lanes % dp_size:
        raise LayoutError(
            f"lane count {lanes} is not divisible by the data-parallel size {dp_size}; "
            f"data-parallel sizes that work with {lanes} lanes: "
            f"{', '.join(map(str, _divisors(lanes)))} (or set lanes to a multiple of {dp_size})"
        )
    if global_batch_size % lanes:
        raise LayoutError(
            f"global batch size {global_batch_size} is not divisible by the lane count {lanes} "
            f"(each lane gives G/L rows per step); use e.g. "
            f"{_multiples(lanes, global_batch_size)}"
        )
    layout = Layout(lanes, dp_size, global_batch_size, micro)
    local = layout.rows_per_rank
    if local % micro:
        raise LayoutError(
            f"the local batch of {local} rows per rank (global batch {global_batch_size} / "
            f"{dp_size} ranks) is not divisible by the micro-batch size {micro}; "
            f"micro-batch sizes that work: {', '.join(map(str, _divisors(local)))}"
        )
    return layout


def lanes_of_rank(lanes: int, dp_size: int, dp_rank: int) -> range:
    """The contiguous lanes [r*L/D, (r+1)*L/D) owned by data-parallel rank r."""
    if not 0 <= dp_rank < dp_size:
        raise LayoutError(f"data-parallel rank {dp_rank} is outside [0, {dp_size})")
    per = lanes // dp_size
    return range(dp_rank * per, (dp_rank + 1) * per)
