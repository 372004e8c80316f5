"""The divisibility rules that make batches independent of the GPU count."""

from __future__ import annotations

from zephon.errors import LayoutError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _multiples(of: int, near: int) -> str:
    lo = max(of, (near // of) * of)
    return f"{lo} or {lo + of}" if lo != near else str(lo)


def check_layout(lanes: int, dp_size: int, global_batch_size: int, micro_batch_size: int) -> None:
    """Raise LayoutError, naming the numbers and what would work, unless
    L % D == 0, G % L == 0, D <= L and (G / D) % micro_batch == 0."""
    if lanes < 1 or dp_size < 1 or global_batch_size < 1 or micro_batch_size < 1:
        raise LayoutError(
            f"lanes ({lanes}), data-parallel size ({dp_size}), global batch size "
            f"({global_batch_size}) and micro-batch size ({micro_batch_size}) must all be >= 1"
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
    local = global_batch_size // dp_size
    if local % micro_batch_size:
        raise LayoutError(
            f"the local batch of {local} rows per rank (global batch {global_batch_size} / "
            f"{dp_size} ranks) is not divisible by the micro-batch size {micro_batch_size}; "
            f"micro-batch sizes that work: {', '.join(map(str, _divisors(local)))}"
        )


def lanes_of_rank(lanes: int, dp_size: int, dp_rank: int) -> range:
    """The contiguous lanes [r*L/D, (r+1)*L/D) owned by data-parallel rank r."""
    if not 0 <= dp_rank < dp_size:
        raise LayoutError(f"data-parallel rank {dp_rank} is outside [0, {dp_size})")
    per = lanes // dp_size
    return range(dp_rank * per, (dp_rank + 1) * per)
