"""Finalizing zombies exactly once, never over a live worker, as the queue's generation finishes a job.

The audit collection is also the write-ahead log of a cleanup (:mod:`events`):

1. **claim**: insert one event per candidate, ``_id`` = the job's ``_id``, with
   the job as detection saw it and the queue generation it is finalized in.
   The unique ``_id`` makes the claim exclusive: of two concurrent cleanups,
   one insert fails and that cleanup leaves the job alone.
2. **finalize**, a batch of claims at a time, in the order the generation
   finishes a job:

   - jobs kept (before 2023-12): the job is set to ``error`` by compare-and-set
     (:mod:`finish`), then its cache error entry is written (:mod:`cache_errors`);
   - jobs deleted (2023-12 on), as the deployment kills a stuck job: claims of
     jobs a worker touched since detection are dropped, the cache error entry is
     written, then the job is deleted by compare-and-set; the deletion is the
     proof that the claim won.

   Around the finish, what the deployment does (:mod:`finish_effects`):
   counters, ``pastJobs`` and blockages, locks released. Then the retries where
   the generation wants them (:mod:`retries`), and each event is completed once,
   with every outcome: a zombie costs its claim, its job, its cache entry and
   that one completion (and its retry).
3. A pass that dies leaves its events claimed: the next run's **reconcile**
   takes them over and redoes the pass, which recognizes what was done (our
   stamp on a kept job, our entry beside a deleted one, the retry's ``_id``
   chosen at claim time) and never does it twice.

Every part works on a batch of ``policy.batch_size``: the database commands of
a cleanup grow with zombies / batch size, not with zombies, nor with job types.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from bson import ObjectId
from pymongo.client_session import ClientSession
from pymongo.errors import BulkWriteError

from zombie_pipeline.cleanup import compensations
from zombie_pipeline.cleanup.cache_errors import detect_cache_generation, write_batch
from zombie_pipeline.cleanup.detection import Candidate, Detection, brake_for, detect, find_malformed_started
from zombie_pipeline.cleanup.effects import SideCollections
from zombie_pipeline.cleanup.events import (
    StepResult,
    batched,
    drain,
    duplicate_indexes,
    lease_end,
    set_on_events,
    take_over_expired,
)
from zombie_pipeline.cleanup.retries import enqueue_due_retries, enqueue_retries, pending_retries
from zombie_pipeline.cleanup.strategies import Outcome, finish, sort_claims
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.documents import (
    ID,
    REASONS,
    Event,
    EventState,
    Job,
    RetryOutcome,
    ZombieEvent,
    as_utc,
    job_row,
    utc_now,
)
from zombie_pipeline.queue.generations import (
    QUEUE_GENERATIONS,
    CacheGeneration,
    QueueGeneration,
    QueueVerdict,
    detect_queue_generation,
)
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.transactions import atomically


class BrakeEngaged(RuntimeError):
    """Too many started jobs look dead at once; nothing was written."""


class GenerationUnknown(RuntimeError):
    """The queue's generation cannot be told from the database; nothing was written."""


def queue_verdict(store: Store, policy: ZombiePolicy) -> QueueVerdict:
    """Which generation the queue is (configured, or detected with its evidence)."""
    return detect_queue_generation(store.jobs.database, store.jobs.name, policy.queue_generation)


def required_generation(verdict: QueueVerdict) -> QueueGeneration:
    if verdict.generation is None:
        raise GenerationUnknown(verdict.problem)
    return verdict.generation


# --- claim ----------------------------------------------------------------------


def claim(
    store: Store, candidates: list[Candidate], policy: ZombiePolicy, run_id: str, now: dt.datetime, generation: QueueGeneration
) -> StepResult:
    """Record the intent to finalize each candidate; a job claimed by another cleanup is skipped."""
    result = StepResult()
    finalized_at = utc_now()
    for batch in batched(candidates, policy.batch_size):
        events = [_event_of(candidate, policy, run_id, finalized_at, now, generation) for candidate in batch]
        try:
            store.events.insert_many(events, ordered=False)
            result.counts["claimed"] += len(events)
        except BulkWriteError as error:
            refused = duplicate_indexes(error)
            result.counts["claimed"] += len(events) - len(refused)
            result.counts["claimed_by_another_cleanup"] += len(refused)
    return result


