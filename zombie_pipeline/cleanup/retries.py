"""Re-enqueueing a finalized zombie below its retry limit, once, as the deployment inserts a job, at once or after a delay.

Before December 2023 nothing in the deployment re-ran a crashed job, so the
cleanup does (``crashed_retry_limit``). From then on the deployment's backfill
re-creates failed jobs itself from the cache's ``failed_runs``, and the cleanup
leaves it to it unless ``enqueue_retries`` says otherwise. A retry is a new
waiting job with the fields of the one it retries that its generation declares,
never a run's (``started_at``, ``last_heartbeat``, ``terminated_at`` ...), with the
``_id`` chosen at claim time (so it is never inserted twice) and the counters the
deployment increments on an insert. A retry found inserted by an earlier pass
is not counted again: its counters are in doubt, set from a recount before the
decision is recorded.

A job killed for its pod's size usually dies again if it runs again at once. With
``retry_delay_seconds``, a crashed job's retry waits (base × factor^(failed runs - 1),
capped, jittered) in our own ``zombieRetries``, and the first cleanup after it is
due enqueues it, unless a twin already waits or runs by then.

By cause (``causes``), at every generation where the deployment would not:

- a **deploy** death costs no run (``deploy_costs_failed_run`` off): re-enqueued at
  once, at the same difficulty and priority, in its place in the queue (its job's
  ``created_at``), whatever its failed runs (its entry kept them); a job SIGTERMed
  alone past its pair's free re-runs is a crash (``budget``);
- a **timeout** is re-run while its failed runs are at most ``exceeded_retry_limit``
  (1: once), at +20 difficulty (the deployment's ``DIFFICULTY_BONUS_BY_FAILED_RUNS``):
  the deployment's backfill never re-runs it. At once when its own executor has
  stopped it by then, else once it has (``deployment_max_job_duration_seconds`` after
  its start, + 90 s): with a T2 below the deployment's, the process it replaces runs
  on until then;
- a **crash** (or a job that never started) as before: below ``crashed_retry_limit``
  where the cleanup re-enqueues crashes at all;
- nothing of a quarantined (dataset, job type) (``quarantine``).
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from bson import ObjectId
from pymongo import UpdateOne
from pymongo.client_session import ClientSession
from pymongo.errors import BulkWriteError

from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.cleanup.counters import CountersInDoubt
from zombie_pipeline.cleanup.effects import DeploymentEffects
from zombie_pipeline.cleanup.results import Count
from zombie_pipeline.cleanup.side_collections import SideCollections
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import (
    CacheOutcome,
    Event,
    RetryDocument,
    RetryOutcome,
    ScheduledRetry,
    ScheduledState,
    ZombieEvent,
)
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS, QueueGeneration
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import (
    DIFFICULTY_BONUS_BY_FAILED_RUNS,
    DIFFICULTY_MAX,
    ID,
    KILL_LONG_JOB_CHECK_SECONDS,
    RUN_FIELDS,
    Job,
    JobDocument,
    Status,
    without_none,
)
from zombie_pipeline.queue.reasons import Cause
from zombie_pipeline.queue.store import READ_BATCH, Store, duplicate_indexes
from zombie_pipeline.queue.times import as_utc, truncate_ms, utc_now


@dataclass
class Retried:
    """A batch's retry decisions: per event, its outcome and when a delayed retry becomes due; the counters in doubt."""

    outcomes: dict[Any, tuple[RetryOutcome, dt.datetime | None]]
    in_doubt: CountersInDoubt = field(default_factory=CountersInDoubt)


