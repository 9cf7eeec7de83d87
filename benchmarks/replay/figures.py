"""What a contender did with one seed's trace, against the trace's ground truth (pooled over seeds by :mod:`.stats`).

**Detection time** of a zombie: its first finalization (any actor's: the job deleted, its dataset and user slot
free) minus its *true* death: the moment the process died (crash, never started), was killed at the end of its
SIGTERM grace period, or, for a hang, stopped making progress. Never the last heartbeat: a killer that waits long
after a death pays for it. A zombie never finalized waits forever (its detection time is infinite).

**Mistakes**, per 10,000 started jobs (those started in the scored window):

* *live jobs finalized*: finalized as dead (missing or no heartbeat, SIGTERM) while the process still ran (a pause
  of its executor's loop past the rule's timeout);
* *late results*: ... and the process then finished normally: its result comes after the error;
* *healthy runs stopped by T2*: a healthy run (a straggler included) stopped by ``kill_long_job`` or finalized as
  past its maximum duration by a cleanup;
* *finalized twice*: two finalizing writes of one job (two passes of the deployment that both read it, a killer
  then another, or a cleanup and then the job's own ``kill_long_job``, which writes its error whatever happened);
* *run twice at once*: finalized while its process still ran with an error the deployment re-runs (a dead reason:
  ``JobManagerCrashedError``), and the re-run could start at the backfill's next pass (every 2 h) before the first
  process stopped.

**Waste**: worker-hours of hung jobs from their onset until their process really stops (only ``kill_long_job`` or the
pod's death stop one).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from benchmarks.replay.trace import (
    Actor,
    Cause,
    Ending,
    Fate,
    Outcome,
    Trace,
    constant,
    lifecycle,
    moment,
)
from zombie_pipeline.policy import SuggestionRules, ZombiePolicy
from zombie_pipeline.queue.jobs import Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.statistics.analysis import DurationReport, analyze
from zombie_pipeline.statistics.tallies import Period, durations_array

#: Finalized as dead: the deployment writes JobManagerCrashedError, which its backfill re-runs.
DEAD_REASONS = frozenset({Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.TERMINATED})
DEATHS = (Cause.CRASH, Cause.NEVER_STARTED, Cause.SIGTERM)
CAUSES = (Cause.CRASH, Cause.SIGTERM, Cause.NEVER_STARTED, Cause.HANG)
#: Fleet sizes (pods alive at the death, all pools) over the chart's range, 18 to 170.
FLEET_BINS = (("18-39", 0, 39), ("40-79", 40, 79), ("80-119", 80, 119), ("120-170", 120, 10_000))
MISTAKES = ("live_finalized", "late_results", "healthy_stopped_by_t2", "finalized_twice", "run_twice_at_once")
ACTORS = tuple(Actor)
PER_RUNS = 10_000
BACKFILL_SECONDS = 7_200.0  # dataset-viewer's backfill cron, every 2 h in production


def fleet_bin(pods: int) -> int:
    return next(position for position, (_, low, high) in enumerate(FLEET_BINS) if low <= pods <= high)


def next_backfill(at: float) -> float:
    return math.ceil(at / BACKFILL_SECONDS) * BACKFILL_SECONDS


@dataclass
class SeedRecord:
    """One contender on one seed: every scored death (aligned across contenders of the same kill_long_job) and the
    mistakes' counts."""

    seed: int
    cause: np.ndarray  # index into CAUSES
    bin: np.ndarray  # index into FLEET_BINS
    detection: np.ndarray  # seconds; inf: never finalized
    actor: np.ndarray  # index into ACTORS of the first finalization; -1: none
    runs: int
    mistakes: dict[str, int] = field(default_factory=dict)
    hung_worker_hours: float = 0.0
    overdue_finalized: int = 0  # the cleanup's finalizations as past T2 (their cause: timeout)
    counts: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0


