"""The suggested T2 of each job type, with the evidence an operator needs to trust it.

Over 500 lines: the suggestion and each piece of its evidence (confidence, backtest, censoring, the deployment's
one limit) kept with it.

The configured quantile of the successful durations, times a safety margin,
rounded up to a readable value (:func:`~.quantiles.readable_round_up`), never
below the heartbeat timeout. Only successful durations are used: error
durations include the hangs a T2 is there to catch. Below ``min_samples``
successes the suggestion is "not enough data" and the current T2 stays.

Lowering only on evidence: a T2 too low kills healthy jobs, so the suggestion
is below the current T2 only when the quantile's upper confidence bound, times
the margin, is below it too; otherwise the current T2 stays and the flag says
how many successful runs like these would justify lowering it, and how many
days of them that is at the window's rate. Raising needs no such bound: a
higher T2 kills no healthy job.

Censoring: when the jobs stopped at T2 are at least ``1 - quantile`` of the
jobs (by default), the true quantile may lie beyond T2. Counting each stopped
job as long as it ran bounds the quantile from below; the suggestion is that
bound times the margin (never below the current T2): raise T2 to it and measure
again. A type whose T2 stops its runs counts them towards ``min_samples``: its
T2 is what keeps its successes few. Unless no success came near T2 (the
longest, times the margin, is below it): the stopped runs then look like hangs,
which T2 is there to stop, rather than a tail it cuts, and T2 stays; raising it
for them would only raise it again at every window.

Backtest: how many of the window's successful jobs ran longer than the
suggested T2 (they would have been stopped), and for the stopped jobs, how many
would have been stopped sooner and how many seconds of worker time that saves
(or, for a higher T2, how many would have been given more time).

The deployment's own workers apply one T2 to every job (``MAX_JOB_DURATION_SECONDS``):
:class:`DeploymentLimit` is the value the same rules support for all types at
once, and the runs it would still cut short.

Beside T2, the window's heartbeat gaps (a watcher's, :mod:`.gap_observer`) give the heartbeat
timeout they support (:mod:`.heartbeat_timeout`).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from zombie_pipeline.policy import SuggestionRules, ZombiePolicy
from zombie_pipeline.queue.jobs import FINISHED_STATUSES
from zombie_pipeline.queue.reasons import REASONS, Cause, Reason
from zombie_pipeline.statistics import DEFAULT_WINDOW_DAYS as DEFAULT_WINDOW_DAYS  # also read from here (the demo)
from zombie_pipeline.statistics.formatting import format_duration
from zombie_pipeline.statistics.heartbeat_timeout import (
    HeartbeatTimeoutSuggestion,
)
from zombie_pipeline.statistics.quantiles import (
    percentile_name,
    quantile_interval,
    readable_round_up,
    runs_for_upper_bound,
    runs_for_upper_bound_below,
    success_statistics,
)
from zombie_pipeline.statistics.tallies import EMPTY_DURATIONS, Period, Tally

DAY_SECONDS = 86_400
#: The reasons whose detection waits the heartbeat timeout (a SIGTERMed job's has a rule of its own).
HEARTBEAT_REASONS = (Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED)


def days_between(start: dt.datetime, end: dt.datetime) -> float:
    return (end - start).total_seconds() / DAY_SECONDS


@dataclass(frozen=True)
class WindowDays:
    """The days whose runs a window counts, of the days it spans: a type's runs a day, and the window that holds more."""

    counted: float
    spanned: int

    def when(self, runs_needed: int, runs: int) -> str:
        """When a window has ``runs_needed`` runs of a type that has ``runs`` in this one, at its rate: a longer
        window, or (a partial one) the days it lacks. Empty without runs to judge a rate by."""
        if runs <= 0 or self.counted <= 0:
            return ""
        rate = runs / self.counted
        days = math.ceil(runs_needed / rate - 1e-9)
        per_day = f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"
        if self.counted < self.spanned and days <= self.spanned:
            lacking = self.spanned - round(self.counted)
            return f"at {per_day} a day, the {lacking} days this window lacks would bring them"
        this_one = f"{self.spanned}" if self.counted >= self.spanned else f"{self.counted:g} of its {self.spanned}"
        return f"at {per_day} a day, a {days:,}-day window would hold them; this one has {this_one} days"


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
    enough_data: bool  # enough runs to suggest: min_samples successes, or runs counting the stopped where censored
    lowering_withheld: bool  # the data points lower, but not surely enough: the current T2 stays
    runs_to_lower: int | None  # withheld: about how many successful runs like these the lowering needs; None: none do
    quantile_seconds: float | None
    quantile_low_seconds: float | None
    quantile_high_seconds: float | None
    stopped: int
    stopped_share: float | None
    censored: bool
    quantile_at_least_seconds: float | None  # censored: the quantile with each stopped run counted as long as it ran
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
    def changes_t2(self) -> bool:
        """The suggestion is a T2 to configure: enough data, and not the current value."""
        return self.enough_data and self.suggested_t2_seconds != self.current_t2_seconds

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
            "runs_to_lower": self.runs_to_lower,
            f"{q}_seconds": self.quantile_seconds,
            f"{q}_low_seconds": self.quantile_low_seconds,
            f"{q}_high_seconds": self.quantile_high_seconds,
            "stopped": self.stopped,
            "stopped_share": self.stopped_share,
            "censored": self.censored,
            f"{q}_at_least_seconds": self.quantile_at_least_seconds,
            "backtest_successes_stopped": self.backtest_successes_stopped,
            "backtest_successes_stopped_share": self.backtest_successes_stopped_share,
            "backtest_stopped_sooner": self.backtest_stopped_sooner,
            "backtest_seconds_saved": self.backtest_seconds_saved,
            "backtest_given_more_time": self.backtest_given_more_time,
            "flags": "; ".join(self.flags),
        }


