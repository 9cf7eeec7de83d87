"""The heartbeat timeout the observed gaps support: suggested as T2 is, with its evidence; applying it is the operator's.

A live job is finalized by mistake when one of its silences outlasts the timeout. From the gaps a watcher saw
(:mod:`.gap_observer`), per job type and worker size (a *row*):

- **The bound**: the gaps' ``quantile`` (p99.9) bounded from above, distribution-free. With ``n`` gaps, the
  ``u``-th shortest lies at or above the quantile unless ``u`` or more gaps fall below it, so with probability
  ``P(B <= u-1)``, ``B ~ Binomial(n, quantile)``; the smallest ``u`` where that reaches ``confidence`` (95 %)
  gives the bound, read as the upper edge of its bucket (never below the gap itself). The p99.9 has a bound from
  2,995 gaps on (its largest: ``0.999^n <= 5 %``).
- **A row's need**: the bound x ``margin`` (1.5), rounded up to a readable value, never below ``min_intervals``
  (2) heartbeat intervals (one late heartbeat is no death). The deployment has one timeout: the largest need of
  the rows with a bound, so every job type on every worker size gets at least its own.
- **Only lower**: gaps longer than the timeout in force are never seen complete (the job is finalized first,
  alive or dead), so the gaps can support a lower timeout, never a higher one. A need at or above the current
  timeout keeps it and says so; the late results count the live jobs the current one finalized.
- **The mistakes of each candidate**: the share of the observed gaps longer than it (a live job finalized for
  each), and the share of the finished jobs watched whole whose longest silence was longer (runs it would have
  cut short).
- **What it saves**: a dead job is found at its last heartbeat + the timeout, so a timeout lower by ``d`` finds
  each death ``d`` sooner: ``d`` x the window's deaths the heartbeat timeout decides (``missing_heartbeat``,
  ``never_heartbeated``).
- **Flagged**: a value below the deployment's own ``maxMissingHeartbeats x heartbeatIntervalSeconds``, at which its
  executors still take the job for alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.statistics.formatting import format_duration, format_rare_share
from zombie_pipeline.statistics.gap_histogram import GapHistogram
from zombie_pipeline.statistics.gap_tallies import GapPeriod, GapTally, row_name
from zombie_pipeline.statistics.quantiles import (
    percentile_name,
    readable_round_up,
    samples_for_upper_bound,
    upper_bound_index,
)

#: Candidates are the multiples of the heartbeat interval up to this many, beside the current, suggested and
#: deployment's values.
CANDIDATE_INTERVALS = 10


@dataclass(frozen=True)
class HeartbeatTimeoutRules:
    """How the suggestion is derived from the gaps (see the module docstring)."""

    quantile: float = 0.999
    confidence: float = 0.95
    margin: float = 1.5
    min_intervals: int = 2

    def __post_init__(self) -> None:
        problems = []
        if not 0.5 <= self.quantile < 1:
            problems.append(f"quantile={self.quantile!r}: should be at least 0.5 and below 1")
        if not 0 < self.confidence < 1:
            problems.append(f"confidence={self.confidence!r}: should lie between 0 and 1")
        if not 1 <= self.margin <= 10:
            problems.append(f"margin={self.margin!r}: should lie between 1 and 10")
        if self.min_intervals < 1:
            problems.append(f"min_intervals={self.min_intervals!r}: should be at least 1")
        if problems:
            raise ValueError("invalid heartbeat timeout rules: " + "; ".join(problems))

    @property
    def gaps_needed(self) -> int:
        """The fewest gaps that give the quantile an upper bound."""
        return samples_for_upper_bound(self.quantile, self.confidence)


def gap_bound(gaps: GapHistogram, quantile: float, confidence: float) -> float | None:
    """An upper bound of the gaps' ``quantile`` at ``confidence`` (see the module docstring); None: too few gaps."""
    if not gaps.count:
        return None
    index = upper_bound_index(gaps.count, quantile, confidence)
    return None if index is None else gaps.order_statistic(index + 1)


