"""Re-enqueueing a finalized zombie below its retry limit, once, as the deployment inserts a job.

Before December 2023 nothing in the deployment re-ran a crashed job, so the
cleanup does (``crashed_retry_limit``). From then on the deployment's backfill
re-creates failed jobs itself from the cache's ``failed_runs``, and the cleanup
leaves it to it unless ``enqueue_retries`` says otherwise. A retry is a new
waiting job with the fields of the one it retries that its generation declares,
never a run's (``started_at``, ``last_heartbeat``, ``terminated_at`` ...), with the
``_id`` chosen at claim time (so it is never inserted twice) and the counters the
deployment increments on an insert.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Mapping

from bson import ObjectId
from pymongo.client_session import ClientSession

from zombie_pipeline.documents import (
    ID,
    RUN_FIELDS,
    CacheOutcome,
    Event,
    Job,
    RetryOutcome,
    Status,
    without_none,
)
from zombie_pipeline.events import READ_BATCH
from zombie_pipeline.finish_effects import SideCollections, after_insert
from zombie_pipeline.generations import QueueGeneration
from zombie_pipeline.mongo import on_index
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.store import Store


def enqueue_retries(
    store: Store,
    events: list[Mapping[str, Any]],
    policy: ZombiePolicy,
    side: SideCollections,
    now: dt.datetime,
    session: ClientSession | None = None,
) -> dict[Any, RetryOutcome]:
    """Re-enqueue the finished jobs of ``events`` (their cache outcome known) below their retry limit, once each.

    A retry already inserted by a pass that died (its ``_id`` is the event's) holds its
    ``unicity_id``: it is not inserted, nor counted, again.
    """
    outcomes = {event[ID]: retry_decision(event, policy, side.generation) for event in events}
    wanted = [event for event in events if outcomes[event[ID]] == RetryOutcome.ENQUEUED]
    queued = _queued_unicity_ids(store, wanted, session)
    new_jobs = []
    for event in wanted:
        holder = queued.get(event[Event.JOB][Job.UNICITY_ID])
        if holder is not None and holder != event[Event.RETRY_JOB_ID]:
            outcomes[event[ID]] = RetryOutcome.ALREADY_QUEUED
        elif holder is None:
            new_jobs.append(retry_job(event, side.generation, now))
            queued[event[Event.JOB][Job.UNICITY_ID]] = event[Event.RETRY_JOB_ID]  # one retry per unicity_id in a batch too
    if new_jobs:
        store.jobs.insert_many(new_jobs, ordered=False, session=session)
        after_insert(store, side, new_jobs, session)
    return outcomes


def retry_decision(event: Mapping[str, Any], policy: ZombiePolicy, generation: QueueGeneration) -> RetryOutcome:
    if not policy.retries_in(generation):
        return RetryOutcome.NOT_RETRIED  # the deployment's backfill re-creates it
    if event[Event.CACHE_OUTCOME] == CacheOutcome.SKIPPED_FRESHER:
        return RetryOutcome.NOT_RETRIED  # a newer result exists: nothing to redo
    if event.get(Event.FAILED_RUNS, 1) > policy.retry_limit_of(event[Event.ERROR_CODE]):
        return RetryOutcome.LIMIT_REACHED
    return RetryOutcome.ENQUEUED


def _queued_unicity_ids(store: Store, events: list[Mapping[str, Any]], session: ClientSession | None) -> dict[str, ObjectId]:
    """unicity_id -> _id of a waiting or started job that already holds it (our own retry included)."""
    if not events:
        return {}
    unicity_ids = sorted({event[Event.JOB][Job.UNICITY_ID] for event in events})
    pipeline = on_index(
        {Job.UNICITY_ID: {"$in": unicity_ids}},
        {Job.STATUS: {"$in": [Status.WAITING, Status.STARTED]}},
        {"$project": {Job.UNICITY_ID: 1}},
    )
    holders = store.jobs.aggregate(pipeline, batchSize=READ_BATCH, session=session)
    return {job[Job.UNICITY_ID]: job[ID] for job in holders}


def retry_job(event: Mapping[str, Any], generation: QueueGeneration, now: dt.datetime) -> dict[str, Any]:
    """A new waiting job with the declared fields of the one it retries, nothing of its run."""
    job = {name: value for name, value in event[Event.JOB].items() if name not in RUN_FIELDS and generation.declares(name)}
    return without_none({ID: event[Event.RETRY_JOB_ID], **job, Job.STATUS: Status.WAITING, Job.CREATED_AT: now})
