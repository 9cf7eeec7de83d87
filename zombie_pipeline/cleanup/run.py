"""A cleanup, step by step: the one flow that ``kill_zombies_job``'s ops and :func:`run_cleanup` both run.

1. :func:`prepare`: the policy's compensations are loaded (a broken one is refused
   before anything is written), the queue's and the cache's generations decided
   once, with their evidence (``queue.generations.decide``), the indexes our
   queries need created, and the overrides of job types the queue does not hold
   named.
2. :func:`reconcile`: what crashed runs left half done is taken over and
   completed, and the delayed retries that are due are enqueued.
3. :func:`find`: the zombies, by one indexed query (``detection``), with the
   malformed started jobs left alone, and the **brake** as a value: engaged when
   an implausible share of the started jobs look dead.
4. :func:`claim_and_finalize`: each zombie claimed in the audit trail, then finished as the
   queue's finish strategy says, by one :class:`~.finalizer.Finalizer`: the job
   and its cache error entry, the deployment's counters, rate limiter and locks,
   retries, the event completed.
5. :func:`compensate`: the actions that undo a zombie's partial side effects.
6. :func:`summarize`: the run's work, read back from the audit trail.

The steps pass a :class:`CleanupPlan` along (the run's options, policy and
generations), and keep their state in the database: a step retried, or a run
retried from its first step, starts from what the database holds.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from zombie_pipeline.cleanup import causes, compensations
from zombie_pipeline.cleanup.brake import brake_for
from zombie_pipeline.cleanup.detection import (
    Candidate,
    Detection,
    Malformed,
    detect,
    find_malformed_started,
    known_job_types,
)
from zombie_pipeline.cleanup.events import EventLog
from zombie_pipeline.cleanup.finalizer import Finalizer
from zombie_pipeline.cleanup.late_results import audit_late_results
from zombie_pipeline.cleanup.plan import CleanupOptions, CleanupPlan
from zombie_pipeline.cleanup.results import (
    Count,
    StepResult,
    cache_count,
    cause_count,
    cause_retry_count,
    finalized_row,
    reason_count,
    retry_count,
)
from zombie_pipeline.cleanup.retries import enqueue_due_retries
from zombie_pipeline.messages import counted, plural
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import CacheOutcome, Event, RetryOutcome
from zombie_pipeline.queue.evidence import Generations, decide
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.reasons import CAUSES, REASONS, Cause
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.trail import finalized_by_run, pending_retries


class BrakeEngaged(RuntimeError):
    """Too many started jobs look dead at once; nothing was written."""


class UnknownJobTypes(ValueError):
    """A run asked for job types the deployment has never had (a typo?): refused, with the known ones."""


@dataclass(frozen=True)
class Preparation:
    """What :func:`prepare` found, beside the plan: for the run's metadata and warnings."""

    plan: CleanupPlan
    compensations: tuple[str, ...]  # the names of the actions in force
    unknown_override_types: tuple[str, ...]  # max_duration_seconds_by_type names no job of the queue has (typos?)
    indexes_created: tuple[str, ...]


def prepare(store: Store, policy: ZombiePolicy, run_id: str, options: CleanupOptions = CleanupOptions()) -> Preparation:
    """Everything decided before the first write; a broken compensation raises ``CompensationError`` first, job types
    the deployment has never had :class:`UnknownJobTypes`."""
    actions = compensations.registry(policy)
    named = set(options.job_types or ()) | set(policy.max_duration_seconds_by_type)
    known = known_job_types(store.jobs, store.cache) if named else set()
    unknown = sorted(set(options.job_types or ()) - known)
    if unknown:
        raise UnknownJobTypes(
            f"job_types names types this deployment has never had: {unknown}; its types: {sorted(known) or 'none yet'}"
        )
    generations = decide(store, policy)
    created = store.ensure_indexes() if not options.dry_run and generations.queue is not None else []
    plan = CleanupPlan(run_id=run_id, policy=policy, options=options, generations=generations, started_at=utc_now())
    return Preparation(
        plan=plan,
        compensations=tuple(action.name for action in actions),
        unknown_override_types=tuple(sorted(set(policy.max_duration_seconds_by_type) - known)),
        indexes_created=tuple(created),
    )