@dataclass(frozen=True)
class Retries:
    """The retries of one cleanup's finalized zombies, inserted as the queue's generation inserts a job."""

    store: Store
    policy: ZombiePolicy
    effects: DeploymentEffects
    #: Whether this cleanup re-enqueues crashed jobs at all (the policy's, else the generation's default).
    enabled: bool

    def enqueue(
        self,
        events: Sequence[ZombieEvent],
        now: dt.datetime,
        session: ClientSession | None = None,
        quarantined: Collection[Any] = frozenset(),
    ) -> Retried:
        """Re-enqueue the finished jobs of ``events`` (their cache outcome known) as their cause says, once each;
        never the ``quarantined`` ones.

        A retry already inserted (or scheduled) by an earlier pass, under the
        ``_id`` chosen at claim time, is not inserted, nor counted, again: the
        counters its insert moves are returned in doubt.
        """
        generation = self.effects.side.generation
        outcomes: dict[Any, tuple[RetryOutcome, dt.datetime | None]] = {
            event[ID]: (retry_decision(event, self.policy, self.enabled, event[ID] in quarantined), None)
            for event in events
        }
        wanted = [event for event in events if outcomes[event[ID]][0] == RetryOutcome.ENQUEUED]
        queued = _queued_unicity_ids(self.store, [event[Event.JOB] for event in wanted], session)
        new_jobs: list[JobDocument] = []
        scheduled: list[RetryDocument] = []
        inserted_before: list[JobDocument] = []
        for event in wanted:
            holder = queued.get(event[Event.JOB][Job.UNICITY_ID])
            if holder is not None and holder != event[Event.RETRY_JOB_ID]:
                outcomes[event[ID]] = (RetryOutcome.ALREADY_QUEUED, None)
                continue
            queued[event[Event.JOB][Job.UNICITY_ID]] = event[Event.RETRY_JOB_ID]  # one retry per unicity_id in a batch
            due_at = self._due_at(event)
            if due_at is not None:
                outcomes[event[ID]] = (RetryOutcome.SCHEDULED, due_at)
                scheduled.append(scheduled_retry(event, generation, now, due_at))
            elif holder is None:
                new_jobs.append(retry_job(event, generation, now))
            else:
                inserted_before.append(event[Event.JOB])
        if new_jobs:
            self.store.jobs.insert_many(new_jobs, ordered=False, session=session)
            self.effects.after_insert(new_jobs, session)
        if scheduled:
            ids = [item[ID] for item in scheduled]
            present = {
                document[ID] for document in self.store.retries.find({ID: {"$in": ids}}, {ID: 1}, session=session)
            }
            fresh = [item for item in scheduled if item[ID] not in present]
            if fresh:
                self.store.retries.insert_many(fresh, ordered=False, session=session)
        return Retried(outcomes, self.effects.inserted_before(inserted_before))

    def _due_at(self, event: ZombieEvent) -> dt.datetime | None:
        """When the retry of ``event``'s job may run, or None for at once: a crash's after its delay; a timeout's once
        its own executor has stopped it (the policy's ``deployment_max_job_duration_seconds`` after its start); a deploy
        death's at once."""
        cause = cause_of_event(event)
        finalized_at = event[Event.FINALIZED_AT]
        if cause in DELAYED_CAUSES:
            delay = self.policy.retry_delay_of(event.get(Event.FAILED_RUNS, 1), _spread(event[ID]))
            return truncate_ms(finalized_at + dt.timedelta(seconds=delay)) if delay > 0 else None
        limit = self.policy.deployment_max_job_duration_seconds
        started_at = as_utc(event[Event.JOB].get(Job.STARTED_AT))
        if cause is not Cause.TIMEOUT or limit is None or started_at is None:
            return None
        stopped_by = started_at + dt.timedelta(seconds=limit + KILL_LONG_JOB_CHECK_SECONDS)
        return truncate_ms(stopped_by) if stopped_by > finalized_at else None


def _spread(event_id: Any) -> float:
    """Where in [-1, 1] the jitter of this event's delay falls: fixed by its id, so a redone pass picks the same."""
    return random.Random(str(event_id)).uniform(-1.0, 1.0)


