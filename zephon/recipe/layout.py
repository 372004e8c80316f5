"""The layout of one step's global batch over data-parallel ranks.

One planner answers every layout question (which lanes and rows a rank owns,
how many micro-steps every rank runs, how many rows are padding, how much
compute idles), so the loader, the trainer's startup check, `zephon validate`
and the training loop can never disagree. See docs/design.md §2.

The rule: `1 <= D <= L` and `G % L == 0`. Rank r owns the contiguous lanes
[floor(r*L/D), floor((r+1)*L/D)), so ranks own floor(L/D) or ceil(L/D) lanes
when D does not divide L. Every rank runs the same rows per step: the largest
rank's rows rounded up to a whole number of micro-batches; the rows a rank
lacks are padding (every label ignored). The share of compute spent on padding
is reported, and refused only above `max_idle_share`.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon.errors import LayoutError


def _multiples(of: int, near: int) -> str:
    lo = max(of, (near // of) * of)
    return f"{lo} or {lo + of}" if lo != near else str(lo)


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


@dataclass(frozen=True)
class Layout:
    """A checked layout: build it with `resolve_layout`."""

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
    def rank_rows(self) -> dict[int, int]:
        """Real rows per step -> how many ranks have that many, fewest rows first."""
        few, extra = divmod(self.lanes, self.dp_size)  # `extra` ranks own one more lane
        counts = {few * self.rows_per_lane: self.dp_size - extra}
        if extra:
            counts[(few + 1) * self.rows_per_lane] = extra
        return counts

    @property
    def rows_per_rank(self) -> int:
        """Rows every rank runs per step, padding included: the largest rank's rows
        rounded up to a whole number of micro-batches."""
        most = max(self.rank_rows)
        return -(-most // self.micro_batch_size) * self.micro_batch_size

    def padded_rows(self, dp_rank: int) -> int:
        """Rows of rank r that are padding (all labels ignored)."""
        return self.rows_per_rank - self.rows_of(dp_rank)

    @property
    def micro_steps(self) -> int:
        """Forward/backward passes every rank runs per step."""
        return self.rows_per_rank // self.micro_batch_size

    @property
    def total_padded_rows(self) -> int:
        """Padding rows over all ranks per step."""
        return self.dp_size * self.rows_per_rank - self.global_batch_size

    @property
    def idle_share(self) -> float:
        """Share of the rows run that are padding: compute spent on nothing."""
        return self.total_padded_rows / (self.dp_size * self.rows_per_rank)

    def describe(self) -> str:
        return (
            f"lanes={self.lanes} dp={self.dp_size} global_batch={self.global_batch_size} "
            f"rows/lane/step={self.rows_per_lane} rows/rank={self.rows_per_rank} "
            f"micro_batch={self.micro_batch_size} micro_steps={self.micro_steps} "
            f"idle={self.idle_share:.1%}"
        )

    def imbalance(self) -> str | None:
        """One sentence on the padding (rows per rank, idle share); None when no
        rank pads."""
        if not self.total_padded_rows:
            return None
        real = ", ".join(f"{rows} on {_ranks(n)}" for rows, n in self.rank_rows.items())
        return (
            f"padded layout: {self.lanes} lanes over {self.dp_size} data-parallel ranks, "
            f"rows per rank {real}; every rank runs {self.rows_per_rank} rows "
            f"({self.micro_steps} micro-batches of {self.micro_batch_size}), so "
            f"{self.total_padded_rows} of the {self.dp_size * self.rows_per_rank} rows run per "
            f"step are padding: {self.idle_share:.1%} of the compute idles"
        )

    def even_alternatives(self) -> str:
        """What would run without padding: data-parallel sizes, and micro-batch sizes
        at this size when its lanes split evenly."""
        g, micro = self.global_batch_size, self.micro_batch_size
        sizes = [
            d for d in range(1, self.lanes + 1) if self.lanes % d == 0 and (g // d) % micro == 0
        ]
        text = f"data-parallel sizes without padding: {', '.join(map(str, sizes)) or 'none'}"
        if len(self.rank_rows) == 1:  # lanes split evenly: only the micro-batch pads
            local = g // self.dp_size
            fits = [m for m in range(1, local + 1) if local % m == 0]
            text += f"; micro-batch sizes without padding: {', '.join(map(str, fits))}"
        return text


def resolve_layout(
    lanes: int,
    dp_size: int,
    global_batch_size: int,
    micro_batch_size: int | None = None,
    max_idle_share: float = 1.0,
    lanes_setting: str = "[recipe] lanes",
) -> Layout:
    """The layout of G rows over D ranks; raises LayoutError naming the numbers
    and what would work. `micro_batch_size` None means one micro-batch per step
    (of the largest rank's rows). `max_idle_share` refuses a layout whose padding
    is a larger share of the rows run (1.0, the default, allows any).
    `lanes_setting`: where the lane count is set, for the hint (a phase's)."""
    if lanes < 1 or dp_size < 1 or global_batch_size < 1:
        raise LayoutError(
            f"lanes ({lanes}), data-parallel size ({dp_size}) and global batch size "
            f"({global_batch_size}) must all be >= 1"
        )
    if dp_size > lanes:
        raise LayoutError(
            f"data-parallel size {dp_size} exceeds the lane count {lanes}: every rank needs at "
            f"least one lane; raise {lanes_setting} to a multiple of {dp_size}"
        )
    if global_batch_size % lanes:
        raise LayoutError(
            f"global batch size {global_batch_size} is not divisible by the lane count {lanes} "
            f"(each lane gives G/L rows per step); use e.g. "
            f"{_multiples(lanes, global_batch_size)}"
        )
    most_lanes = -(-lanes // dp_size)
    micro = micro_batch_size or most_lanes * (global_batch_size // lanes)
    if micro < 1:
        raise LayoutError(f"micro-batch size ({micro}) must be >= 1")
    if not 0.0 <= max_idle_share <= 1.0:
        raise LayoutError(f"max_idle_share {max_idle_share} is not a share in [0, 1]")
    layout = Layout(lanes, dp_size, global_batch_size, micro)
    if layout.idle_share > max_idle_share:
        raise LayoutError(
            f"{layout.imbalance()}, more than the allowed {max_idle_share:.1%}; "
            f"{layout.even_alternatives()} (or raise the allowed idle share)"
        )
    return layout


def lanes_of_rank(lanes: int, dp_size: int, dp_rank: int) -> range:
    """The contiguous lanes [floor(r*L/D), floor((r+1)*L/D)) owned by data-parallel
    rank r: every lane once, in lane order, floor(L/D) or ceil(L/D) per rank."""
    if not 0 <= dp_rank < dp_size:
        raise LayoutError(f"data-parallel rank {dp_rank} is outside [0, {dp_size})")
    return range(dp_rank * lanes // dp_size, (dp_rank + 1) * lanes // dp_size)