def reconcile(store: Store, plan: CleanupPlan, now: dt.datetime | None = None) -> StepResult:
    """Complete the finalizations crashed runs left half done, and enqueue the delayed retries that are due.

    Each taken-over event is finished as the generation it records (its claim's), whatever the queue is now.
    """
    if plan.options.dry_run:
        return StepResult()
    now = now or utc_now()
    log = EventLog(store.events, plan.run_id, plan.policy)
    result = StepResult()
    taken = log.take_over_expired(now)
    if taken:
        result.merge(resume(store, plan))
    result.counts[Count.TAKEN_OVER] += taken
    result.counts.update(enqueue_due_retries(store, plan.policy, now))
    return result


def resume(store: Store, plan: CleanupPlan) -> StepResult:
    """Finalize every event the run holds claimed, each in the queue generation of its claim: those it took over, and
    its own that a pass left half done (a lost reply, an outage), judged from what the database holds."""
    log = EventLog(store.events, plan.run_id, plan.policy)
    actions = compensations.registry(plan.policy)
    result = StepResult()
    for name in log.claimed_generations():
        generation = QUEUE_GENERATIONS[name]
        finalizer = Finalizer.build(store, plan.run_id, plan.policy, generation, plan.generations.cache, actions)
        result.merge(finalizer.finalize())
    return result


def find(store: Store, plan: CleanupPlan, now: dt.datetime | None = None) -> Detection:
    """The zombies, each with its cause, and the malformed started jobs; the brake judged when there are zombies
    (unless overridden)."""
    job_types = plan.options.job_types
    detection = detect(store.jobs, plan.policy, now or utc_now(), job_types)
    detection.candidates = causes.judged(detection.candidates, store.events, plan.policy, detection.now)
    known = {item.id for item in detection.malformed}
    detection.malformed.extend(item for item in find_malformed_started(store.jobs, job_types) if item.id not in known)
    if detection.candidates and not plan.options.override_brake:
        detection.brake = brake_for(store.jobs, detection, plan.policy, job_types)
    return detection


def claim_and_finalize(
    store: Store, plan: CleanupPlan, candidates: list[Candidate], now: dt.datetime | None = None
) -> StepResult:
    """Claim the candidates, then finalize every claim of the run (an earlier attempt's too) as the queue's generation
    does (``GenerationUnknown`` when there are candidates and the queue is undecided). Every stamp is taken at the
    moment of its write, or at ``now`` when it is given (a replay's virtual time)."""
    if plan.options.dry_run or not candidates:
        return StepResult()
    actions = compensations.registry(plan.policy)
    generation = plan.generations.required_queue()
    clock = utc_now if now is None else lambda: now
    finalizer = Finalizer.build(store, plan.run_id, plan.policy, generation, plan.generations.cache, actions, clock)
    claims = finalizer.claim(candidates, clock())
    return StepResult(claims.counts).merge(finalizer.finalize(fresh=claims.ids))


def compensate(store: Store, plan: CleanupPlan) -> StepResult:
    """Run the pending compensations of every finalized zombie, this run's and the failed ones of earlier runs."""
    if plan.options.dry_run:
        return StepResult()
    return compensations.compensate(store, plan.policy, plan.run_id, compensations.registry(plan.policy))


def audit(store: Store, plan: CleanupPlan, now: dt.datetime | None = None) -> StepResult:
    """Look for life in the jobs finalized lately (``late_results``); a dry run writes nothing."""
    result = StepResult()
    if not plan.options.dry_run:
        result.counts[Count.LATE_RESULTS] = audit_late_results(store, plan.policy, now or utc_now(), plan.run_id)
    return result


# --- the whole cleanup in one call ---------------------------------------------------------------------


class Step(StrEnum):
    """The steps that take a moment (:data:`StepClock`)."""

    RECONCILE = "reconcile"
    FIND = "find"
    FINALIZE = "finalize"
    AUDIT = "audit"


