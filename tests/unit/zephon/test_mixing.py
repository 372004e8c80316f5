"""The mixer on its own: realised shares stay within one document of the weights."""

from __future__ import annotations

import random

import pytest

from zephon.lanes.mixing import Mixer

WEIGHTS = [0.5, 0.3, 0.2]


def lengths(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([rng.randint(1, 8), rng.randint(1, 60)]) for _ in range(n)]


@pytest.mark.parametrize("unit", ["documents", "tokens"])
def test_realised_shares_stay_within_one_document_of_the_weights(unit):
    docs = lengths(7, 5000)
    mixer = Mixer(WEIGHTS, unit)
    longest = max(docs) if unit == "tokens" else 1  # one document, in the mixture's unit
    given = [0, 0, 0]  # what each source gave, counted here, in the mixture's unit
    for n, length in enumerate(docs, 1):
        k = mixer.choose([True, True, True])
        mixer.record(k, length)
        given[k] += length if unit == "tokens" else 1
        total = sum(given)
        for i, w in enumerate(WEIGHTS):
            # At every point of the window, not only at its end.
            assert abs(given[i] - w * total) <= longest, (n, i, given)
    assert min(given) > 0


def test_a_retired_source_drops_out_and_the_rest_renormalise():
    mixer = Mixer(WEIGHTS, "documents")
    for _ in range(300):
        mixer.record(mixer.choose([True, True, True]), 1)
    retired = mixer.counts[2]
    active = [True, True, False]
    w0, w1 = WEIGHTS[0], WEIGHTS[1]
    for _ in range(3000):
        k = mixer.choose(active)
        assert k != 2
        mixer.record(k, 1)
        both = mixer.counts[0] + mixer.counts[1]
        # The two left share what they gave at 0.5 : 0.3, within one document.
        assert abs(mixer.counts[0] - w0 / (w0 + w1) * both) <= 1, mixer.counts
    assert mixer.counts[2] == retired


def test_counts_resume_where_a_snapshot_left_them():
    """A mixer rebuilt from its counts (a flush point) picks as the original does."""
    docs = lengths(3, 400)
    a = Mixer(WEIGHTS, "tokens")
    picks_a = []
    for length in docs:
        picks_a.append(a.choose([True, True, True]))
        a.record(picks_a[-1], length)
        if len(picks_a) == 150:
            b = Mixer(WEIGHTS, "tokens", a.counts)
    picks_b = []
    for length in docs[150:]:
        picks_b.append(b.choose([True, True, True]))
        b.record(picks_b[-1], length)
    assert picks_b == picks_a[150:]
