"""Finishing the claimed zombies as their queue's generation does, and never a job a worker still drives.

Before December 2023 a finished job is kept with status ``error`` and its
``finished_at``; from then on it is deleted. Either way the write is a
compare-and-set on what detection saw (still ``started``, same ``started_at``,
``last_heartbeat`` and ``terminated_at``): a worker that beat, finished or got
SIGTERM meanwhile wins, and the claim is forgotten. What the deployment does
around a finish (counters, rate limiter, locks: :mod:`finish_effects`) follows
for the jobs won, and each event records it.

Where the server has transactions, a batch's finish, its effects and its events
change together or not at all, and a worker's write in between makes the batch
start again. Without them, the writes follow one another; a finish found done by
an earlier attempt (our stamp on the job, or our error entry beside a job gone)
is recognized and its counters are left as they are.
"""

from __future__ import annotations

from typing import Any, Mapping

from pymongo import DeleteOne, UpdateOne
from pymongo.client_session import ClientSession

from zombie_pipeline.cache_entries import entries_of_jobs, key_of
from zombie_pipeline.cache_errors import written_for
from zombie_pipeline.detection import as_seen_filter, is_as_seen
from zombie_pipeline.documents import (
    ID,
    Cache,
    CacheOutcome,
    Event,
    EventState,
    Job,
    Status,
    as_utc,
    cache_key_of_job,
    job_row,
    utc_now,
)
from zombie_pipeline.events import READ_BATCH, StepResult, drain, set_on_events
from zombie_pipeline.finish_effects import Finished, SideCollections, after_finish
from zombie_pipeline.mongo import atomically
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.store import Store

_JOB_STATE = {Job.STATUS: 1, Job.FINISHED_AT: 1, Job.STARTED_AT: 1, Job.LAST_HEARTBEAT: 1, Job.TERMINATED_AT: 1}


def finish_jobs(
    store: Store, run_id: str, policy: ZombiePolicy, side: SideCollections, ready: Mapping[str, Any], recovering: bool = False
) -> StepResult:
    """Finish the jobs of this run's ``ready`` events, a batch at a time.

    ``recovering``: the events were taken over from a run that died, so some of their jobs may be
    finished already by it: they are told apart first, and their counters left alone.
    """
    result = StepResult()
    client = store.jobs.database.client
    for events in drain(store, run_id, ready, policy):
        outcome = atomically(client, lambda session: _finish_batch(store, run_id, events, side, recovering, session), policy.transactions)
        result.merge(outcome)
    return result


def _finish_batch(
    store: Store, run_id: str, events: list[dict[str, Any]], side: SideCollections, recovering: bool, session: ClientSession | None
) -> StepResult:
    keeps = side.generation.keeps_finished_jobs
    now = utc_now()
    done_before, to_finish, lost = [], events, []
    if recovering:
        current = _jobs_of(store, events, session)
        done_before = [event for event in events if keeps and _finished_by_us(current.get(event[ID]), event, keeps)]
        if not keeps:  # a job gone beside our error entry: the dead run deleted it
            gone = [event for event in events if event[ID] not in current and event.get(Event.CACHE_OUTCOME) == CacheOutcome.WRITTEN]
            ours = _still_our_entries(store, gone)
            done_before = [event for event in gone if event[ID] in ours]
        settled = {event[ID] for event in done_before}
        to_finish = [event for event in events if event[ID] not in settled and is_as_seen(current.get(event[ID]), event[Event.JOB])]
        finishing = {event[ID] for event in to_finish}
        lost = [event for event in events if event[ID] not in settled and event[ID] not in finishing]
    won: list[dict[str, Any]] = []
    if to_finish:
        written = store.jobs.bulk_write([_finish_operation(event, keeps) for event in to_finish], ordered=False, session=session)
        after = _jobs_of(store, to_finish, session)
        finished = [event for event in to_finish if _finished_by_us(after.get(event[ID]), event, keeps)]
        if not keeps and written.deleted_count < len(finished):  # a worker deleted some itself: theirs no longer hold our entry
            ours = _still_our_entries(store, finished)
            finished = [event for event in finished if event[ID] in ours]
        won = finished
        settled = {event[ID] for event in won}
        lost += [event for event in to_finish if event[ID] not in settled]
    effects = after_finish(store, side, _finished(won), now, session)
    effects.update(after_finish(store, side, _finished(done_before), now, session, count=False))
    finished = won + done_before
    set_on_events(
        store,
        run_id,
        {event[ID]: {Event.STATE: EventState.FINALIZED, Event.EFFECTS: effects[event[ID]]} for event in finished},
        session,
    )
    if lost:  # the worker was alive after all: forget the claim, the job may be judged again later
        store.events.delete_many(
            {ID: {"$in": [event[ID] for event in lost]}, Event.LEASE_OWNER: run_id, Event.STATE: EventState.CLAIMED},
            session=session,
        )
    return _result(finished, lost, effects)


