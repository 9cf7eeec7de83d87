"""Heartbeat gaps in buckets: exact counts above every whole-second timeout, order statistics bounded from above."""

from __future__ import annotations

import numpy as np
import pytest

from zombie_pipeline.statistics.gap_histogram import (
    EDGES_MS,
    OVERFLOW,
    GapHistogram,
    MalformedHistogram,
    bucket_of,
    histogram_of,
)


def planted_gaps(seed: int = 0, n: int = 5_000) -> np.ndarray:
    """Heartbeats a minute apart, a few seconds late, and a tail of stalls up to ten minutes."""
    rng = np.random.default_rng(seed)
    gaps = 60 + rng.gamma(2.0, 2.0, n)
    stalls = rng.random(n) < 0.01
    gaps[stalls] = rng.uniform(60, 600, stalls.sum())
    return gaps


def test_every_whole_second_up_to_an_hour_is_an_edge_and_no_bucket_is_wider_than_about_two_percent():
    edges = np.asarray(EDGES_MS, dtype=np.int64)

    assert set(range(1_000, 3_600_001, 1_000)) <= set(EDGES_MS)
    assert set(range(3_600_000, 43_200_001, 60_000)) <= set(EDGES_MS)  # every readable value up to 12 hours
    assert np.all(np.diff(edges) > 0)
    assert (edges[1:] / edges[:-1]).max() < 1.03
    assert (edges[1:] / edges[:-1])[edges[1:] >= 500].max() < 1.022
    assert len(EDGES_MS) < 6_000


def test_a_gap_goes_to_the_bucket_of_the_smallest_edge_at_or_above_it():
    assert bucket_of(60.0) == 60_000  # Prometheus' "le"
    assert bucket_of(60.0004) == 61_000
    assert bucket_of(59.97) == 60_000
    assert bucket_of(0.01) == EDGES_MS[0]
    assert bucket_of(8 * 86_400) == OVERFLOW


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_gaps_longer_than_any_whole_second_are_counted_exactly_as_numpy_counts_them(seed):
    gaps = planted_gaps(seed)
    histogram = GapHistogram.of(gaps.tolist())

    assert histogram.count == len(gaps)
    assert histogram.longest == gaps.max()
    assert histogram.total_seconds == pytest.approx(gaps.sum())
    for seconds in [*range(1, 700), 900, 1_800, 3_600]:
        assert histogram.longer_than(seconds) == np.count_nonzero(gaps > seconds), seconds
    bounds = (30.0, 60.0, 65.0, 300.0)
    assert histogram.at_or_below(bounds) == tuple(int(np.count_nonzero(gaps <= bound)) for bound in bounds)


@pytest.mark.parametrize("seed", [0, 1])
def test_an_order_statistic_is_read_at_or_above_the_exact_one_and_within_its_bucket(seed):
    gaps = planted_gaps(seed)
    exact = np.sort(gaps)
    histogram = GapHistogram.of(gaps.tolist())

    for rank in (1, 100, 2_500, 4_900, 4_990, 4_999, 5_000):
        read = histogram.order_statistic(rank)
        assert exact[rank - 1] <= read <= max(exact[rank - 1] * 1.022, exact[rank - 1] + 1.0), rank
    assert histogram.order_statistic(len(gaps)) == gaps.max()  # the longest is kept exactly
    with pytest.raises(ValueError):
        histogram.order_statistic(len(gaps) + 1)


def test_histograms_add_up_and_come_back_from_their_documents():
    gaps = planted_gaps(3)
    first, second = GapHistogram.of(gaps[:2_000].tolist()), GapHistogram.of(gaps[2_000:].tolist())
    whole = first + second

    assert whole.counts == GapHistogram.of(gaps.tolist()).counts and whole.longest == gaps.max()
    document = whole.as_document()
    assert all(key.isdigit() for key in document)  # edges in milliseconds, as text: field names MongoDB takes
    back = histogram_of(document, whole.total_seconds, whole.longest)
    assert back.counts == whole.counts and back.longest == whole.longest


def test_a_stored_key_off_the_grid_goes_to_the_edge_at_or_above_it_and_a_bad_one_is_refused():
    assert histogram_of({"60500": 2, "inf": 1}).counts == {61_000: 2, OVERFLOW: 1}
    for bad in ({"sixty": 1}, {"60000": -1}, {"60000": 1.5}, {"60000": True}, ["60000"]):
        with pytest.raises(MalformedHistogram):
            histogram_of(bad)
    with pytest.raises(MalformedHistogram):
        histogram_of({}, longest="a minute")