#: The moment each step runs at, asked just before it, with the candidates found so far (``finalize``'s): a replay's
#: virtual clock, which brings its simulated workers up to that moment first. Without one, every step takes ``now``.
StepClock = Callable[[Step, Sequence[Candidate]], dt.datetime]


@dataclass
class CleanupReport:
    run_id: str
    dry_run: bool
    generations: Generations
    detection: Detection
    steps: StepResult = field(default_factory=StepResult)
    reconciled: StepResult = field(default_factory=StepResult)

    @property
    def counts(self) -> Counter[Any]:
        return self.steps.counts

    @property
    def malformed(self) -> list[Malformed]:
        return self.detection.malformed

    def candidate_rows(self) -> list[dict[str, Any]]:
        return [candidate.row() for candidate in self.detection.candidates]


def run_cleanup(
    store: Store,
    policy: ZombiePolicy,
    run_id: str,
    now: dt.datetime | None = None,
    job_types: Iterable[str] | None = None,
    dry_run: bool = False,
    override_brake: bool = False,
    clock: StepClock | None = None,
) -> CleanupReport:
    """The whole cleanup in one call: the steps of ``kill_zombies_job``'s ops, in their order, each at ``now`` (or the
    ``clock``'s moment for it; neither: the wall clock).

    Raises :class:`BrakeEngaged` where the find step's brake stops the run, and
    ``GenerationUnknown`` where zombies are found in a queue of undecided generation.
    """

    def at(step: Step, candidates: Sequence[Candidate] = ()) -> dt.datetime | None:
        return clock(step, candidates) if clock is not None else now

    options = CleanupOptions(dry_run, override_brake, tuple(job_types) if job_types is not None else None)
    plan = prepare(store, policy, run_id, options).plan
    reconciled = reconcile(store, plan, at(Step.RECONCILE))
    detection = find(store, plan, at(Step.FIND))
    if detection.brake is not None and detection.stopped_by_brake:
        raise BrakeEngaged(detection.brake.message())
    report = CleanupReport(run_id, dry_run, plan.generations, detection, reconciled=reconciled)
    report.steps.merge(claim_and_finalize(store, plan, detection.candidates, at(Step.FINALIZE, detection.candidates)))
    report.steps.merge(compensate(store, plan))
    report.steps.merge(audit(store, plan, at(Step.AUDIT)))
    return report


# --- the summary ------------------------------------------------------------------------------------------

#: Shown even when zero, so that a run's metadata always has the same keys (the UI plots them over runs).
SUMMARY_COUNTS = (
    Count.FINALIZED,
    Count.LOST_TO_LIVE_WORKER,
    cache_count(CacheOutcome.WRITTEN),
    cache_count(CacheOutcome.SKIPPED_FRESHER),
    retry_count(RetryOutcome.ENQUEUED),
    retry_count(RetryOutcome.SCHEDULED),
    retry_count(RetryOutcome.LIMIT_REACHED),
    retry_count(RetryOutcome.QUARANTINED),
    Count.DUE_RETRY_ENQUEUED,
    Count.DUE_RETRY_ALREADY_QUEUED,
    Count.COMPENSATION_DONE,
    Count.COMPENSATION_TO_RETRY,
    Count.COMPENSATION_FAILED,
    Count.LATE_RESULTS,
    Count.TERMINATED_ALONE_FREE,
    Count.TERMINATED_ALONE_CHARGED,
)


