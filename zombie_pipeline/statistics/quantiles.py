"""Percentiles, their confidence interval, and readable durations.

Percentiles are the linear interpolation between order statistics (pandas' and
numpy's default, Hyndman-Fan type 7). The interval of a quantile is
distribution-free, from order statistics and the binomial law.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: The percentiles every report shows, beside the mean and the maximum.
PERCENTILES = (0.50, 0.90, 0.95, 0.99)
DEFAULT_CONFIDENCE = 0.95
#: (upper bound in seconds, step in seconds) of :func:`readable_round_up`.
READABLE_STEPS = ((600, 30), (1_800, 60), (7_200, 300), (43_200, 900), (math.inf, 3_600))


def percentile_name(quantile: float) -> str:
    """``0.99`` -> ``"p99"``, ``0.995`` -> ``"p99.5"``."""
    return "p" + f"{quantile * 100:.4f}".rstrip("0").rstrip(".")


def success_statistics(durations: np.ndarray) -> dict[str, float | int | None]:
    """Count, mean, :data:`PERCENTILES` and max; None for each value when there are no durations."""
    values = pd.Series(durations, dtype="float64")
    names = [percentile_name(q) for q in PERCENTILES]
    if values.empty:
        return {"count": 0, "mean": None, **dict.fromkeys(names), "max": None}
    quantiles = values.quantile(list(PERCENTILES))
    return {
        "count": int(values.size),
        "mean": float(values.mean()),
        **{name: float(quantiles.loc[q]) for name, q in zip(names, PERCENTILES)},
        "max": float(values.max()),
    }


def binomial_cdf(n: int, p: float, counts: range | None = None) -> np.ndarray:
    """``P(B <= k)`` for ``k`` in ``counts`` (all of ``0..n`` by default), ``B ~ Binomial(n, p)``; log-space.

    Given a range that leaves out only tails of negligible mass
    (:func:`_likely_counts`), the probabilities are those within the range and
    cost its length rather than n: at a million durations, a few thousand.
    """
    counts = range(n + 1) if counts is None else counts
    k = np.arange(counts.start, counts.stop - 1, dtype=np.float64)
    steps = np.log(n - k) - np.log(k + 1) + math.log(p) - math.log1p(-p)
    log_pmf = np.concatenate([[0.0], np.cumsum(steps)])  # up to a constant: normalized below
    pmf = np.exp(log_pmf - log_pmf.max())
    cumulative: np.ndarray = np.minimum(np.cumsum(pmf) / pmf.sum(), 1.0)
    return cumulative


def _likely_counts(n: int, p: float) -> range:
    """The counts of ``Binomial(n, p)`` outside which lies less than 1e-30 of its mass.

    Thirteen standard deviations and 50 on each side of the mean: Bernstein's
    inequality bounds each tail by ``exp(-75)``.
    """
    spread = 13 * math.sqrt(n * p * (1 - p)) + 50
    return range(max(0, math.floor(n * p - spread)), min(n, math.ceil(n * p + spread)) + 1)


def quantile_interval(
    sorted_durations: np.ndarray, quantile: float, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float | None, float | None]:
    """A distribution-free confidence interval for a quantile, from order statistics.

    ``[X(l), X(u)]`` covers the true quantile with probability at least
    ``confidence``, the ranks chosen from the binomial law of how many
    durations fall below it. A side is None when the data cannot bound it
    (an upper bound for p99 needs a few hundred durations). Both ranks lie
    among the :func:`_likely_counts`, the only ones computed.
    """
    n = len(sorted_durations)
    if n == 0:
        return None, None
    alpha = 1.0 - confidence
    counts = _likely_counts(n, quantile)
    cdf = binomial_cdf(n, quantile, counts)  # P(fewer than k+1 durations below the quantile), k in counts
    ranks = np.arange(counts.start, counts.stop)
    low_ranks = ranks[(ranks < n) & (cdf <= alpha / 2)]  # l - 1 with P(B <= l-1) <= alpha/2
    low = float(sorted_durations[low_ranks[-1]]) if len(low_ranks) else None
    high_rank = _upper_rank(n, quantile, confidence)
    high = float(sorted_durations[high_rank]) if high_rank is not None else None
    return low, high


def _upper_rank(n: int, quantile: float, confidence: float) -> int | None:
    """The index (from 0) of the order statistic of ``n`` durations that bounds ``quantile`` from above, as the upper
    side of a two-sided interval at ``confidence``; None: none does."""
    return upper_bound_index(n, quantile, 1 - (1.0 - confidence) / 2)


def upper_bound_index(n: int, quantile: float, level: float) -> int | None:
    """The index (from 0) of the smallest order statistic of ``n`` values at or above the ``quantile`` with
    probability at least ``level`` (a one-sided upper bound); None: not even the largest is.

    The ``u``-th smallest value lies at or above the quantile when at most ``u - 1`` values fall below it: with
    ``B ~ Binomial(n, quantile)`` counting them, the index is ``u - 1``, the smallest with ``P(B <= u-1) >= level``.
    """
    counts = _likely_counts(n, quantile)
    cdf = binomial_cdf(n, quantile, counts)
    ranks = np.arange(counts.start, counts.stop)
    high_ranks = ranks[(ranks < n) & (cdf >= level)]
    return int(high_ranks[0]) if len(high_ranks) else None


def samples_for_upper_bound(quantile: float, level: float) -> int:
    """The fewest values whose largest one bounds ``quantile`` from above with probability ``level``: once
    ``quantile^n <= 1 - level`` (a one-sided bound of p99.9 at 95 %: 2,995 values)."""
    return math.ceil(math.log(1.0 - level) / math.log(quantile) - 1e-9)


#: Beyond this many runs, :func:`runs_for_upper_bound_below` gives up: no window of a deployment holds them.
MOST_RUNS = 10**9


def runs_for_upper_bound_below(
    share_below: float, quantile: float, confidence: float = DEFAULT_CONFIDENCE
) -> int | None:
    """About how many durations bound ``quantile`` from above below a limit, ``share_below`` of them lying below it.

    The durations to come are taken to look like the ones seen (``share_below`` of them below the limit):
    the upper bound of :func:`quantile_interval` is below the limit once the order statistic it picks is
    among them. The fewest such counts, found by doubling then halving; None when no count would do
    (``share_below`` not above ``quantile``), or only past :data:`MOST_RUNS`.
    """
    if share_below <= quantile:
        return None

    def enough(runs: int) -> bool:
        rank = _upper_rank(runs, quantile, confidence)
        return rank is not None and rank + 1 <= runs * share_below

    low = runs_for_upper_bound(quantile, confidence) - 1  # fewer runs have no upper bound at all
    high = low + 1
    while not enough(high):
        low, high = high, high * 2
        if high > MOST_RUNS:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def runs_for_upper_bound(quantile: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The fewest durations whose largest one bounds ``quantile`` from above at ``confidence``.

    :func:`quantile_interval` has an upper side once ``P(all n below the quantile) = quantile^n``
    drops to ``(1 - confidence) / 2``: 368 durations for p99 at 95 %, 72 for p95.
    """
    return samples_for_upper_bound(quantile, 1 - (1.0 - confidence) / 2)


def readable_round_up(seconds: float) -> int:
    """Up to a value an operator reads at a glance, at most about 17 % above ``seconds``.

    Multiples of 30 s up to 10 min, of 1 min up to 30 min, of 5 min up to 2 h,
    of 15 min up to 12 h, then of 1 h. Decimal 1-2-5 steps would overshoot by
    up to 100 %, and durations are read in minutes anyway.
    """
    if seconds <= 0:
        return 0
    for upper, step in READABLE_STEPS:
        if seconds <= upper:
            return int(math.ceil(seconds / step - 1e-9) * step)
    raise AssertionError("unreachable: the last step has no upper bound")