@dataclass(frozen=True)
class _Decision:
    """What the rules make of one type's runs against one current T2, before any wording."""

    suggested: int
    point: int | None  # where the quantile (or, censored, its lower bound) x margin points; None: not enough data
    enough_data: bool
    lowering_withheld: bool
    runs_to_lower: int | None
    quantile: float | None
    low: float | None
    high: float | None
    stopped_share: float | None
    censored: bool
    at_least: float | None
    hangs: bool  # censored, but no success came near T2: the stopped runs look like hangs, not a tail T2 cuts
    longest: float | None


def _quantile(durations: np.ndarray, quantile: float) -> float:
    return float(pd.Series(durations, dtype="float64").quantile(quantile))


def _decide(
    success: np.ndarray, stopped: np.ndarray, current: int, heartbeat_timeout: int, rules: SuggestionRules
) -> _Decision:
    """The rules of the module docstring, on sorted successful durations and the durations of the stopped runs."""
    n, k = len(success), len(stopped)
    stopped_share = k / (n + k) if n + k else None
    censored = stopped_share is not None and bool(k) and stopped_share >= rules.censoring_threshold
    longest = float(success[-1]) if n else None
    # The stopped runs continue the successes' tail when a success ran long enough to need the current T2 itself.
    hangs = censored and longest is not None and longest * rules.margin < current
    enough_data = n >= rules.min_samples or (censored and not hangs and n + k >= rules.min_samples)
    q_value = _quantile(success, rules.quantile) if n else None
    low, high = quantile_interval(success, rules.quantile, rules.confidence)
    at_least = _quantile(np.concatenate([success, stopped]), rules.quantile) if censored else None
    point, suggested, withheld, runs_to_lower = None, current, False, None
    if enough_data and at_least is not None:  # a lower bound never lowers T2, and hangs never raise it
        point = max(readable_round_up(at_least * rules.margin), heartbeat_timeout)
        suggested = current if hangs else max(point, current)
    elif enough_data and q_value is not None:
        point = suggested = max(readable_round_up(q_value * rules.margin), heartbeat_timeout)
        if point < current and (high is None or high * rules.margin >= current):
            suggested, withheld = current, True
            below = int(np.searchsorted(success, current / rules.margin, side="left")) / n
            runs = runs_for_upper_bound_below(below, rules.quantile, rules.confidence)
            runs_to_lower = max(runs, n + 1) if runs is not None else None
    return _Decision(
        suggested=suggested,
        point=point,
        enough_data=enough_data,
        lowering_withheld=withheld,
        runs_to_lower=runs_to_lower,
        quantile=q_value,
        low=low,
        high=high,
        stopped_share=stopped_share,
        censored=censored,
        at_least=at_least,
        hangs=hangs,
        longest=longest,
    )


