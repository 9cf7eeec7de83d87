"""The suggested T2 of each job type: the rules, the censoring flag, the backtest, the report over a window."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from tests.helpers import QUEUE_GENERATION
from tests.statistics.builders import NEXT_DAY, NOON, job, tally, week
from zombie_pipeline.policy import SuggestionRules, ZombiePolicy
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import Status
from zombie_pipeline.statistics.analysis import CutShort, analyze, suggest
from zombie_pipeline.statistics.window import analyze_window

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


def test_runs_stopped_at_the_end_of_the_successes_tail_raise_t2_to_their_lower_bound_times_the_margin():
    successes = [float(value) for value in range(2, 802, 2)]  # the longest, 800 s x 1.5, needs the current T2

    few = suggest("/a", tally(successes, error=[1200.0]), 1200, 300)  # 1 of 401 stopped: 0.25 % < 1 %
    many = suggest("/a", tally(successes, error=[1200.0] * 3, stopped=[1300.0, 1350.0]), 1200, 300)  # 5 of 405

    assert not few.censored and few.suggested_t2_seconds == 1200  # p99 792 s x 1.5 -> 20 min: no change
    assert many.censored and many.stopped == 5 and many.stopped_share == pytest.approx(5 / 405)
    # p99 of the 405 runs, the stopped ones as long as they ran: 800 + 0.96 x (1200 - 800) = 1184 s; x 1.5 -> 30 min
    assert many.quantile_at_least_seconds == pytest.approx(1184.0)
    assert (many.suggested_t2_seconds, many.change, many.changes_t2) == (1800, "raise", True)
    assert "raise T2 to 30 min (the bound x 1.5) and measure again" in "; ".join(many.flags)
    assert many.backtest_given_more_time == 5
    assert suggest("/a", tally(successes, error=[1200.0]), 1200, 300, SuggestionRules(censored_fraction=0.002)).censored


def test_runs_stopped_long_after_every_success_look_like_hangs_and_keep_t2_whatever_their_share():
    successes = [float(value) for value in range(1, 401)]  # the longest, 400 s, is far from T2 / 1.5 = 800 s

    report = suggest("/a", tally(successes, error=[1200.0, 1250.0, 1210.0], stopped=[1300.0, 1350.0]), 1200, 300)

    assert report.censored and (report.suggested_t2_seconds, report.change) == (1200, "keep")  # never lowered either
    [flag] = report.flags
    assert "they look like hangs" in flag and "the longest ran 6 min 40 s" in flag
    were_they_work = (
        "counted as long as they ran, they make 19 min 28 s a lower bound of the p99, and T2 would need 30 min"
    )
    assert flag.endswith(f"Were they work, {were_they_work}")


def test_a_type_whose_t2_stops_its_runs_counts_the_stopped_ones_towards_min_samples():
    enough = suggest("/a", tally([1000.0] * 10, stopped=[1250.0] * 25), 1200, 300)
    too_few = suggest("/a", tally([1000.0] * 10, stopped=[1250.0] * 5), 1200, 300)

    assert enough.enough_data and (enough.suggested_t2_seconds, enough.change) == (2100, "raise")  # 1250 s x 1.5
    assert not too_few.enough_data and too_few.suggested_t2_seconds == 1200
    assert "15 runs, stopped ones included, 30 needed (15 more); current T2 kept" in too_few.flags[0]


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
    # 1 % of the runs at 900 s: however many more like these, the p99's upper bound stays there
    assert report.runs_to_lower is None and "runs like these never narrow it enough" in report.flags[0]


def test_a_withheld_lowering_says_about_how_many_runs_like_these_would_make_it():
    def durations(runs: int) -> list[float]:
        short = math.ceil(runs * 0.9925)  # 0.75 % of the runs at 900 s: the p99 is 100 s, its bound is wide
        return [100.0] * short + [900.0] * (runs - short)

    withheld = suggest("/a", tally(durations(400)), 1200, 300)
    needed = withheld.runs_to_lower

    assert withheld.lowering_withheld and needed is not None and needed > 400
    assert (
        f"about {needed:,} successful runs like these would narrow it enough ({needed - 400:,} more)"
        in (withheld.flags[0])
    )
    assert suggest("/a", tally(durations(needed)), 1200, 300).change == "lower"


def test_raising_t2_needs_no_upper_bound():
    report = suggest("/a", tally([1000.0] * 40), 1200, 300)  # 40 runs: no upper bound, p99 x 1.5 = 1500 s

    assert report.quantile_high_seconds is None
    assert (report.suggested_t2_seconds, report.change, report.lowering_withheld) == (1500, "raise", False)


def test_errors_shorter_than_the_current_t2_are_not_counted_as_stopped():
    report = suggest("/a", tally([10.0] * 100, error=[30.0] * 50 + [1199.0]), 1200, 300)

    assert report.stopped == 0 and not report.censored


def test_a_withheld_lowering_says_how_long_a_window_holds_the_runs_it_needs_at_the_windows_rate():
    short = tally([60.0] * 280)  # 40 a day over the week

    full = analyze(week({"/a": short}), ZombiePolicy()).type_report("/a")
    partial = analyze(week({"/a": short}), ZombiePolicy(), missing_days=["2024-02-28", "2024-02-29"]).type_report("/a")

    assert "lowering withheld: p99 x 1.5 points to 5 min (the heartbeat-timeout floor)" in full.flags[0]
    assert (
        "368 are needed (88 more: at 40 a day, a 10-day window would hold them; this one has 7 days)" in full.flags[0]
    )
    assert "368 are needed (88 more: at 56 a day, the 2 days this window lacks would bring them)" in partial.flags[0]


def test_not_enough_data_says_how_long_a_window_holds_enough():
    report = analyze(week({"/rare": tally([5.0] * 14)}), ZombiePolicy()).type_report("/rare")

    assert report.flags == [
        "not enough data: 14 successful runs, 30 needed (16 more: at 2 a day, a 15-day window would hold them; "
        "this one has 7 days); current T2 kept"
    ]


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
    # pytest.approx equals a float in a tuple too; mypy checks the tuple's items as if it did not
    assert (report.backtest_stopped_sooner, report.backtest_seconds_saved) == (1, pytest.approx(540.0))  # type: ignore[comparison-overlap]


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


# --- the deployment's one T2 for every type ------------------------------------------------------------------


def test_the_deployments_one_t2_is_the_largest_suggestion_and_names_the_runs_it_would_cut_short():
    policy = ZombiePolicy(max_duration_seconds_by_type={"/long": 3600})  # overrides: the deployment has none

    limit = analyze(
        week(
            {
                "/short": tally([10.0] * 400),  # 5 min: the heartbeat-timeout floor
                "/long": tally([1000.0] * 400),  # p99 1000 s x 1.5: 25 min
                "/rare": tally([900.0] * 3 + [2000.0] * 2),  # too few runs to size: 2 of them longer than 25 min
            }
        ),
        policy,
    ).deployment_limit

    assert limit is not None and (limit.current_seconds, limit.seconds, limit.set_by) == (1200, 1500, ["/long"])
    assert limit.cut_short == [CutShort("/rare", successes_longer=2, successes=5, enough_data=False)]
    assert (limit.without_enough_data, limit.censored) == (["/rare"], [])


def test_the_deployments_one_t2_is_lowered_only_when_the_evidence_lowers_every_type():
    sure = {"/a": tally([10.0] * 400), "/b": tally([150.0] * 400)}  # 5 min each, upper bounds well below 20 min

    lowered = analyze(week(sure), ZombiePolicy()).deployment_limit
    withheld = analyze(week({**sure, "/c": tally([10.0] * 280)}), ZombiePolicy()).deployment_limit  # no upper bound

    assert lowered is not None and (lowered.seconds, lowered.set_by, lowered.cut_short) == (300, ["/a", "/b"], [])
    assert withheld is not None and (withheld.seconds, withheld.set_by) == (1200, ["/c"])


def test_the_deployments_one_t2_is_none_without_a_type_of_enough_data():
    limit = analyze(week({"/rare": tally([5.0] * 10)}), ZombiePolicy()).deployment_limit

    assert limit is not None and (limit.seconds, limit.without_enough_data) == (None, ["/rare"])