@dataclass(frozen=True)
class GapRow:
    """One job type on one worker size: its gaps, their bound, and the timeout they support."""

    job_type: str
    worker: str
    tally: GapTally = field(repr=False)
    bound: float | None
    need: int | None  # the bound x margin, readable, at least the floor; None: no bound

    @property
    def name(self) -> str:
        return row_name(self.job_type, self.worker)

    @property
    def gaps(self) -> int:
        return self.tally.gaps.count


@dataclass(frozen=True)
class Candidate:
    """What one timeout would have done over the window."""

    seconds: int
    gaps_longer: int  # observed gaps longer than it: a live job finalized each
    gap_share: float | None
    finished_longer: int  # finished jobs watched whole whose longest silence was longer: runs it would have cut short
    finished_share: float | None
    worst_row: str | None  # the row with the largest share of gaps longer
    worst_share: float | None
    saved_per_death: int  # seconds each death is found sooner than at the current timeout (negative: later)
    saved_seconds: int  # over the window's deaths
    below_deployment: bool


@dataclass(frozen=True)
class HeartbeatTimeoutSuggestion:
    """The heartbeat timeout the window's gaps support, with the evidence an operator needs to trust it."""

    rules: HeartbeatTimeoutRules
    current_seconds: int
    interval_seconds: int
    deployment_seconds: int | None  # maxMissingHeartbeats x heartbeatIntervalSeconds; None: not known
    rows: list[GapRow]
    point: int | None  # the largest need of the rows with a bound; None: no row has one
    set_by: list[str]
    suggested_seconds: int
    deaths: int
    candidates: list[Candidate]
    flags: list[str]
    ended_unseen: int
    unobserved: int
    malformed: int

    @property
    def gaps(self) -> int:
        return sum(row.gaps for row in self.rows)

    @property
    def lowering(self) -> bool:
        return self.suggested_seconds < self.current_seconds

    @property
    def below_deployment(self) -> bool:
        return self.deployment_seconds is not None and self.suggested_seconds < self.deployment_seconds

    def candidate(self, seconds: int) -> Candidate:
        return next(candidate for candidate in self.candidates if candidate.seconds == seconds)


def suggest_heartbeat_timeout(
    period: GapPeriod, policy: ZombiePolicy, deaths: int, rules: HeartbeatTimeoutRules = HeartbeatTimeoutRules()
) -> HeartbeatTimeoutSuggestion:
    """The suggestion for the window's gaps (``period``), against the policy's timeout in force; ``deaths``: the
    window's zombies whose detection the heartbeat timeout decides."""
    current, interval = policy.heartbeat_timeout_seconds, policy.heartbeat_interval_seconds
    deployment = policy.deployment_heartbeat_timeout_seconds()
    floor = rules.min_intervals * interval
    rows = []
    for (job_type, worker), tally in sorted(period.tallies.items()):
        bound = gap_bound(tally.gaps, rules.quantile, rules.confidence)
        need = max(readable_round_up(bound * rules.margin), floor) if bound is not None else None
        rows.append(GapRow(job_type, worker, tally, bound, need))
    needs = [row.need for row in rows if row.need is not None]
    point = max(needs) if needs else None
    suggested = point if point is not None and point < current else current
    values = {interval * k for k in range(1, CANDIDATE_INTERVALS + 1) if interval * k <= max(current, deployment or 0)}
    values |= {current, suggested} | ({point} if point is not None else set()) | ({deployment} if deployment else set())
    candidates = [_candidate(seconds, rows, current, deaths, deployment) for seconds in sorted(values)]
    suggestion = HeartbeatTimeoutSuggestion(
        rules=rules,
        current_seconds=current,
        interval_seconds=interval,
        deployment_seconds=deployment,
        rows=rows,
        point=point,
        set_by=[row.name for row in rows if row.need is not None and row.need == point],
        suggested_seconds=suggested,
        deaths=deaths,
        candidates=candidates,
        flags=[],
        ended_unseen=sum(row.tally.ended_unseen for row in rows),
        unobserved=sum(row.tally.unobserved for row in rows),
        malformed=period.malformed,
    )
    suggestion.flags.extend(_flags(suggestion))
    return suggestion


