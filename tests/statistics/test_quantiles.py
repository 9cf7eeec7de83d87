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
    runs_for_upper_bound,
    runs_for_upper_bound_below,
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
    assert low is not None and high is not None
    assert low < 990.01 < high


def test_binomial_cdf_matches_exact_sums():
    n, p = 20, 0.3
    exact = np.cumsum([math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)])

    assert binomial_cdf(n, p) == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize(("quantile", "name"), [(0.5, "p50"), (0.99, "p99"), (0.995, "p99.5")])
def test_percentiles_are_named_as_operators_read_them(quantile, name):
    assert percentile_name(quantile) == name


def test_runs_all_below_a_limit_bound_the_quantile_below_it_as_soon_as_it_has_an_upper_bound():
    assert runs_for_upper_bound(0.99) == 368 and runs_for_upper_bound(0.95) == 72
    assert runs_for_upper_bound_below(1.0, 0.99) == 368
    assert runs_for_upper_bound_below(1.0, 0.95) == 72


@pytest.mark.parametrize(("share_below", "quantile"), [(0.995, 0.99), (0.9999, 0.99), (0.95, 0.9), (0.6, 0.5)])
def test_the_runs_a_bound_below_a_limit_needs_are_the_fewest_whose_upper_bound_lies_below_it(share_below, quantile):
    def upper_bound(runs: int) -> float | None:  # runs with share_below of them at 1 s, the others at 1000 s
        below = math.ceil(runs * share_below)
        return quantile_interval(np.array([1.0] * below + [1000.0] * (runs - below)), quantile)[1]

    runs = runs_for_upper_bound_below(share_below, quantile)

    assert runs is not None and upper_bound(runs) == 1.0
    assert upper_bound(runs // 2) != 1.0


@pytest.mark.parametrize("share_below", [0.99, 0.5])
def test_no_number_of_runs_bounds_the_quantile_below_a_limit_that_too_few_of_them_stay_under(share_below):
    assert runs_for_upper_bound_below(share_below, 0.99) is None
