"""The mixer's exact picks and counts on small cases (zephon/lanes/mixing.py's rules).

Largest deficit first, the lowest index on ties; documents count one each and
tokens their length; a paused source (weight 0) is never picked and the others
mix exactly as they would alone; -1 when no source may be picked.
"""

from __future__ import annotations

import pytest

from zephon.lanes.mixing import Mixer


def picks(mixer: Mixer, n: int, active: list[bool], length: int = 1) -> list[int]:
    out = []
    for _ in range(n):
        out.append(mixer.choose(active))
        mixer.record(out[-1], length)
    return out


def test_largest_deficit_first_and_the_lowest_index_on_ties():
    # Deficits by hand: weight * taken - count (the weights sum to 1).
    assert picks(Mixer([0.5, 0.3, 0.2], "documents"), 10, [True] * 3) == [
        0, 1, 2, 0, 1, 0, 2, 0, 1, 0,
    ]  # fmt: skip
    # All deficits 0 at the start: the first source, not the heaviest.
    assert Mixer([0.2, 0.8], "documents").choose([True, True]) == 0
    assert picks(Mixer([0.2, 0.8], "documents"), 5, [True, True]) == [0, 1, 1, 1, 1]


def test_a_new_mixer_counts_nothing_and_a_restored_one_copies_its_counts():
    assert Mixer([0.7, 0.3], "documents").counts == [0, 0]
    saved = [3, 1]
    mixer = Mixer([0.7, 0.3], "documents", saved)
    mixer.record(0, 5)
    assert mixer.counts == [4, 1] and saved == [3, 1]


def test_documents_count_one_each_and_tokens_their_length():
    docs = Mixer([1.0, 1.0], "documents")
    docs.record(1, 50)
    docs.record(1, 7)
    assert docs.counts == [0, 2]
    tokens = Mixer([1.0, 1.0], "tokens")
    tokens.record(1, 50)
    tokens.record(0, 7)
    assert tokens.counts == [7, 50]


def test_a_paused_source_is_never_picked_and_the_others_mix_as_if_alone():
    with_paused = Mixer([0.0, 0.6, 0.4], "tokens")
    alone = Mixer([0.6, 0.4], "tokens")
    for length in [5, 1, 9, 2, 2, 7, 3, 3, 8, 1, 4, 6] * 3:
        k, j = with_paused.choose([True] * 3), alone.choose([True, True])
        assert k == j + 1
        with_paused.record(k, length)
        alone.record(j, length)
    assert with_paused.counts == [0, *alone.counts]


def test_retired_sources_drop_out_and_the_rest_share_by_weight():
    mixer = Mixer([0.5, 0.3, 0.2], "documents", [4, 0, 0])
    # Source 0 retired: 1 and 2 share 0.3 : 0.2 of what the two took (0 so far).
    assert picks(mixer, 5, [False, True, True]) == [1, 2, 1, 2, 1]
    assert mixer.counts == [4, 3, 2]


def test_nothing_to_pick_is_minus_one():
    assert Mixer([0.0, 1.0], "documents").choose([True, False]) == -1
    assert Mixer([1.0, 2.0], "documents").choose([False, False]) == -1


def test_a_mask_that_does_not_cover_every_source_is_refused():
    with pytest.raises(ValueError):
        Mixer([0.0, 1.0, 1.0], "documents").choose([True, True])