def suggest(
    job_type: str,
    tally: Tally,
    current_t2_seconds: int,
    heartbeat_timeout_seconds: int,
    rules: SuggestionRules = SuggestionRules(),
    days: WindowDays | None = None,
) -> TypeReport:
    """The suggested T2 of one type, with its evidence (see the module docstring for the rules).

    ``days``: how many days the tally covers, for the flags to say how long a window holds the runs they need.
    """
    success = np.sort(tally.success)
    stopped = tally.stopped_at(current_t2_seconds)
    decision = _decide(success, stopped, current_t2_seconds, heartbeat_timeout_seconds, rules)
    suggested = decision.suggested
    n = len(success)
    stopped_successes = int(np.count_nonzero(success > suggested))
    sooner = stopped[stopped > suggested]
    return TypeReport(
        job_type=job_type,
        statuses=dict(tally.statuses),
        started=tally.started,
        statistics=success_statistics(success),
        zombies=dict(tally.zombies),
        current_t2_seconds=int(current_t2_seconds),
        suggested_t2_seconds=int(suggested),
        enough_data=decision.enough_data,
        lowering_withheld=decision.lowering_withheld,
        runs_to_lower=decision.runs_to_lower,
        quantile_seconds=decision.quantile,
        quantile_low_seconds=decision.low,
        quantile_high_seconds=decision.high,
        stopped=int(len(stopped)),
        stopped_share=decision.stopped_share,
        censored=decision.censored,
        quantile_at_least_seconds=decision.at_least,
        backtest_successes_stopped=stopped_successes,
        backtest_successes_stopped_share=stopped_successes / n if n else None,
        backtest_stopped_sooner=int(len(sooner)),
        backtest_seconds_saved=float(np.sum(sooner.astype(np.float64) - suggested)),
        backtest_given_more_time=int(np.count_nonzero(stopped <= suggested)) if suggested > current_t2_seconds else 0,
        flags=_flags(decision, n, len(stopped), current_t2_seconds, heartbeat_timeout_seconds, rules, days),
        success_durations=success,
        stopped_durations=np.sort(stopped),
    )


