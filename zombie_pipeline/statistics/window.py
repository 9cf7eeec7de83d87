"""A window of days as the statistics read it: which days' tallies it takes, what it lacks, and its report.

The daily tallies of a window are taken when they were read from the databases as they are now (a simulation
dropped since is left out, and said); the days without them make the window partial, and the report says what
completes it. :func:`window_report` is the one rule for the report of ``[start, end)``, for the asset and for a
direct read (:func:`analyze_window`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from zombie_pipeline import config
from zombie_pipeline.cleanup.budget import spent_budgets
from zombie_pipeline.policy import SuggestionRules, ZombiePolicy
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc
from zombie_pipeline.statistics import DEFAULT_WINDOW_DAYS
from zombie_pipeline.statistics.analysis import DurationReport, analyze
from zombie_pipeline.statistics.formatting import day_ranges
from zombie_pipeline.statistics.gap_log import read_days
from zombie_pipeline.statistics.gap_tallies import GapPeriod
from zombie_pipeline.statistics.heartbeat_timeout import HeartbeatTimeoutRules, suggest_heartbeat_timeout
from zombie_pipeline.statistics.sources import left_out_of_every_day, read_history
from zombie_pipeline.statistics.tallies import READ_BATCH_SIZE, Period, combine
from zombie_pipeline.trail import causes_between, late_results_between


@dataclass(frozen=True)
class WindowTallies:
    """A window's daily tallies: those it takes, and the days it lacks."""

    loaded: list[Period]  # the tallies taken, in the window's order
    dropped: list[str]  # days whose tallies were read from a simulation dropped since: left out
    missing: list[str]  # days without tallies taken (not computed, or dropped)

    @classmethod
    def of(cls, by_day: Mapping[str, Period], wanted: Sequence[str], origin: object) -> WindowTallies:
        """``wanted``'s days from ``by_day``, keeping those read from the databases whose simulation is ``origin``."""
        dropped = [day for day in wanted if day in by_day and by_day[day].origin != origin]
        loaded = [by_day[day] for day in wanted if day in by_day and day not in dropped]
        missing = [day for day in wanted if day not in by_day or day in dropped]
        return cls(loaded, dropped, missing)

    def completing(self, first_day: str, tallies_asset: str) -> str:
        """What the window lacks, and what makes it complete: the days' tallies (``tallies_asset``), or nothing for
        days before the first daily partition, ``first_day``. Empty for a complete window."""
        never = [day for day in self.missing if day < first_day]
        later = [day for day in self.missing if day >= first_day]
        parts = []
        if later:
            parts.append(
                f"{day_ranges(later)} not computed yet: materialize {tallies_asset} for them, then this partition again"
            )
        if never:
            parts.append(
                f"{day_ranges(never)} before the first daily partition ({first_day}; {config.STATISTICS_START_ENV} "
                "moves it): this window cannot be complete"
            )
        return "; ".join(parts)


def window_report(
    store: Store,
    generation: QueueGeneration,
    policy: ZombiePolicy,
    periods: Sequence[Period],
    start: dt.datetime,
    end: dt.datetime,
    rules: SuggestionRules = SuggestionRules(),
    missing_days: Sequence[str] = (),
    gaps: GapPeriod | None = None,
    heartbeat_rules: HeartbeatTimeoutRules = HeartbeatTimeoutRules(),
) -> DurationReport:
    """The report of ``[start, end)`` from the periods of its days: the one rule, for the asset and a direct read.

    ``gaps``: the window's heartbeat gaps (the daily gap tallies combined); None: read from the gap log.
    """
    period = combine(periods) if periods else Period(start=start, end=end)
    period.start, period.end = start, end
    undated = left_out_of_every_day(store, generation)
    report = analyze(period, policy, rules, undated=undated, missing_days=missing_days)
    report.late_results = late_results_between(store, start, end)  # recorded after the days were tallied
    report.causes = causes_between(store, start, end)
    report.free_runs_spent = spent_budgets(store, start, end)
    gaps = gaps if gaps is not None else read_days(store.heartbeat_gaps, start, end)
    report.heartbeat = suggest_heartbeat_timeout(gaps, policy, report.heartbeat_deaths, heartbeat_rules)
    return report


def analyze_window(
    store: Store,
    generation: QueueGeneration,
    policy: ZombiePolicy,
    end: dt.datetime,
    window_days: float = DEFAULT_WINDOW_DAYS,
    rules: SuggestionRules = SuggestionRules(),
    batch_size: int = READ_BATCH_SIZE,
) -> DurationReport:
    """The ``window_days`` before ``end`` read in one pass, without Dagster: the same report as the asset's."""
    end = utc(end)
    start = end - dt.timedelta(days=window_days)
    return window_report(
        store, generation, policy, [read_history(store, generation, start, end, batch_size)], start, end, rules
    )