def scheduled_retry(
    event: ZombieEvent, generation: QueueGeneration, now: dt.datetime, due_at: dt.datetime
) -> RetryDocument:
    """The retry of ``event``'s job, kept in our own collection until ``due_at``, when a cleanup enqueues it."""
    return {
        ID: event[Event.RETRY_JOB_ID],
        ScheduledRetry.JOB: retry_job(event, generation, now),
        ScheduledRetry.EVENT_ID: event[ID],
        ScheduledRetry.QUEUE_GENERATION: generation.name,
        ScheduledRetry.DUE_AT: due_at,
        ScheduledRetry.STATE: ScheduledState.PENDING,
    }


def enqueue_due_retries(store: Store, policy: ZombiePolicy, now: dt.datetime | None = None) -> Counter[Any]:
    """Insert the delayed retries that are due, once each, unless a twin already waits or runs; what was done.

    Two cleanups at once insert the same ``_id``: the server refuses the second,
    which does not count it. A run that dies after the insert leaves the retry
    pending; the next one finds its job by ``_id`` and only records the decision.
    """
    now = now or utc_now()
    counts: Counter[Any] = Counter()
    while True:
        due = list(
            store.retries.find({ScheduledRetry.STATE: ScheduledState.PENDING, ScheduledRetry.DUE_AT: {"$lte": now}})
            .sort(ScheduledRetry.DUE_AT, 1)
            .limit(policy.batch_size)
        )
        if not due:
            return counts
        decided: dict[Any, ScheduledState] = {}
        for name in sorted({item[ScheduledRetry.QUEUE_GENERATION] for item in due}):
            batch = [item for item in due if item[ScheduledRetry.QUEUE_GENERATION] == name]
            side = SideCollections.of(store, QUEUE_GENERATIONS[name])
            batch_decided, inserted, repaired = _enqueue_due(store, batch, DeploymentEffects(store, side), now)
            decided.update(batch_decided)
            counts[Count.DUE_RETRY_ENQUEUED] += inserted
            if repaired:
                counts[Count.COUNTERS_REPAIRED] += repaired
        store.retries.bulk_write(
            [
                UpdateOne(
                    {ID: item_id, ScheduledRetry.STATE: ScheduledState.PENDING},
                    {"$set": {ScheduledRetry.STATE: state, ScheduledRetry.DECIDED_AT: now}},
                )
                for item_id, state in decided.items()
            ],
            ordered=False,
        )
        counts[Count.DUE_RETRY_ALREADY_QUEUED] += sum(
            state == ScheduledState.ALREADY_QUEUED for state in decided.values()
        )


def _enqueue_due(
    store: Store, due: list[RetryDocument], effects: DeploymentEffects, now: dt.datetime
) -> tuple[dict[Any, ScheduledState], int, int]:
    """Each due retry's decision, how many jobs this call inserted (a retry inserted before is decided, not counted),
    and how many counters it set from a recount."""
    jobs: list[JobDocument] = [
        {**item[ScheduledRetry.JOB], Job.CREATED_AT: now} for item in due
    ]  # it joins the queue now, not when it was scheduled
    holders = _queued_unicity_ids(store, jobs, None)
    decided: dict[Any, ScheduledState] = {}
    to_insert: list[JobDocument] = []
    inserted_by_a_dead_pass: list[JobDocument] = []
    for item, job in zip(due, jobs):
        holder = holders.get(job[Job.UNICITY_ID])
        if holder is not None and holder != item[ID]:
            decided[item[ID]] = ScheduledState.ALREADY_QUEUED
        else:
            decided[item[ID]] = ScheduledState.ENQUEUED
            if holder is None:
                to_insert.append(job)
                holders[job[Job.UNICITY_ID]] = item[ID]
            else:
                inserted_by_a_dead_pass.append(job)
    # A pass that died after its insert may or may not have moved the counters: set them from a recount, before
    # the decision is recorded (a pass that dies here leaves the retry pending, and the next one does it again).
    repaired = counters.repair(store, effects.side, effects.inserted_before(inserted_by_a_dead_pass))
    if to_insert:
        try:
            store.jobs.insert_many(to_insert, ordered=False)
            inserted = to_insert
        except BulkWriteError as error:  # another cleanup inserted some first: theirs to count
            refused = duplicate_indexes(error)
            inserted = [job for index, job in enumerate(to_insert) if index not in refused]
        effects.after_insert(inserted)
        return decided, len(inserted), repaired
    return decided, 0, repaired