def forget_changed(store: Store, run_id: str, policy: ZombiePolicy, ready: Mapping[str, Any]) -> StepResult:
    """Drop the claims of jobs a worker touched since detection, before their cache entry is written.

    Where the cache is written before the job is deleted, this keeps an error
    entry from being written for a worker that is only slow.
    """
    result = StepResult()
    for events in _unchecked(store, run_id, ready, policy):
        current = _jobs_of(store, events, None)
        lost = [event for event in events if not is_as_seen(current.get(event[ID]), event[Event.JOB])]
        if lost:
            store.events.delete_many({ID: {"$in": [event[ID] for event in lost]}, Event.LEASE_OWNER: run_id, Event.STATE: EventState.CLAIMED})
        result.counts["lost_to_live_worker"] += len(lost)
    return result


def _unchecked(store: Store, run_id: str, ready: Mapping[str, Any], policy: ZombiePolicy):
    """The ready events once each (checking moves none of them on, so they are read by ``_id`` ranges)."""
    last = None
    while True:
        query = {**ready, **({ID: {"$gt": last}} if last is not None else {})}
        batch = list(store.events.find({Event.LEASE_OWNER: run_id, **query}, {Event.POLICY: 0}).sort(ID, 1).limit(policy.batch_size))
        if not batch:
            return
        last = batch[-1][ID]
        yield batch


def _finished(events: list[Mapping[str, Any]]) -> list[Finished]:
    return [Finished(event[Event.JOB], event[Event.FINALIZED_AT]) for event in events]


def _jobs_of(store: Store, events: list[Mapping[str, Any]], session: ClientSession | None) -> dict[Any, dict[str, Any]]:
    ids = [event[ID] for event in events]
    return {job[ID]: job for job in store.jobs.find({ID: {"$in": ids}}, _JOB_STATE, session=session).batch_size(READ_BATCH)}


def _finished_by_us(job: Mapping[str, Any] | None, event: Mapping[str, Any], keeps: bool) -> bool:
    if not keeps:
        return job is None
    return job is not None and job.get(Job.STATUS) == Status.ERROR and as_utc(job.get(Job.FINISHED_AT)) == event[Event.FINALIZED_AT]


def _finish_operation(event: Mapping[str, Any], keeps: bool) -> UpdateOne | DeleteOne:
    condition = as_seen_filter(event[Event.JOB])
    if keeps:
        return UpdateOne(condition, {"$set": {Job.STATUS: Status.ERROR, Job.FINISHED_AT: event[Event.FINALIZED_AT]}})
    return DeleteOne(condition)


def _still_our_entries(store: Store, events: list[Mapping[str, Any]]) -> set[Any]:
    """The events whose error entry is still the one we wrote: nobody finished their job after us.

    A worker writes its result before it deletes its job, so a job gone beside our entry was deleted by us.
    """
    events = [event for event in events if event.get(Event.CACHE_OUTCOME) == CacheOutcome.WRITTEN]
    if not events:
        return set()
    entries = entries_of_jobs(store.cache, [event[Event.JOB] for event in events], {Cache.DETAILS: 1, Cache.ERROR_CODE: 1})
    return {event[ID] for event in events if written_for(entries.get(key_of(cache_key_of_job(event[Event.JOB]))), event)}


def _result(finished: list[Mapping[str, Any]], lost: list[Mapping[str, Any]], effects: dict[Any, list[str]]) -> StepResult:
    result = StepResult()
    result.counts["finalized"] += len(finished)
    result.counts["lost_to_live_worker"] += len(lost)
    for event in finished:
        result.counts[f"reason:{event[Event.REASON]}"] += 1
        result.counts[f"type:{event[Event.JOB][Job.TYPE]}"] += 1
        result.counts.update(f"effect:{effect}" for effect in effects[event[ID]])
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