def _candidate(seconds: int, rows: list[GapRow], current: int, deaths: int, deployment: int | None) -> Candidate:
    gaps = sum(row.gaps for row in rows)
    longer = sum(row.tally.gaps.longer_than(seconds) for row in rows)
    finished = sum(row.tally.finished.count for row in rows)
    finished_longer = sum(row.tally.finished.longer_than(seconds) for row in rows)
    shares = [(row.tally.gaps.longer_than(seconds) / row.gaps, row.name) for row in rows if row.gaps]
    worst_share, worst_row = max(shares) if shares else (None, None)
    return Candidate(
        seconds=seconds,
        gaps_longer=longer,
        gap_share=longer / gaps if gaps else None,
        finished_longer=finished_longer,
        finished_share=finished_longer / finished if finished else None,
        worst_row=worst_row if worst_share else None,
        worst_share=worst_share if worst_share else None,
        saved_per_death=current - seconds,
        saved_seconds=(current - seconds) * deaths,
        below_deployment=deployment is not None and seconds < deployment,
    )


def _flags(suggestion: HeartbeatTimeoutSuggestion) -> list[str]:
    """What an operator should know; each flag that advises a change says to what, each that withholds one why."""
    rules, current = suggestion.rules, suggestion.current_seconds
    name, margin = percentile_name(rules.quantile), f"{rules.margin:g}"
    flags = []
    if not suggestion.rows:
        return ["no heartbeat gap observed in the window (no watcher ran, or no job did): current timeout kept"]
    if suggestion.point is None:
        largest = max(suggestion.rows, key=lambda row: row.gaps)
        flags.append(
            f"not enough gaps: the most, {largest.name}'s, are {largest.gaps:,}; an upper bound of the {name} at "
            f"{rules.confidence:.0%} needs {rules.gaps_needed:,}: current timeout kept"
        )
    elif suggestion.lowering:
        chosen = suggestion.candidate(suggestion.suggested_seconds)
        flags.append(
            f"lower to {format_duration(chosen.seconds)} (the {name} bound x {margin} of {', '.join(suggestion.set_by)}): "
            f"each death found {format_duration(chosen.saved_per_death)} sooner, "
            f"{format_duration(chosen.saved_seconds)} over the window's {suggestion.deaths} deaths; on the window's "
            f"gaps it would have finalized {chosen.gaps_longer} live ones ({format_rare_share(chosen.gap_share)} of "
            f"{suggestion.gaps:,} gaps)"
        )
    else:
        flags.append(
            f"the gaps support no lower timeout: the {name} bound x {margin} of {', '.join(suggestion.set_by)} comes to "
            f"{format_duration(suggestion.point)}; current timeout kept"
            + (
                ". Gaps longer than the timeout in force are never seen complete (the job is finalized first): "
                "the late results say whether it finalized live jobs"
                if suggestion.point > current
                else ""
            )
        )
    if suggestion.below_deployment and suggestion.deployment_seconds is not None:
        flags.append(
            f"{format_duration(suggestion.suggested_seconds)} is below the deployment's own maxMissingHeartbeats x "
            f"heartbeatIntervalSeconds ({format_duration(suggestion.deployment_seconds)}): its executors would still "
            "consider a job silent for between the two alive, so a live one finalized then runs on to a late result"
        )
    for row in suggestion.rows:
        longer = row.tally.gaps.longer_than(suggestion.suggested_seconds)
        if row.bound is None and longer:
            flags.append(
                f"{row.name} has too few gaps for a bound ({row.gaps:,}), and {longer} of them longer than "
                f"{format_duration(suggestion.suggested_seconds)}"
            )
    if suggestion.ended_unseen and suggestion.deployment_seconds is not None:
        flags.append(
            f"{_jobs(suggestion.ended_unseen)} left the started jobs after a silence of at least the deployment's "
            f"{format_duration(suggestion.deployment_seconds)} without a finalization of ours (the deployment's killer, "
            "or a live job's long silence): counted in neither"
        )
    if suggestion.unobserved:
        flags.append(
            f"{suggestion.unobserved} gaps ended while the watcher looked away too long to tell them (a slow read, "
            "an outage): left out"
        )
    return flags


def _jobs(count: int) -> str:
    return "1 job" if count == 1 else f"{count:,} jobs"