def _event_of(
    candidate: Candidate, policy: ZombiePolicy, run_id: str, finalized_at: dt.datetime, now: dt.datetime, generation: QueueGeneration
) -> dict[str, Any]:
    return {
        "_id": candidate.id,
        Event.JOB: candidate.job,
        Event.REASON: candidate.reason,
        Event.ERROR_CODE: candidate.error_code,
        Event.THRESHOLD_SECONDS: candidate.threshold_seconds,
        Event.PAST_MAX_DURATION: candidate.past_max_duration,
        Event.POLICY: policy.as_document(),
        Event.DETECTED_AT: candidate.detected_at,
        Event.FINALIZED_AT: finalized_at,
        Event.RUN_ID: run_id,
        Event.QUEUE_GENERATION: generation.name,
        Event.STATE: EventState.CLAIMED,
        Event.LEASE_OWNER: run_id,
        Event.LEASE_UNTIL: lease_end(now, policy),
        Event.RETRY_JOB_ID: ObjectId(),
    }


# --- finalize -------------------------------------------------------------------------


def finalize(
    store: Store, run_id: str, policy: ZombiePolicy, generation: QueueGeneration | None = None, recovering: bool = False
) -> StepResult:
    """Drive this run's claimed events to done, a batch at a time, as their generation finishes a job.

    ``generation``: the one this run claimed in; else every generation its events (taken over from
    crashed runs: ``recovering``) carry.
    """
    result = StepResult()
    for queue in [generation] if generation else _generations_of(store, run_id):
        side = SideCollections.of(store, queue)
        cache: CacheGeneration | None = None
        for events in drain(store, run_id, {Event.STATE: EventState.CLAIMED, Event.QUEUE_GENERATION: queue.name}, policy):
            cache = cache or detect_cache_generation(store, policy, queue)  # read once, and only when there is work
            result.counts[f"cache_generation:{cache.name}"] = 1
            result.merge(_finalize_batch(store, run_id, events, policy, side, cache, recovering))
    return result


def _finalize_batch(
    store: Store,
    run_id: str,
    events: list[ZombieEvent],
    policy: ZombiePolicy,
    side: SideCollections,
    cache: CacheGeneration,
    recovering: bool,
) -> StepResult:
    """One batch from claimed to done; each part is safe to redo, the events are written once, at the end."""
    queue_client, cache_client = store.jobs.database.client, store.cache.database.client

    def write_cache(finished: list[ZombieEvent]) -> dict[Any, dict[str, Any]]:
        return atomically(cache_client, lambda session: write_batch(store, finished, cache, policy, side.cache_metrics, session), policy.transactions)

    claims = sort_claims(store, events, side, recovering)
    if side.generation.cache_first:
        cached = write_cache(claims.to_finish + claims.done_before)
        outcome = atomically(queue_client, lambda session: finish(store, claims, side, session), policy.transactions)
    else:
        outcome = atomically(queue_client, lambda session: finish(store, claims, side, session), policy.transactions)
        cached = write_cache(outcome.finished)
    finished = [{**event, **cached[event[ID]]} for event in outcome.finished]
    now = utc_now()
    actions = compensations.registry(policy)

    def complete(session: ClientSession | None) -> dict[Any, RetryOutcome]:
        retried = enqueue_retries(store, finished, policy, side, now, session)
        done = {
            event[ID]: {
                Event.STATE: EventState.DONE,
                **cached[event[ID]],
                Event.EFFECTS: outcome.effects[event[ID]],
                Event.RETRY_OUTCOME: retried[event[ID]][0],
                **({Event.RETRY_DUE_AT: retried[event[ID]][1]} if retried[event[ID]][1] else {}),
                **compensations.pending_for(actions, event[Event.JOB][Job.TYPE]),
                Event.COMPLETED_AT: now,
            }
            for event in finished
        }
        set_on_events(store, run_id, done, session)
        if outcome.lost:  # the worker was alive after all: forget the claim, the job may be judged again later
            lost = [event[ID] for event in outcome.lost]
            store.events.delete_many({ID: {"$in": lost}, Event.LEASE_OWNER: run_id, Event.STATE: EventState.CLAIMED}, session=session)
        return {event_id: decision[0] for event_id, decision in retried.items()}

    retried = atomically(queue_client, complete, policy.transactions)
    return _result(outcome, cached, retried)