def _flags(
    decision: _Decision,
    runs: int,
    stopped: int,
    current: int,
    heartbeat_timeout: int,
    rules: SuggestionRules,
    days: WindowDays | None,
) -> list[str]:
    """What an operator should know of a suggestion; each one that advises a change says to what."""
    name, margin = percentile_name(rules.quantile), f"{rules.margin:g}"

    def when(needed: int, have: int) -> str:
        text = days.when(needed, have) if days is not None else ""
        return f": {text}" if text else ""

    flags = []
    if decision.censored and decision.at_least is not None:
        bound = (
            f"counted as long as they ran, they make {format_duration(decision.at_least)} a lower bound of the {name}"
        )
        flag = f"censored: {stopped} runs ({decision.stopped_share:.1%}) were stopped at the current T2"
        if decision.hangs and decision.longest is not None:
            flag += (
                f", but no successful run came near it (the longest ran {format_duration(decision.longest)}, under "
                f"T2 / {margin}): they look like hangs, which T2 is there to stop, not a tail it cuts; current T2 kept"
            )
            if decision.point is not None and decision.point > current:
                flag += f". Were they work, {bound}, and T2 would need {format_duration(decision.point)}"
        else:
            flag += f", their true durations unknown; {bound}"
            if not decision.enough_data:
                counted = runs + stopped
                flag += (
                    f"; {counted} runs, stopped ones included, {rules.min_samples} needed "
                    f"({rules.min_samples - counted} more{when(rules.min_samples, counted)}); current T2 kept"
                )
            elif decision.suggested > current:
                flag += f": raise T2 to {format_duration(decision.suggested)} (the bound x {margin}) and measure again"
            else:
                flag += f"; the current T2 covers it x {margin}: keep it and measure again"
        flags.append(flag)
    elif not decision.enough_data:
        flags.append(
            f"not enough data: {runs} successful runs, {rules.min_samples} needed "
            f"({rules.min_samples - runs} more{when(rules.min_samples, runs)}); current T2 kept"
        )
    elif decision.lowering_withheld and decision.point is not None:
        floor = " (the heartbeat-timeout floor)" if decision.point == heartbeat_timeout else ""
        flag = f"lowering withheld: {name} x {margin} points to {format_duration(decision.point)}{floor}, but "
        if decision.high is None:
            needed = runs_for_upper_bound(rules.quantile, rules.confidence)
            flag += (
                f"the {name} has no upper bound at {rules.confidence:.0%} with {runs} successful runs; "
                f"{needed} are needed ({needed - runs} more{when(needed, runs)})"
            )
        else:
            flag += (
                f"the {name}'s upper bound ({decision.high:.0f} s) x {margin} is not below the current T2 "
                f"({current} s); "
            )
            if decision.runs_to_lower is None:
                flag += f"runs like these never narrow it enough: too many of them ran {current / rules.margin:.0f} s or longer"
            else:
                needed = decision.runs_to_lower
                flag += (
                    f"about {needed:,} successful runs like these would narrow it enough "
                    f"({needed - runs:,} more{when(needed, runs)})"
                )
        flags.append(flag + "; current T2 kept")
    elif decision.suggested == heartbeat_timeout:
        flags.append("at the heartbeat-timeout floor")
    return flags


@dataclass(frozen=True)
class CutShort:
    """The runs of one type that a single T2 for every type would stop."""

    job_type: str
    successes_longer: int  # successful runs that ran longer than it
    successes: int
    enough_data: bool


@dataclass(frozen=True)
class DeploymentLimit:
    """The one T2 the deployment's workers apply to every job (``MAX_JOB_DURATION_SECONDS``, in ``kill_long_job``).

    The rules of :func:`suggest` for every type at once, each judged against the same current value: the
    largest suggestion of a type with enough data, so every type gets at least its own (lowered only when
    the evidence lowers them all), and the runs that value still stops.
    """

    current_seconds: int  # the policy's max_duration_seconds: the T2 of every type without an override
    seconds: int | None  # None: no type has enough data
    set_by: list[str]  # the types whose suggestion it is
    cut_short: list[CutShort]  # types with successful runs it would stop
    censored: list[str]  # types whose tail the current value cuts: their need is a lower bound, it may be short still
    without_enough_data: list[str]

    @classmethod
    def of(
        cls, types: Sequence[TypeReport], tallies: Mapping[str, Tally], policy: ZombiePolicy, rules: SuggestionRules
    ) -> DeploymentLimit:
        """The limit for the window's types, from their sorted successes (``types``) and their stopped runs."""
        current = policy.max_duration_seconds
        decisions = {
            entry.job_type: _decide(
                entry.success_durations,
                tallies.get(entry.job_type, Tally()).stopped_at(current),
                current,
                policy.heartbeat_timeout_seconds,
                rules,
            )
            for entry in types
        }
        needs = {job_type: decision.suggested for job_type, decision in decisions.items() if decision.enough_data}
        censored = [job_type for job_type, decision in decisions.items() if decision.censored and not decision.hangs]
        without_enough_data = [job_type for job_type in decisions if job_type not in needs]
        if not needs:
            return cls(current, None, [], [], censored, without_enough_data)
        seconds = max(needs.values())
        cut_short = []
        for entry in types:
            longer = len(entry.success_durations) - int(np.searchsorted(entry.success_durations, seconds, side="right"))
            if longer:
                cut_short.append(CutShort(entry.job_type, longer, entry.successes, entry.job_type in needs))
        return cls(
            current_seconds=current,
            seconds=seconds,
            set_by=[job_type for job_type, need in needs.items() if need == seconds],
            cut_short=cut_short,
            censored=censored,
            without_enough_data=without_enough_data,
        )


