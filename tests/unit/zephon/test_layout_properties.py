"""Properties of the layout rule (docs/design.md §2, DESIGN §2 and §13), for any shape.

Every expected value is computed here from the rule as written (exact fractions,
rows listed one by one), never by asking the planner again.
"""

from __future__ import annotations

from fractions import Fraction
from math import floor

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from zephon import LayoutError, resolve_layout


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, int, int, int | None]:
    """(lanes L, data-parallel size D <= L, global batch G = L x rows per lane, micro m)."""
    lanes = draw(st.integers(1, 512))
    dp = draw(st.integers(1, lanes))
    per_lane = draw(st.integers(1, 6))
    micro = draw(st.none() | st.integers(1, 24))
    return lanes, dp, lanes * per_lane, micro


@given(shapes())
def test_rank_r_owns_lanes_floor_rl_over_d_to_floor_r1l_over_d(shape):
    lanes, dp, g, micro = shape
    layout = resolve_layout(lanes, dp, g, micro)
    for r in range(dp):
        lo, hi = floor(Fraction(r * lanes, dp)), floor(Fraction((r + 1) * lanes, dp))
        assert layout.lanes_of(r) == range(lo, hi)


@given(shapes())
def test_ranks_local_batches_concatenate_to_the_lane_major_global_batch(shape):
    """Rank r's rows are its lanes' rows in lane order; the ranks in rank order give
    every lane once, in order, with floor(L/D) or ceil(L/D) lanes each, and
    exactly L mod D ranks own the larger share."""
    lanes, dp, g, micro = shape
    layout = resolve_layout(lanes, dp, g, micro)
    per_lane = g // lanes
    canonical = [(lane, i) for lane in range(lanes) for i in range(per_lane)]
    local = [[(lane, i) for lane in layout.lanes_of(r) for i in range(per_lane)] for r in range(dp)]
    assert [row for rows in local for row in rows] == canonical
    sizes = [len(layout.lanes_of(r)) for r in range(dp)]
    assert set(sizes) <= {lanes // dp, -(-lanes // dp)}
    assert sum(s == -(-lanes // dp) for s in sizes) == (lanes % dp or dp)
    assert [layout.rows_of(r) for r in range(dp)] == [len(rows) for rows in local]


@given(shapes())
def test_every_rank_runs_the_largest_ranks_rows_rounded_up_to_micro_batches(shape):
    lanes, dp, g, micro = shape
    layout = resolve_layout(lanes, dp, g, micro)
    rows = [len(range(r * lanes // dp, (r + 1) * lanes // dp)) * (g // lanes) for r in range(dp)]
    most = max(rows)
    m = micro or most  # no micro-batch size: one micro-batch of the largest rank's rows
    steps = -(-most // m)
    assert (layout.micro_batch_size, layout.micro_steps) == (m, steps)
    assert layout.rows_per_rank == steps * m
    assert [layout.padded_rows(r) for r in range(dp)] == [steps * m - n for n in rows]
    assert layout.total_padded_rows == dp * steps * m - g
    assert layout.idle_share == pytest.approx((dp * steps * m - g) / (dp * steps * m))
    assert layout.rank_rows == {n: rows.count(n) for n in sorted(set(rows))}
    # No padding exactly when D divides L and m divides G / D (today's even layout).
    even = lanes % dp == 0 and (g // dp) % m == 0
    assert (layout.total_padded_rows == 0) == even
    assert (layout.imbalance() is None) == even


@given(shapes(), st.floats(0.0, 1.0))
def test_max_idle_share_refuses_exactly_the_layouts_above_it(shape, allowed):
    lanes, dp, g, micro = shape
    run = resolve_layout(lanes, dp, g, micro)
    idle = run.total_padded_rows / (dp * run.rows_per_rank)
    if idle > allowed:
        with pytest.raises(LayoutError, match="of the compute idles, more than the allowed"):
            resolve_layout(lanes, dp, g, micro, max_idle_share=allowed)
    else:
        assert resolve_layout(lanes, dp, g, micro, max_idle_share=allowed) == run
    assert resolve_layout(lanes, dp, g, micro, max_idle_share=idle) == run  # at the bound: runs


@given(st.integers(1, 256), st.integers(1, 300), st.integers(1, 2000))
def test_each_broken_divisibility_rule_raises_naming_its_numbers(lanes, dp, g):
    """D > L and G % L != 0 are refused, each with its own message; every other
    shape with D <= L and L | G plans."""
    if dp > lanes:
        with pytest.raises(LayoutError, match=f"data-parallel size {dp} exceeds the lane count"):
            resolve_layout(lanes, dp, g)
    elif g % lanes:
        with pytest.raises(LayoutError, match=f"global batch size {g} is not divisible by the"):
            resolve_layout(lanes, dp, g)
    else:
        assert resolve_layout(lanes, dp, g).lanes == lanes


@given(shapes(), st.integers(-3, 3))
def test_a_rank_outside_the_group_is_refused(shape, beyond):
    lanes, dp, g, micro = shape
    rank = dp + beyond if beyond >= 0 else beyond
    assume(not 0 <= rank < dp)
    with pytest.raises(LayoutError, match=f"data-parallel rank {rank} is outside"):
        resolve_layout(lanes, dp, g, micro).lanes_of(rank)


@given(st.integers(-2, 0), st.integers(1, 8), st.sampled_from(["lanes", "dp", "g"]))
def test_sizes_below_one_are_refused(bad, ok, which):
    args = {"lanes": ok, "dp": ok, "g": ok, which: bad}
    with pytest.raises(LayoutError, match="must all be >= 1"):
        resolve_layout(args["lanes"], args["dp"], args["g"])