@dataclass
class RunSummary:
    """A run's work as the audit trail records it, plus the counts of the steps that left no event."""

    counts: Counter[Any]
    rows: list[dict[str, Any]]
    policy_source: str = ""  # where the run's policy came from (``policy.PolicySource.describe``)

    def one_line(self) -> str:
        c = self.counts
        reasons = ", ".join(f"{c[reason_count(reason)]} {reason.replace('_', ' ')}" for reason in REASONS)
        causes = ", ".join(f"{c[cause_count(cause)]} {cause.replace('_', ' ')}" for cause in CAUSES)
        lost, limited = c[Count.LOST_TO_LIVE_WORKER], c[retry_count(RetryOutcome.LIMIT_REACHED)]
        pending = c[Count.RETRIES_PENDING]
        line = (
            f"finalized {counted(c[Count.FINALIZED], 'zombie')} ({reasons}; by cause: {causes}); "
            f"{lost} lost to {plural(lost, 'a live worker', 'live workers')}; "
            f"{counted(c[cache_count(CacheOutcome.WRITTEN)], 'cache error')} written, "
            f"{c[cache_count(CacheOutcome.SKIPPED_FRESHER)]} kept as fresher; "
            f"{counted(c[retry_count(RetryOutcome.ENQUEUED)], 'retry')} enqueued, {self.scheduled()}, "
            f"{limited} at {plural(limited, 'its', 'their')} retry limit, "
            f"{c[retry_count(RetryOutcome.QUARANTINED)]} quarantined; "
            f"{counted(c[Count.DUE_RETRY_ENQUEUED], 'delayed retry')} enqueued, {pending} still waiting for "
            f"{plural(pending, 'its', 'their')} delay; compensations: {c[Count.COMPENSATION_DONE]} done, "
            f"{c[Count.COMPENSATION_TO_RETRY]} to try again, {c[Count.COMPENSATION_FAILED]} given up on; "
            f"{counted(c[Count.LATE_RESULTS], 'finalized job')} seen alive afterwards"
        )
        return line + (f"; policy: {self.policy_source}" if self.policy_source else "")

    def scheduled(self) -> str:
        """The retries scheduled after a delay, and why: a timeout's re-run waits until its own executor has stopped
        the job (``deployment_max_job_duration_seconds``); the others wait out ``retry_delay_seconds``."""
        scheduled = self.counts[retry_count(RetryOutcome.SCHEDULED)]
        timeouts = self.counts[cause_retry_count(Cause.TIMEOUT, RetryOutcome.SCHEDULED)]
        reasons = []
        if timeouts:
            reasons.append(
                f"{timeouts} {plural(timeouts, 'timeout')}: {plural(timeouts, 'its', 'their')} re-run waits until "
                f"the deployment's executor has stopped {plural(timeouts, 'it', 'them')} "
                "(deployment_max_job_duration_seconds + 90 s after the start)"
            )
        if scheduled - timeouts:
            reasons.append(f"{scheduled - timeouts} after retry_delay_seconds")
        return f"{scheduled} scheduled after a delay" + (f" ({'; '.join(reasons)})" if reasons else "")

    def markdown(self) -> str:
        """The one line, then the finalizations per type and cause (with their reason) and what became of their
        retries."""
        lines = [self.one_line(), "", "| type | cause | reason | finalized | re-enqueued |", "|---|---|---|---|---|"]
        finalized = Counter((row["type"], row["cause"], row["reason"]) for row in self.rows)
        enqueued = Counter(
            (row["type"], row["cause"], row["reason"]) for row in self.rows if row["retry"] == RetryOutcome.ENQUEUED
        )
        lines += [
            f"| `{job_type}` | {cause} | {reason} | {count} | {enqueued[(job_type, cause, reason)]} |"
            for (job_type, cause, reason), count in sorted(finalized.items())
        ]
        return "\n".join(lines)


def summarize(
    store: Store, run_id: str, step_counts: Mapping[str, int] | None = None, policy_source: str = ""
) -> RunSummary:
    """Counts and a table of every finalization this run drove, read back from the audit trail."""
    counts: Counter[Any] = Counter(step_counts or {})
    for name in SUMMARY_COUNTS:
        counts.setdefault(name, 0)
    counts[Count.RETRIES_PENDING] = pending_retries(store)
    for reason in REASONS:
        counts.setdefault(reason_count(reason), 0)
    for cause in CAUSES:
        counts.setdefault(cause_count(cause), 0)
    rows = []
    for event in finalized_by_run(store, run_id):
        row = finalized_row(event)
        row["cache"] = event.get(Event.CACHE_OUTCOME)
        row["retry"] = event.get(Event.RETRY_OUTCOME)
        row["effects"] = ", ".join(event.get(Event.EFFECTS) or [])
        rows.append(row)
    return RunSummary(counts=counts, rows=rows, policy_source=policy_source)
