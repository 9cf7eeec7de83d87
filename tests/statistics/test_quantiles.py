"""Percentiles, their distribution-free confidence interval, and the rounding of a suggestion."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zombie_pipeline.statistics.quantiles import (
    binomial_cdf,
    percentile_name,
    quantile_interval,
    readable_round_up,
)


@pytest.mark.parametrize("n", [1, 30, 299, 300, 5_000, 200_000])
@pytest.mark.parametrize("quantile", [0.5, 0.99])
def test_the_quantile_interval_reads_only_likely_counts_and_agrees_with_the_whole_binomial_law(n, quantile):
    cdf = binomial_cdf(n, quantile)[:n]  # every count
    low, high = np.nonzero(cdf <= 0.025)[0], np.nonzero(cdf >= 0.975)[0]

    assert quantile_interval(np.arange(n, dtype=np.float64), quantile, 0.95) == (
        float(low[-1]) if len(low) else None,
        float(high[0]) if len(high) else None,
    )


@pytest.mark.parametrize(
    ("seconds", "readable"),
    [
        (1, 30),
        (299.5, 300),
        (600, 600),
        (601, 660),
        (1200, 1200),
        (1200.0001, 1260),
        (1801, 2100),
        (7199, 7200),
        (7201, 8100),
        (43_201, 46_800),
    ],
)
def test_readable_rounding_goes_up_to_the_next_step_of_its_magnitude(seconds, readable):
    assert readable_round_up(seconds) == readable
    assert readable >= seconds and readable <= max(seconds * 1.17, 30)


def test_the_quantile_interval_comes_from_order_statistics():
    durations = np.arange(1, 101, dtype=np.float32)

    assert quantile_interval(durations, 0.5, 0.95) == (40.0, 61.0)  # the textbook X(40), X(61) for n = 100
    assert quantile_interval(np.arange(1, 31, dtype=np.float32), 0.99, 0.95) == (28.0, None)  # no upper bound yet
    assert quantile_interval(np.empty(0, dtype=np.float32), 0.99) == (None, None)
    low, high = quantile_interval(np.arange(1, 1001, dtype=np.float32), 0.99, 0.95)
    assert low < 990.01 < high


def test_binomial_cdf_matches_exact_sums():
    n, p = 20, 0.3
    exact = np.cumsum([math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)])

    assert binomial_cdf(n, p) == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize(("quantile", "name"), [(0.5, "p50"), (0.99, "p99"), (0.995, "p99.5")])
def test_percentiles_are_named_as_operators_read_them(quantile, name):
    assert percentile_name(quantile) == name