def _result(outcome: Outcome, cached: Mapping[Any, Mapping[str, Any]], retried: Mapping[Any, str]) -> StepResult:
    result = StepResult()
    result.counts["finalized"] += len(outcome.finished)
    result.counts["lost_to_live_worker"] += len(outcome.lost)
    for event in outcome.finished:
        result.counts[f"reason:{event[Event.REASON]}"] += 1
        result.counts[f"type:{event[Event.JOB][Job.TYPE]}"] += 1
        result.counts[f"cache_{cached[event[ID]][Event.CACHE_OUTCOME]}"] += 1
        result.counts[f"retry_{retried[event[ID]]}"] += 1
        result.counts.update(f"effect:{effect}" for effect in outcome.effects[event[ID]])
        result.rows.append(finalized_row(event))
    return result


def finalized_row(event: Mapping[str, Any]) -> dict[str, Any]:
    job = event[Event.JOB]
    return job_row(
        event[ID],
        job,
        reason=event[Event.REASON],
        threshold_seconds=event[Event.THRESHOLD_SECONDS],
        ran_seconds=round((event[Event.FINALIZED_AT] - as_utc(job[Job.STARTED_AT])).total_seconds(), 1),
    )


def _generations_of(store: Store, run_id: str) -> list[QueueGeneration]:
    names = store.events.distinct(Event.QUEUE_GENERATION, {Event.LEASE_OWNER: run_id, Event.STATE: EventState.CLAIMED})
    return [generation for name, generation in QUEUE_GENERATIONS.items() if name in names]


def finalize_zombies(
    store: Store, candidates: list[Candidate], policy: ZombiePolicy, run_id: str, now: dt.datetime, generation: QueueGeneration
) -> StepResult:
    """Claim the candidates, then finalize the ones claimed."""
    return claim(store, candidates, policy, run_id, now, generation).merge(finalize(store, run_id, policy, generation))


def reconcile(store: Store, run_id: str, policy: ZombiePolicy, now: dt.datetime | None = None) -> StepResult:
    """Complete what crashed runs left half done; runs first in every cleanup.

    Events left by a version that knew only early-2023 queues carry no
    generation: they are completed as that generation. Delayed retries that are
    due are enqueued here too.
    """
    taken = take_over_expired(store, run_id, now or utc_now(), policy)
    result = StepResult()
    if taken:
        result.merge(finalize(store, run_id, policy, recovering=True))
    result.counts["taken_over"] += taken
    result.counts.update(enqueue_due_retries(store, policy, now))
    return result


# --- the whole cleanup ----------------------------------------------------------------------


def find_zombies(
    store: Store,
    policy: ZombiePolicy,
    now: dt.datetime | None = None,
    job_types: Iterable[str] | None = None,
    override_brake: bool = False,
) -> Detection:
    """Detect, and refuse (raise BrakeEngaged) when the share of dead-looking jobs is implausible."""
    detection = detect(store.jobs, policy, now or utc_now(), job_types)
    known = {item.id for item in detection.malformed}
    detection.malformed.extend(item for item in find_malformed_started(store.jobs, job_types) if item.id not in known)
    if detection.candidates and not override_brake:
        brake = brake_for(store.jobs, detection, policy, job_types)
        if brake.engaged:
            raise BrakeEngaged(brake.message())
    return detection


@dataclass
class CleanupReport:
    run_id: str
    dry_run: bool
    verdict: QueueVerdict | None = None
    detection: Detection | None = None
    steps: StepResult = field(default_factory=StepResult)
    reconciled: StepResult = field(default_factory=StepResult)

    @property
    def counts(self) -> Counter:
        return self.steps.counts

    @property
    def malformed(self) -> list:
        return self.detection.malformed if self.detection else []

    def candidate_rows(self) -> list[dict[str, Any]]:
        return [candidate.evidence() for candidate in (self.detection.candidates if self.detection else [])]