def seed_record(trace: Trace, outcome: Outcome, seed: int) -> SeedRecord:
    causes, bins, detections, actors = [], [], [], []
    mistakes: Counter[str] = Counter()
    hung = 0.0
    overdue = runs = 0
    for job in trace.jobs:
        life = lifecycle(job, outcome.max_duration)
        finals = sorted(
            (f for f in outcome.finalizations.get(job.index, ()) if f.at <= trace.horizon), key=lambda f: f.at
        )
        first = finals[0] if finals else None
        if life.cause is not None and life.zombie_since is not None and trace.start <= life.zombie_since < trace.end:
            causes.append(CAUSES.index(life.cause))
            bins.append(fleet_bin(trace.fleet_at(life.zombie_since)))
            detections.append(first.at - life.zombie_since if first is not None else math.inf)
            actors.append(ACTORS.index(first.actor) if first is not None else -1)
            if life.cause is Cause.HANG:
                hung += (min(life.process_end, trace.horizon) - life.zombie_since) / 3600.0
        if not trace.start <= job.start < trace.end:
            continue
        runs += 1
        overdue += sum(
            f.reason == Reason.EXCEEDED_MAX_DURATION and f.actor in (Actor.CLEANUP, Actor.WATCHER) for f in finals
        )
        if len(finals) >= 2:
            mistakes["finalized_twice"] += 1
        if job.fate in (Fate.HEALTHY, Fate.STRAGGLER):
            stopped = life.ending is Ending.KILL_LONG or (
                first is not None and first.reason == Reason.EXCEEDED_MAX_DURATION and first.at < job.natural_end
            )
            mistakes["healthy_stopped_by_t2"] += stopped
        if first is None or first.at >= life.process_end:
            continue
        if first.reason in DEAD_REASONS:  # finalized as dead while its process ran
            mistakes["live_finalized"] += 1
            if life.ending is Ending.FINISHED:
                mistakes["late_results"] += 1
            if next_backfill(first.at) < life.process_end:
                mistakes["run_twice_at_once"] += 1
    return SeedRecord(
        seed,
        np.asarray(causes, dtype=np.int8),
        np.asarray(bins, dtype=np.int8),
        np.asarray(detections, dtype=float),
        np.asarray(actors, dtype=np.int8),
        runs,
        {name: mistakes[name] for name in MISTAKES},
        hung,
        overdue,
        dict(outcome.counts),
        outcome.wall_seconds,
    )


# --- the T2s the statistics suggest ------------------------------------------------------------------------


def observed_period(trace: Trace, kill_long_job_seconds: float = 2400.0) -> Period:
    """The trace's tallies as the deployment would record them under the chart's maxJobDurationSeconds:
    successful durations, runs stopped at T2 as censored ones, dead runs as errors without a duration."""
    end = trace.end
    period = Period(start=moment(trace.begin), end=moment(end), source="replay trace")
    values: dict[str, dict[str, list[float]]] = {}
    for job in trace.jobs:
        if job.start >= end:
            continue
        life = lifecycle(job, constant(kill_long_job_seconds))
        if life.process_end > end:  # still running when the window closes: not in the window's tallies
            continue
        tally = period.tally(job.job_type)
        tally.started += 1
        lists = values.setdefault(job.job_type, {"success": [], "stopped": []})
        if life.ending is Ending.FINISHED:
            tally.statuses[Status.SUCCESS] += 1
            lists["success"].append(life.process_end - job.start)
        else:
            tally.statuses[Status.ERROR] += 1
            if life.ending is Ending.KILL_LONG:
                lists["stopped"].append(life.process_end - job.start)
                tally.zombies[Reason.EXCEEDED_MAX_DURATION] += 1
            else:
                tally.zombies[Reason.TERMINATED if life.ending is Ending.SIGTERM else Reason.MISSING_HEARTBEAT] += 1
        period.jobs_read += 1
    for job_type, lists in values.items():
        period.tallies[job_type].success = durations_array(lists["success"])
        period.tallies[job_type].stopped = durations_array(lists["stopped"])
    return period


def suggested_t2s(
    trace: Trace, policy: ZombiePolicy, rules: SuggestionRules = SuggestionRules()
) -> tuple[DurationReport, dict[str, int], int]:
    """``statistics.analysis.analyze`` on a trace of its own (the days before): the per-type T2 for the cleanup and
    one global value for kill_long_job, the largest per-type suggestion (every type's healthy runs must fit under one
    value; the report gives no global value of its own)."""
    report = analyze(observed_period(trace, policy.max_duration_seconds), policy, rules, computed_at=moment(trace.end))
    per_type = {entry.job_type: entry.suggested_t2_seconds for entry in report.types}
    return report, per_type, max(per_type.values(), default=policy.max_duration_seconds)
