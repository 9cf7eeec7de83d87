"""The suggested T2 of each job type: the rules, the censoring flag, the backtest, the report over a window."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.helpers import QUEUE_GENERATION
from tests.statistics.builders import NEXT_DAY, NOON, job, tally, week
from zombie_pipeline.policy import SuggestionRules, ZombiePolicy
from zombie_pipeline.queue.documents import Status
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.statistics.analysis import analyze, analyze_window, suggest

# --- suggestion rules ---------------------------------------------------------------------


def test_the_suggestion_is_the_quantile_times_the_margin_rounded_up():
    durations = list(range(1, 1001))  # p99 = 990.01 s, p90 = 900.1 s

    assert suggest("/a", tally(durations), 1200, 300).suggested_t2_seconds == 1500  # 1485.0 s -> 25 min
    assert (
        suggest("/a", tally(durations), 1200, 300, SuggestionRules(quantile=0.9)).suggested_t2_seconds == 1380
    )  # 1350.2 s -> 23 min
    assert (
        suggest("/a", tally(durations), 1200, 300, SuggestionRules(margin=2.0)).suggested_t2_seconds == 2100
    )  # 1980.0 s -> 35 min
    report = suggest("/a", tally(durations), 1200, 300)
    assert report.quantile_seconds == pytest.approx(990.01)
    assert report.change == "raise"


def test_the_suggestion_never_goes_below_the_heartbeat_timeout():
    report = suggest("/fast", tally([2.0] * 400), 1200, 300)

    assert report.suggested_t2_seconds == 300
    assert report.change == "lower"
    assert any("heartbeat" in flag for flag in report.flags)


def test_a_type_with_fewer_than_min_samples_keeps_its_current_t2():
    too_few = suggest("/rare", tally([5.0] * 29), 1800, 300)
    enough = suggest("/rare", tally([5.0] * 30), 1800, 300)

    assert (too_few.enough_data, too_few.suggested_t2_seconds, too_few.change) == (False, 1800, "keep")
    assert any("not enough data" in flag for flag in too_few.flags)
    assert (enough.enough_data, enough.suggested_t2_seconds) == (True, 1800)  # enough to judge, not to lower: see below
    assert enough.lowering_withheld
    assert suggest("/rare", tally([5.0] * 29), 1800, 300, SuggestionRules(min_samples=10)).enough_data


def test_many_jobs_stopped_make_the_suggestion_a_lower_bound_that_never_lowers_t2():
    successes = [
        float(value) for value in range(1, 401)
    ]  # p99 396.01 s x 1.5 -> 600 s; upper bound 400 s x 1.5 < 1200 s

    few = suggest("/a", tally(successes, error=[1200.0]), 1200, 300)  # 1 of 401 stopped: 0.25 % < 1 %
    many = suggest(
        "/a", tally(successes, error=[1200.0, 1250.0, 1210.0], stopped=[1300.0, 1350.0]), 1200, 300
    )  # 5 of 405
    audited_only = suggest("/a", tally(successes, stopped=[1300.0, 1400.0, 1500.0, 1600.0, 1700.0]), 1200, 300)

    assert not few.censored and few.suggested_t2_seconds == 600
    assert many.censored and many.stopped == 5 and many.stopped_share == pytest.approx(5 / 405)
    assert many.suggested_t2_seconds == 1200
    assert any("lower bound" in flag and "raise T2 and measure again" in flag for flag in many.flags)
    assert audited_only.censored
    assert suggest("/a", tally(successes, error=[1200.0]), 1200, 300, SuggestionRules(censored_fraction=0.002)).censored


def test_t2_is_lowered_only_once_the_quantiles_upper_bound_times_the_margin_is_below_it():
    short = [60.0] * 280  # p99 60 s x 1.5 -> 90 s -> the 300 s floor: the point estimate says lower

    too_few = suggest("/a", tally(short), 1200, 300)
    enough = suggest("/a", tally(short + [60.0] * 88), 1200, 300)  # 368 runs: the largest bounds the p99 at 95 %

    assert (too_few.suggested_t2_seconds, too_few.change, too_few.lowering_withheld) == (1200, "keep", True)
    assert "368 are needed (88 more)" in "; ".join(too_few.flags)
    assert (enough.suggested_t2_seconds, enough.change, enough.lowering_withheld) == (300, "lower", False)


def test_a_wide_interval_withholds_the_lowering_even_with_many_runs():
    durations = [100.0] * 396 + [900.0] * 4  # p99 108 s, but the upper bound is 900 s: x 1.5 = 1350 s >= 1200 s

    report = suggest("/a", tally(durations), 1200, 300)

    assert report.quantile_seconds == pytest.approx(108.0) and report.quantile_high_seconds == 900.0
    assert (report.suggested_t2_seconds, report.lowering_withheld) == (1200, True)
    assert any("upper bound (900 s) x 1.5 is not below the current T2 (1200 s)" in flag for flag in report.flags)


def test_raising_t2_needs_no_upper_bound():
    report = suggest("/a", tally([1000.0] * 40), 1200, 300)  # 40 runs: no upper bound, p99 x 1.5 = 1500 s

    assert report.quantile_high_seconds is None
    assert (report.suggested_t2_seconds, report.change, report.lowering_withheld) == (1500, "raise", False)


def test_errors_shorter_than_the_current_t2_are_not_counted_as_stopped():
    report = suggest("/a", tally([10.0] * 100, error=[30.0] * 50 + [1199.0]), 1200, 300)

    assert report.stopped == 0 and not report.censored


# --- backtest -------------------------------------------------------------------------------


def test_backtest_counts_successes_the_suggestion_would_kill_and_how_much_sooner_overruns_stop():
    successes = [float(value) for value in range(10, 1001, 10)]  # p90 = 901 s -> 960 s with margin 1
    rules = SuggestionRules(quantile=0.9, margin=1.0)

    report = suggest("/a", tally(successes, error=[30.0, 1200.0, 1500.0]), 1200, 300, rules)

    assert report.suggested_t2_seconds == 960
    assert report.backtest_successes_stopped == 4  # 970, 980, 990, 1000 s
    assert report.backtest_successes_stopped_share == pytest.approx(0.04)
    assert report.backtest_stopped_sooner == 2
    assert report.backtest_seconds_saved == pytest.approx((1200 - 960) + (1500 - 960))
    assert report.backtest_given_more_time == 0


def test_backtest_counts_stopped_jobs_a_higher_t2_would_have_let_run():
    successes = [float(value) for value in range(10, 1001, 10)]
    rules = SuggestionRules(quantile=0.9, margin=1.0)

    report = suggest("/a", tally(successes, error=[600.0, 700.0, 1500.0]), 600, 300, rules)

    assert (report.suggested_t2_seconds, report.change) == (960, "raise")
    assert report.stopped == 3
    assert report.backtest_given_more_time == 2
    assert (report.backtest_stopped_sooner, report.backtest_seconds_saved) == (1, pytest.approx(540.0))


# --- the report of a window -------------------------------------------------------------------


def test_types_configured_in_the_policy_appear_even_without_jobs():
    policy = ZombiePolicy(max_duration_seconds_by_type={"/unseen": 3600})

    report = analyze(week({"/a": tally([10.0] * 400)}), policy)

    assert [entry.job_type for entry in report.types] == ["/a", "/unseen"]
    unseen = report.type_report("/unseen")
    assert (unseen.enough_data, unseen.suggested_t2_seconds, unseen.statistics["count"]) == (False, 3600, 0)
    assert report.suggested_max_durations() == {"/a": 300}
    assert report.policy_max_durations() == {"/a": 300, "/unseen": 3600}


def test_analyze_window_reads_the_days_before_its_end(store):
    store.jobs.insert_many(
        [job("/a", Status.SUCCESS, 100, finished_at=NOON - dt.timedelta(days=days)) for days in (0, 1, 6, 8)]
    )

    report = analyze_window(store, QUEUE_GENERATIONS[QUEUE_GENERATION], ZombiePolicy(), end=NEXT_DAY, window_days=7)

    assert report.type_report("/a").statistics["count"] == 3
    assert report.window_start == NEXT_DAY - dt.timedelta(days=7)