def run_cleanup(
    store: Store,
    policy: ZombiePolicy,
    run_id: str,
    now: dt.datetime | None = None,
    job_types: Iterable[str] | None = None,
    dry_run: bool = False,
    override_brake: bool = False,
) -> CleanupReport:
    """The whole cleanup in one call: the steps of ``kill_zombies_job``'s ops, in their order."""
    job_types = list(job_types) if job_types is not None else None
    report = CleanupReport(run_id=run_id, dry_run=dry_run, verdict=queue_verdict(store, policy))
    actions = compensations.registry(policy)  # a broken action is refused before anything is written
    if not dry_run:
        report.reconciled = reconcile(store, run_id, policy, now)
    report.detection = find_zombies(store, policy, now, job_types, override_brake)
    if not dry_run and report.detection.candidates:
        generation = required_generation(report.verdict)
        report.steps.merge(finalize_zombies(store, report.detection.candidates, policy, run_id, now or utc_now(), generation))
    if not dry_run:
        report.steps.merge(compensations.compensate(store, policy, run_id, actions))
    return report


SUMMARY_COUNTS = (
    "finalized",
    "lost_to_live_worker",
    "cache_written",
    "cache_skipped_fresher",
    "retry_enqueued",
    "retry_scheduled",
    "retry_limit_reached",
    "due_retry_enqueued",
    "due_retry_already_queued",
    "compensation_done",
    "compensation_to_retry",
    "compensation_failed",
)


@dataclass
class RunSummary:
    """A run's work as the audit trail records it, plus the counts of the steps that left no event."""

    counts: Counter
    rows: list[dict[str, Any]]

    def one_line(self) -> str:
        c = self.counts
        reasons = ", ".join(f"{c[f'reason:{reason}']} {reason.replace('_', ' ')}" for reason in REASONS)
        return (
            f"finalized {c['finalized']} zombies ({reasons}); {c['lost_to_live_worker']} lost to live workers; "
            f"{c['cache_written']} cache errors written, {c['cache_skipped_fresher']} kept as fresher; "
            f"{c['retry_enqueued']} retries enqueued, {c['retry_scheduled']} scheduled after a delay, "
            f"{c['retry_limit_reached']} at their retry limit; {c['due_retry_enqueued']} delayed retries enqueued, "
            f"{c['retries_pending']} still waiting for their delay; compensations: {c['compensation_done']} done, "
            f"{c['compensation_to_retry']} to try again, {c['compensation_failed']} given up on"
        )

    def markdown(self) -> str:
        lines = [self.one_line(), "", "| reason | type | finalized |", "|---|---|---|"]
        by_pair = Counter((row["reason"], row["type"]) for row in self.rows)
        lines += [f"| {reason} | `{job_type}` | {count} |" for (reason, job_type), count in sorted(by_pair.items())]
        return "\n".join(lines)


def summarize_run(store: Store, run_id: str, step_counts: Mapping[str, int] | None = None) -> RunSummary:
    """Counts and a table of every finalization this run drove, read back from the audit trail."""
    counts: Counter = Counter(step_counts or {})
    for name in SUMMARY_COUNTS:
        counts.setdefault(name, 0)
    counts["retries_pending"] = pending_retries(store)
    for reason in REASONS:
        counts.setdefault(f"reason:{reason}", 0)
    rows = []
    query = {Event.LEASE_OWNER: run_id, Event.STATE: EventState.DONE}
    for event in store.events.find(query).sort(Event.FINALIZED_AT, 1):
        row = finalized_row(event)
        row["cache"] = event.get(Event.CACHE_OUTCOME)
        row["retry"] = event.get(Event.RETRY_OUTCOME)
        row["effects"] = ", ".join(event.get(Event.EFFECTS) or [])
        rows.append(row)
    return RunSummary(counts=counts, rows=rows)