#: The causes whose retry waits ``retry_delay_seconds``: a worker that died of its job may die again at once.
DELAYED_CAUSES = frozenset({Cause.CRASH, Cause.NEVER_STARTED})


def retry_decision(event: ZombieEvent, policy: ZombiePolicy, enabled: bool, quarantined: bool = False) -> RetryOutcome:
    """Whether a finalized zombie runs again, by its cause; ``enabled``: whether this cleanup re-enqueues crashes."""
    if event[Event.CACHE_OUTCOME] == CacheOutcome.SKIPPED_FRESHER:
        return RetryOutcome.NOT_RETRIED  # a newer result exists: nothing to redo
    if quarantined:
        return RetryOutcome.QUARANTINED
    cause = cause_of_event(event)
    if cause in policy.costless_causes:
        return RetryOutcome.ENQUEUED  # the job did nothing wrong: at once, whatever its failed runs
    if cause == Cause.TIMEOUT:  # the deployment never re-runs it: at every generation
        if event.get(Event.FAILED_RUNS, 1) > policy.exceeded_retry_limit:
            return RetryOutcome.LIMIT_REACHED
        return RetryOutcome.ENQUEUED
    if not enabled:
        return RetryOutcome.NOT_RETRIED  # the deployment's backfill re-creates it
    if event.get(Event.FAILED_RUNS, 1) > policy.retry_limit_of(event[Event.ERROR_CODE]):
        return RetryOutcome.LIMIT_REACHED
    return RetryOutcome.ENQUEUED


def _queued_unicity_ids(
    store: Store, jobs: Sequence[JobDocument], session: ClientSession | None
) -> dict[str, ObjectId]:
    """unicity_id -> _id of a waiting or started job that already holds one of ``jobs``' (our own retry included)."""
    if not jobs:
        return {}
    unicity_ids = sorted({job[Job.UNICITY_ID] for job in jobs})
    pipeline = on_index(
        {Job.UNICITY_ID: {"$in": unicity_ids}},
        {Job.STATUS: {"$in": [Status.WAITING, Status.STARTED]}},
        {"$project": {Job.UNICITY_ID: 1}},
    )
    holders = store.jobs.aggregate(pipeline, batchSize=READ_BATCH, session=session)
    return {job[Job.UNICITY_ID]: job[ID] for job in holders}


def retry_job(event: ZombieEvent, generation: QueueGeneration, now: dt.datetime) -> JobDocument:
    """A new waiting job with the declared fields of the one it retries, nothing of its run; a timeout's at +20
    difficulty (up to the deployment's maximum), the others' at the same. A deploy death's keeps the ``created_at`` of
    the job it re-runs: the queue is served by priority, then by creation, so the re-runs of a wave go back where
    their jobs were, in their order, rather than behind every job that arrived meanwhile; the others join it now."""
    job = {
        name: value for name, value in event[Event.JOB].items() if name not in RUN_FIELDS and generation.declares(name)
    }
    cause = cause_of_event(event)
    difficulty = job.get(Job.DIFFICULTY)
    if cause == Cause.TIMEOUT and isinstance(difficulty, int) and not isinstance(difficulty, bool):
        job[Job.DIFFICULTY] = max(difficulty, min(difficulty + DIFFICULTY_BONUS_BY_FAILED_RUNS, DIFFICULTY_MAX))
    created_at = as_utc(event[Event.JOB].get(Job.CREATED_AT)) if cause == Cause.DEPLOY else None
    retry = {ID: event[Event.RETRY_JOB_ID], **job, Job.STATUS: Status.WAITING, Job.CREATED_AT: created_at or now}
    return cast(JobDocument, without_none(retry))
