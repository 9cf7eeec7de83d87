"""The suggested heartbeat timeout, on planted gap distributions: its bound and each candidate's mistakes against numpy."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.statistics.formatting import format_duration
from zombie_pipeline.statistics.gap_histogram import GapHistogram
from zombie_pipeline.statistics.gap_tallies import GapPeriod, GapTally
from zombie_pipeline.statistics.heartbeat_report import heartbeat_markdown, heartbeat_snippet
from zombie_pipeline.statistics.heartbeat_timeout import (
    HeartbeatTimeoutRules,
    gap_bound,
    suggest_heartbeat_timeout,
)
from zombie_pipeline.statistics.quantiles import upper_bound_index

END = dt.datetime(2024, 3, 8, tzinfo=dt.UTC)
RULES = HeartbeatTimeoutRules()  # p99.9 at 95 %, x 1.5, at least 2 heartbeat intervals


def jittered(rng: np.random.Generator, n: int) -> np.ndarray:
    """A minute apart, a few seconds late: a healthy fleet."""
    return 60 + rng.gamma(2.0, 2.0, n)


def stalling(rng: np.random.Generator, n: int) -> np.ndarray:
    """1.5 % of the heartbeats held up to nearly 7 minutes (a blocked event loop, a slow database)."""
    gaps = jittered(rng, n)
    stalls = rng.random(n) < 0.015
    gaps[stalls] = rng.uniform(60, 400, stalls.sum())
    return gaps


def lognormal(rng: np.random.Generator, n: int) -> np.ndarray:
    """A heavier tail, with no stall distinct from the jitter."""
    return 60 * rng.lognormal(0.0, 0.25, n)


DISTRIBUTIONS = {"jittered": jittered, "stalling": stalling, "lognormal": lognormal}


def period(gaps_by_row: dict[tuple[str, str], np.ndarray], finished: dict | None = None) -> GapPeriod:
    finished = finished or {}
    return GapPeriod(
        start=END - dt.timedelta(days=7),
        end=END,
        tallies={
            key: GapTally(gaps=GapHistogram.of(gaps.tolist()), finished=GapHistogram.of(finished.get(key, [])))
            for key, gaps in gaps_by_row.items()
        },
    )


def exact_upper_rank(n: int, quantile: float, level: float) -> int | None:
    """The textbook rank (from 1) of the one-sided upper bound: the smallest ``u`` with ``P(B <= u-1) >= level``,
    ``B ~ Binomial(n, quantile)``, summed over every count with ``math.lgamma``: nothing of the code under test."""
    k = np.arange(n + 1)
    log_pmf = (
        math.lgamma(n + 1)
        - np.array([math.lgamma(i + 1) + math.lgamma(n - i + 1) for i in k])
        + k * math.log(quantile)
        + (n - k) * math.log1p(-quantile)
    )
    cdf = np.cumsum(np.exp(log_pmf))
    ranks = np.nonzero(cdf[:n] >= level)[0]
    return int(ranks[0]) + 1 if len(ranks) else None


@pytest.mark.parametrize("name", DISTRIBUTIONS)
@pytest.mark.parametrize("n", [3_000, 20_000])
def test_the_bound_is_the_order_statistic_the_binomial_law_picks_read_at_or_above_numpys(name, n):
    gaps = DISTRIBUTIONS[name](np.random.default_rng(7), n)
    exact = np.sort(gaps)
    rank = exact_upper_rank(n, RULES.quantile, RULES.confidence)
    assert rank is not None

    bound = gap_bound(GapHistogram.of(gaps.tolist()), RULES.quantile, RULES.confidence)

    assert bound is not None
    assert exact[rank - 1] <= bound <= max(exact[rank - 1] * 1.022, exact[rank - 1] + 1.0)
    assert bound >= np.quantile(gaps, RULES.quantile, method="inverted_cdf")  # above the sample's own p99.9


def test_the_bound_covers_the_true_quantile_at_least_as_often_as_its_confidence():
    """Exponential gaps have a known p99.9 (-ln(0.001) x their mean): over 2,000 windows of 3,000 gaps the order
    statistic the rule picks lies at or above it in at least 95 % of them (within the sampling error)."""
    rng = np.random.default_rng(11)
    n, trials, mean = 3_000, 2_000, 60.0
    truth = -math.log(1 - RULES.quantile) * mean
    index = upper_bound_index(n, RULES.quantile, RULES.confidence)
    assert index is not None and index + 1 == exact_upper_rank(n, RULES.quantile, RULES.confidence)

    covered = np.mean([np.sort(rng.exponential(mean, n))[index] >= truth for _ in range(trials)])

    assert covered >= RULES.confidence - 3 * math.sqrt(0.05 * 0.95 / trials)


def test_fewer_gaps_than_a_bound_needs_give_none_and_keep_the_timeout():
    assert RULES.gaps_needed == 2_995 == exact_upper_rank(2_995, 0.999, 0.95)
    assert exact_upper_rank(2_994, 0.999, 0.95) is None
    gaps = jittered(np.random.default_rng(1), 2_994)

    suggestion = suggest_heartbeat_timeout(period({("/a", "light"): gaps}), ZombiePolicy(), deaths=10)

    assert suggestion.rows[0].bound is None and suggestion.point is None
    assert suggestion.suggested_seconds == 300 and not suggestion.lowering
    assert suggestion.flags[0] == (
        "not enough gaps: the most, `/a` on light's, are 2,994; an upper bound of the p99.9 at 95% needs 2,995: "
        "current timeout kept"
    )


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_each_candidates_mistakes_are_the_shares_numpy_finds_longer_than_it(name):
    rng = np.random.default_rng(3)
    light, heavy = DISTRIBUTIONS[name](rng, 12_000), DISTRIBUTIONS[name](rng, 4_000) * 1.2
    finished = {("/a", "light"): jittered(rng, 300).tolist(), ("/b", "heavy"): stalling(rng, 200).tolist()}
    every_gap = np.concatenate([light, heavy])
    every_finished = np.concatenate([finished[("/a", "light")], finished[("/b", "heavy")]])

    suggestion = suggest_heartbeat_timeout(
        period({("/a", "light"): light, ("/b", "heavy"): heavy}, finished), ZombiePolicy(), deaths=40
    )

    seconds = [candidate.seconds for candidate in suggestion.candidates]
    assert {60, 120, 180, 240, 300, suggestion.suggested_seconds} <= set(seconds)
    for candidate in suggestion.candidates:
        longer = np.count_nonzero(every_gap > candidate.seconds)
        assert candidate.gaps_longer == longer and candidate.gap_share == longer / len(every_gap)
        cut_short = np.count_nonzero(every_finished > candidate.seconds)
        assert candidate.finished_longer == cut_short and candidate.finished_share == cut_short / len(every_finished)
        shares = {
            "`/a` on light": np.mean(light > candidate.seconds),
            "`/b` on heavy": np.mean(heavy > candidate.seconds),
        }
        if max(shares.values()):
            assert candidate.worst_row is not None and shares[candidate.worst_row] == max(shares.values())
            assert candidate.worst_share == max(shares.values())
        else:
            assert candidate.worst_row is None
        assert candidate.saved_per_death == 300 - candidate.seconds
        assert candidate.saved_seconds == 40 * (300 - candidate.seconds)
        assert candidate.below_deployment == (candidate.seconds < 300)


def test_a_healthy_fleets_gaps_lower_the_timeout_to_their_bound_times_the_margin_flagged_below_the_deployments():
    gaps = jittered(np.random.default_rng(5), 20_000)
    bound = np.sort(gaps)[exact_upper_rank(20_000, 0.999, 0.95) - 1]  # type: ignore[operator]
    assert 75 < bound < 90  # so bound x 1.5 rounds up to 2 min, the floor of two one-minute heartbeats

    suggestion = suggest_heartbeat_timeout(period({("/a", "light"): gaps}), ZombiePolicy(), deaths=40)

    assert suggestion.point == suggestion.suggested_seconds == 120 and suggestion.lowering
    chosen = suggestion.candidate(120)
    assert chosen.gaps_longer == np.count_nonzero(gaps > 120) == 0
    assert (chosen.saved_per_death, chosen.saved_seconds) == (180, 7_200)
    assert suggestion.flags[0].startswith(
        "lower to 2 min (the p99.9 bound x 1.5 of `/a` on light): each death found 3 min sooner, 2 h over the "
        "window's 40 deaths; on the window's gaps it would have finalized 0 live ones"
    )
    assert suggestion.below_deployment and suggestion.flags[1].startswith(
        "2 min is below the deployment's own maxMissingHeartbeats x heartbeatIntervalSeconds (5 min)"
    )
    assert heartbeat_snippet(suggestion) == (
        "resources:\n  zombie_policy:\n    config:\n"
        "      heartbeat_timeout_seconds: 120  # 2 min, lowered from 5 min; below the deployment's own 5 min\n"
    )
    unknown = ZombiePolicy(deployment_max_missing_heartbeats=None)
    assert not suggest_heartbeat_timeout(period({("/a", "light"): gaps}), unknown, deaths=40).below_deployment


def test_stalls_in_the_tail_support_no_lower_timeout_and_the_current_one_is_kept():
    gaps = stalling(np.random.default_rng(5), 20_000)

    suggestion = suggest_heartbeat_timeout(period({("/a", "light"): gaps}), ZombiePolicy(), deaths=40)

    bound = suggestion.rows[0].bound
    assert bound is not None and bound > 300 / 1.5
    assert suggestion.point is not None and suggestion.point > 300
    assert suggestion.suggested_seconds == 300 and not suggestion.lowering
    assert suggestion.flags[0].startswith("the gaps support no lower timeout: the p99.9 bound x 1.5 of `/a` on light")
    assert "never seen complete" in suggestion.flags[0]
    assert heartbeat_snippet(suggestion) == "# No change: the heartbeat timeout stays at 5 min.\n"


def test_the_deployments_one_timeout_is_the_largest_need_and_a_row_too_small_to_bound_is_named_if_it_ran_longer():
    rng = np.random.default_rng(9)
    rows = {
        ("/fast", "light"): jittered(rng, 10_000),
        ("/slow", "heavy"): jittered(rng, 10_000) * 2.0,  # two-minute heartbeats, on the heavy workers
        ("/rare", "medium"): np.asarray([60.0] * 500 + [250.0]),
    }

    suggestion = suggest_heartbeat_timeout(period(rows), ZombiePolicy(heartbeat_timeout_seconds=600), deaths=5)

    needs = {row.name: row.need for row in suggestion.rows}
    assert needs["`/rare` on medium"] is None
    assert suggestion.point == needs["`/slow` on heavy"] == max(need for need in needs.values() if need is not None)
    assert suggestion.set_by == ["`/slow` on heavy"] and suggestion.suggested_seconds < 600
    assert needs["`/fast` on light"] is not None and needs["`/fast` on light"] < suggestion.point
    assert suggestion.suggested_seconds < 250
    assert (
        "`/rare` on medium has too few gaps for a bound (501), and 1 of them longer than "
        f"{format_duration(suggestion.suggested_seconds)}" in suggestion.flags
    )


def test_the_report_section_has_a_row_per_job_type_and_worker_size_and_a_row_per_candidate():
    rng = np.random.default_rng(2)
    gaps = {("/a", "light"): jittered(rng, 5_000), ("/b", "any"): jittered(rng, 100)}
    suggestion = suggest_heartbeat_timeout(period(gaps), ZombiePolicy(), deaths=3)

    lines = heartbeat_markdown(suggestion)

    assert lines[0].startswith("**Heartbeat timeout** (current 5 min, the deployment's own 5 × 1 min = 5 min)")
    rows = [line for line in lines if line.startswith("| `")]
    assert [row.split(" | ")[0] for row in rows] == ["| `/a` on light", "| `/b`"]  # no worker size told: the type
    assert "too few gaps" in rows[1]
    header = lines.index("| timeout | gaps longer | finished jobs cut short | worst | each death found |  |")
    candidates = lines[header + 2 : lines.index("", header)]
    assert suggestion.suggested_seconds == 150  # 5,000 gaps bound the p99.9 less tightly than 20,000: 1 min 22 s
    assert [line.split(" | ")[0] for line in candidates] == [
        "| 1 min",
        "| 2 min",
        "| 2 min 30 s (suggested)",
        "| 3 min",
        "| 4 min",
        "| 5 min (current, deployment's)",
    ]
    assert candidates[0].startswith("| 1 min | 5,100 (100%) | 0 (–) | ")
    assert candidates[2].endswith("| 2 min 30 s sooner | below the deployment's |")


def test_rules_out_of_bounds_are_refused_naming_each():
    with pytest.raises(ValueError, match="quantile=1.0: .*margin=0.5: "):
        HeartbeatTimeoutRules(quantile=1.0, margin=0.5)
