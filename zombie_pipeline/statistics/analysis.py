"""The suggested T2 of each job type, with the evidence an operator needs to trust it.

The configured quantile of the successful durations, times a safety margin,
rounded up to a readable value (:func:`~.quantiles.readable_round_up`), never
below the heartbeat timeout. Only successful durations are used: error
durations include the hangs a T2 is there to catch. Below ``min_samples``
successes the suggestion is "not enough data" and the current T2 stays.

Lowering only on evidence: a T2 too low kills healthy jobs, so the suggestion
is below the current T2 only when the quantile's upper confidence bound, times
the margin, is below it too; otherwise the current T2 stays and the flag says
how many more successful runs could justify lowering it. Raising needs no such
bound: a higher T2 kills no healthy job.

Censoring: when the jobs stopped at T2 are at least ``1 - quantile`` of the
jobs (by default), the true quantile may lie beyond T2: the suggestion is
flagged as a lower bound, never lowers T2, and the advice is to raise T2 and
measure again.

Backtest: how many of the window's successful jobs ran longer than the
suggested T2 (they would have been stopped), and for the stopped jobs, how many
would have been stopped sooner and how many seconds of worker time that saves
(or, for a higher T2, how many would have been given more time).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from zombie_pipeline.policy import SuggestionRules, ZombiePolicy
from zombie_pipeline.queue.documents import FINISHED_STATUSES, REASONS, utc
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.store import Store
from zombie_pipeline.statistics.quantiles import (
    percentile_name,
    quantile_interval,
    readable_round_up,
    runs_for_upper_bound,
    success_statistics,
)
from zombie_pipeline.statistics.sources import left_out_of_every_day, read_history
from zombie_pipeline.statistics.tallies import EMPTY_DURATIONS, READ_BATCH_SIZE, Period, Tally, combine

DEFAULT_WINDOW_DAYS = 7


@dataclass
class TypeReport:
    """Statistics, suggestion, backtest and flags of one job type over the window."""

    job_type: str
    statuses: dict[str, int]
    started: int
    statistics: dict[str, float | int | None]
    zombies: dict[str, int]
    current_t2_seconds: int
    suggested_t2_seconds: int
    enough_data: bool
    lowering_withheld: bool  # the data points lower, but not surely enough: the current T2 stays
    quantile_seconds: float | None
    quantile_low_seconds: float | None
    quantile_high_seconds: float | None
    stopped: int
    stopped_share: float | None
    censored: bool
    backtest_successes_stopped: int
    backtest_successes_stopped_share: float | None
    backtest_stopped_sooner: int
    backtest_seconds_saved: float
    backtest_given_more_time: int
    flags: list[str]
    success_durations: np.ndarray = field(repr=False, default_factory=lambda: EMPTY_DURATIONS)
    stopped_durations: np.ndarray = field(repr=False, default_factory=lambda: EMPTY_DURATIONS)

    @property
    def successes(self) -> int:
        return int(self.statistics["count"] or 0)

    @property
    def zombie_count(self) -> int:
        return sum(self.zombies.values())

    @property
    def zombie_rate(self) -> float | None:
        return self.zombie_count / self.started if self.started else None

    @property
    def change(self) -> str:
        """``keep``, ``raise`` or ``lower``: what the suggestion does to the current T2."""
        if self.suggested_t2_seconds > self.current_t2_seconds:
            return "raise"
        if self.suggested_t2_seconds < self.current_t2_seconds:
            return "lower"
        return "keep"

    def as_record(self, quantile: float) -> dict[str, Any]:
        """One flat row: the CSV line, the JSON entry."""
        q = percentile_name(quantile)
        return {
            "type": self.job_type,
            **{f"jobs_{status}": self.statuses.get(status, 0) for status in sorted(FINISHED_STATUSES)},
            "started": self.started,
            **{f"success_{name}": value for name, value in self.statistics.items()},
            **{f"zombies_{reason}": self.zombies.get(reason, 0) for reason in REASONS},
            "zombie_rate": self.zombie_rate,
            "current_t2_seconds": self.current_t2_seconds,
            "suggested_t2_seconds": self.suggested_t2_seconds,
            "change": self.change,
            "enough_data": self.enough_data,
            "lowering_withheld": self.lowering_withheld,
            f"{q}_seconds": self.quantile_seconds,
            f"{q}_low_seconds": self.quantile_low_seconds,
            f"{q}_high_seconds": self.quantile_high_seconds,
            "stopped": self.stopped,
            "stopped_share": self.stopped_share,
            "censored": self.censored,
            "backtest_successes_stopped": self.backtest_successes_stopped,
            "backtest_successes_stopped_share": self.backtest_successes_stopped_share,
            "backtest_stopped_sooner": self.backtest_stopped_sooner,
            "backtest_seconds_saved": self.backtest_seconds_saved,
            "backtest_given_more_time": self.backtest_given_more_time,
            "flags": "; ".join(self.flags),
        }


def suggest(
    job_type: str,
    tally: Tally,
    current_t2_seconds: int,
    heartbeat_timeout_seconds: int,
    rules: SuggestionRules = SuggestionRules(),
) -> TypeReport:
    """The suggested T2 of one type, with its evidence (see the module docstring for the rules)."""
    success = np.sort(tally.success)
    stopped = tally.stopped_at(current_t2_seconds)
    statistics = success_statistics(success)
    n = len(success)
    enough_data = n >= rules.min_samples
    q_value = float(pd.Series(success, dtype="float64").quantile(rules.quantile)) if n else None
    low, high = quantile_interval(success, rules.quantile, rules.confidence)
    stopped_share = len(stopped) / (n + len(stopped)) if n + len(stopped) else None
    censored = stopped_share is not None and bool(len(stopped)) and stopped_share >= rules.censoring_threshold
    flags = []
    lowering_withheld = False
    if enough_data and q_value is not None:  # enough data: at least one success
        suggested = max(readable_round_up(q_value * rules.margin), heartbeat_timeout_seconds)
        if suggested == heartbeat_timeout_seconds:
            flags.append("at the heartbeat-timeout floor")
        if suggested < current_t2_seconds and (high is None or high * rules.margin >= current_t2_seconds):
            flags.append(_withheld(high, n, current_t2_seconds, rules))
            suggested, lowering_withheld = current_t2_seconds, True
        if censored and suggested < current_t2_seconds:
            suggested = current_t2_seconds  # a lower bound cannot justify cutting a tail we never saw
    else:
        suggested = current_t2_seconds
        flags.append(f"not enough data: {n} successful jobs, {rules.min_samples} needed; current T2 kept")
    if censored:
        flags.append(
            f"censored: {len(stopped)} jobs ({stopped_share:.1%}) were stopped at the current T2, their true "
            "durations unknown; the suggestion is a lower bound: raise T2 and measure again"
        )
    stopped_successes = int(np.count_nonzero(success > suggested))
    sooner = stopped[stopped > suggested]
    return TypeReport(
        job_type=job_type,
        statuses=dict(tally.statuses),
        started=tally.started,
        statistics=statistics,
        zombies=dict(tally.zombies),
        current_t2_seconds=int(current_t2_seconds),
        suggested_t2_seconds=int(suggested),
        enough_data=enough_data,
        lowering_withheld=lowering_withheld,
        quantile_seconds=q_value,
        quantile_low_seconds=low,
        quantile_high_seconds=high,
        stopped=int(len(stopped)),
        stopped_share=stopped_share,
        censored=censored,
        backtest_successes_stopped=stopped_successes,
        backtest_successes_stopped_share=stopped_successes / n if n else None,
        backtest_stopped_sooner=int(len(sooner)),
        backtest_seconds_saved=float(np.sum(sooner.astype(np.float64) - suggested)),
        backtest_given_more_time=int(np.count_nonzero(stopped <= suggested)) if suggested > current_t2_seconds else 0,
        flags=flags,
        success_durations=success,
        stopped_durations=np.sort(stopped),
    )


def _withheld(high: float | None, runs: int, current_t2_seconds: int, rules: SuggestionRules) -> str:
    """Why a lower T2 is not suggested yet, and what would change that."""
    name = percentile_name(rules.quantile)
    if high is None:
        needed = runs_for_upper_bound(rules.quantile, rules.confidence)
        return (
            f"lowering withheld: the {name} has no upper bound at {rules.confidence:.0%} with {runs} successful runs; "
            f"{needed} are needed ({needed - runs} more); current T2 kept"
        )
    return (
        f"lowering withheld: the {name}'s upper bound ({high:.0f} s) x {rules.margin:g} is not below the current T2 "
        f"({current_t2_seconds} s); more runs narrow the interval; current T2 kept"
    )


@dataclass
class DurationReport:
    """Everything a report shows about one window."""

    window_start: dt.datetime
    window_end: dt.datetime
    computed_at: dt.datetime
    rules: SuggestionRules
    heartbeat_timeout_seconds: int
    default_t2_seconds: int
    configured_t2_by_type: dict[str, int]
    types: list[TypeReport]
    bad_data: dict[str, int]
    missing_days: list[str] = field(default_factory=list)
    jobs_read: int = 0
    events_read: int = 0
    source: str = "jobs"  # tallies.SOURCES

    @property
    def days_expected(self) -> int:
        """Days the window spans."""
        return max(round((self.window_end - self.window_start).total_seconds() / 86_400), 1)

    @property
    def days_present(self) -> int:
        """Days of the window whose tallies were computed: the figures cover these only."""
        return max(self.days_expected - len(self.missing_days), 0)

    @property
    def complete(self) -> bool:
        return not self.missing_days

    def type_report(self, job_type: str) -> TypeReport:
        for report in self.types:
            if report.job_type == job_type:
                return report
        raise KeyError(job_type)

    def records(self) -> list[dict[str, Any]]:
        return [report.as_record(self.rules.quantile) for report in self.types]

    def statistics_frame(self) -> pd.DataFrame:
        """One row per job type: the table written to CSV (with its header even when empty)."""
        columns = list(suggest("", Tally(), 1, 1, self.rules).as_record(self.rules.quantile))
        return pd.DataFrame.from_records(self.records(), columns=columns)

    def suggested_max_durations(self) -> dict[str, int]:
        """T2 per type where the data was enough; other types keep their current T2."""
        return {report.job_type: report.suggested_t2_seconds for report in self.types if report.enough_data}

    def policy_max_durations(self) -> dict[str, int]:
        """The complete ``max_duration_seconds_by_type`` to configure: overrides kept, suggestions applied.

        The mapping replaces the configured one, so types without a suggestion keep their override.
        """
        return dict(sorted({**self.configured_t2_by_type, **self.suggested_max_durations()}.items()))


def analyze(
    period: Period,
    policy: ZombiePolicy,
    rules: SuggestionRules = SuggestionRules(),
    undated: Mapping[str, int] | None = None,
    missing_days: Sequence[str] = (),
    computed_at: dt.datetime | None = None,
) -> DurationReport:
    """Statistics and suggestions for every type seen in the period or configured in the policy."""
    job_types = sorted(set(period.tallies) | set(policy.max_duration_seconds_by_type))
    empty = Tally()
    return DurationReport(
        window_start=period.start,
        window_end=period.end,
        computed_at=computed_at or dt.datetime.now(dt.UTC),
        rules=rules,
        heartbeat_timeout_seconds=policy.heartbeat_timeout_seconds,
        default_t2_seconds=policy.max_duration_seconds,
        configured_t2_by_type=dict(policy.max_duration_seconds_by_type),
        types=[
            suggest(
                job_type,
                period.tallies.get(job_type, empty),
                policy.max_duration_of(job_type),
                policy.heartbeat_timeout_seconds,
                rules,
            )
            for job_type in job_types
        ],
        bad_data=dict(sorted((Counter(period.bad_data) + Counter(undated or {})).items())),
        missing_days=list(missing_days),
        jobs_read=period.jobs_read,
        events_read=period.events_read,
        source=period.source,
    )


def window_report(
    store: Store,
    generation: QueueGeneration,
    policy: ZombiePolicy,
    periods: Sequence[Period],
    start: dt.datetime,
    end: dt.datetime,
    rules: SuggestionRules = SuggestionRules(),
    missing_days: Sequence[str] = (),
) -> DurationReport:
    """The report of ``[start, end)`` from the periods of its days: the one rule, for the asset and a direct read."""
    period = combine(periods) if periods else Period(start=start, end=end)
    period.start, period.end = start, end
    undated = left_out_of_every_day(store, generation)
    return analyze(period, policy, rules, undated=undated, missing_days=missing_days)


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