@dataclass(frozen=True)
class DetectionTimes:
    """How late the window's zombies of one reason were finalized (their events' ``detection_seconds``)."""

    reason: str
    zombies: int
    p50_seconds: float
    p99_seconds: float
    max_seconds: float

    @classmethod
    def of(cls, reason: str, seconds: np.ndarray) -> DetectionTimes:
        p50, p99 = (_quantile(seconds, quantile) for quantile in (0.5, 0.99))
        return cls(reason, len(seconds), round(p50, 1), round(p99, 1), round(float(seconds.max()), 1))


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
    deployment_limit: DeploymentLimit | None = None
    detection: list[DetectionTimes] = field(default_factory=list)  # per reason with recorded detection times
    late_results: dict[str, int] = field(default_factory=dict)  # job type -> finalized jobs seen alive afterwards
    causes: dict[str, dict[Cause, int]] = field(default_factory=dict)  # job type -> cause -> zombies finalized
    #: The (dataset, job type) pairs SIGTERMed alone past their free re-runs in the window (``cleanup.budget``), as rows.
    free_runs_spent: list[dict[str, Any]] = field(default_factory=list)
    heartbeat: HeartbeatTimeoutSuggestion | None = None  # the heartbeat timeout the window's gaps support

    @property
    def heartbeat_deaths(self) -> int:
        """The window's zombies whose detection the heartbeat timeout decides: they died silent."""
        return sum(entry.zombies.get(reason, 0) for entry in self.types for reason in HEARTBEAT_REASONS)

    @property
    def days_expected(self) -> int:
        """Days the window spans."""
        return max(round(days_between(self.window_start, self.window_end)), 1)

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
        """T2 per type where the data was enough, changed or not; other types keep their current T2."""
        return {report.job_type: report.suggested_t2_seconds for report in self.types if report.enough_data}

    def t2_changes(self) -> dict[str, int]:
        """The suggested T2 of the types whose T2 it changes: the ones to configure."""
        return {report.job_type: report.suggested_t2_seconds for report in self.types if report.changes_t2}

    def policy_max_durations(self) -> dict[str, int]:
        """The ``max_duration_seconds_by_type`` to configure: the changes, and the overrides they leave as they are.

        The mapping replaces the configured one, so an override left out would fall back to the default T2.
        Types at the default T2 that keep it are left out.
        """
        return dict(sorted({**self.configured_t2_by_type, **self.t2_changes()}.items()))


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
    spanned = days_between(period.start, period.end)
    days = WindowDays(counted=max(spanned - len(missing_days), 0.0), spanned=max(round(spanned), 1))
    types = [
        suggest(
            job_type,
            period.tallies.get(job_type, empty),
            policy.max_duration_of(job_type),
            policy.heartbeat_timeout_seconds,
            rules,
            days,
        )
        for job_type in job_types
    ]
    return DurationReport(
        window_start=period.start,
        window_end=period.end,
        computed_at=computed_at or dt.datetime.now(dt.UTC),
        rules=rules,
        heartbeat_timeout_seconds=policy.heartbeat_timeout_seconds,
        default_t2_seconds=policy.max_duration_seconds,
        configured_t2_by_type=dict(policy.max_duration_seconds_by_type),
        types=types,
        bad_data=dict(sorted((Counter(period.bad_data) + Counter(undated or {})).items())),
        missing_days=list(missing_days),
        jobs_read=period.jobs_read,
        events_read=period.events_read,
        source=period.source,
        deployment_limit=DeploymentLimit.of(types, period.tallies, policy, rules),
        detection=[
            DetectionTimes.of(reason, seconds) for reason, seconds in sorted(period.detection.items()) if len(seconds)
        ],
    )
