"""Finishing claimed zombies as their queue's generation does, and never a job a worker still drives.

Before December 2023 a finished job is kept with status ``error`` and its
``finished_at``; from then on it is deleted. Either way the write is a
compare-and-set on what detection saw (still ``started``, same ``started_at``,
``last_heartbeat`` and ``terminated_at``): a worker that beat, finished or got
SIGTERM meanwhile wins, and the claim is forgotten. What the deployment does
around a finish (counters, rate limiter, locks: :mod:`finish_effects`) follows
for the jobs won.

Nothing here writes an event: the batch's events are completed once, at the end
of its pass (``cleanup``). A pass that dies is redone from the claims, so every
finish must be recognizable afterwards: our stamp as ``finished_at`` on a kept
job; for a deleted one, our error entry still beside it (a worker writes its
result before it deletes its job). A finish found done that way had its
counters moved by the pass that died, and they are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from pymongo import DeleteOne, UpdateOne
from pymongo.client_session import ClientSession

from zombie_pipeline.cleanup.cache_errors import written_for
from zombie_pipeline.cleanup.detection import as_seen_expression, as_seen_filter, is_as_seen
from zombie_pipeline.cleanup.effects import Finished, SideCollections, after_finish
from zombie_pipeline.cleanup.events import READ_BATCH
from zombie_pipeline.queue.cache_entries import entries_of_jobs, key_of
from zombie_pipeline.queue.documents import (
    ID,
    Cache,
    Event,
    Job,
    Status,
    ZombieEvent,
    as_utc,
    cache_key_of_job,
    utc_now,
)
from zombie_pipeline.queue.store import Store

_JOB_STATE = {Job.STATUS: 1, Job.FINISHED_AT: 1, Job.STARTED_AT: 1, Job.LAST_HEARTBEAT: 1, Job.TERMINATED_AT: 1}


@dataclass
class Sorted:
    """A batch of claimed events, told apart before anything is written."""

    to_finish: list[ZombieEvent] = field(default_factory=list)  # still as detection saw them
    done_before: list[ZombieEvent] = field(default_factory=list)  # finished by a pass that died
    lost: list[ZombieEvent] = field(default_factory=list)  # a worker touched the job: not ours any more


@dataclass
class Outcome:
    """What the finish of a batch did."""

    won: list[ZombieEvent] = field(default_factory=list)
    done_before: list[ZombieEvent] = field(default_factory=list)
    lost: list[ZombieEvent] = field(default_factory=list)
    effects: dict[Any, list[str]] = field(default_factory=dict)

    @property
    def finished(self) -> list[ZombieEvent]:
        return self.won + self.done_before


def sort_claims(store: Store, events: list[ZombieEvent], side: SideCollections, recovering: bool) -> Sorted:
    """Which claims can still be finished, which were by a pass that died (``recovering``), which are lost.

    Where the cache entry is written before the job is deleted, a claim whose job a
    worker touched since detection is dropped here, so that no error entry is written
    for a worker that is only slow. Where jobs are kept and nothing needs recovering,
    the finish's own compare-and-set is the check: no read is needed.
    """
    keeps = side.generation.keeps_finished_jobs
    if keeps and not recovering:
        return Sorted(to_finish=list(events))
    current = _jobs_of(store, events, None)
    sorted_ = Sorted()
    gone = []
    for event in events:
        job = current.get(event[ID])
        if recovering and keeps and _finished_by_us(job, event, keeps):
            sorted_.done_before.append(event)
        elif is_as_seen(job, event[Event.JOB]):
            sorted_.to_finish.append(event)
        elif recovering and not keeps and job is None:
            gone.append(event)
        else:
            sorted_.lost.append(event)
    ours = _still_our_entries(store, gone)
    sorted_.done_before += [event for event in gone if event[ID] in ours]
    sorted_.lost += [event for event in gone if event[ID] not in ours]
    return sorted_


def finish(store: Store, claims: Sorted, side: SideCollections, session: ClientSession | None = None) -> Outcome:
    """Finish the claims still as detection saw them, by compare-and-set; then what the deployment does around a finish."""
    keeps = side.generation.keeps_finished_jobs
    outcome = Outcome(done_before=list(claims.done_before), lost=list(claims.lost))
    if claims.to_finish:
        written = store.jobs.bulk_write([_finish_operation(event, keeps) for event in claims.to_finish], ordered=False, session=session)
        applied = written.modified_count if keeps else written.deleted_count
        if applied == len(claims.to_finish):  # every compare-and-set took (one job each): all won, nothing to read back
            won = list(claims.to_finish)
        else:  # which ones: read the jobs back
            after = _jobs_of(store, claims.to_finish, session)
            won = [event for event in claims.to_finish if _finished_by_us(after.get(event[ID]), event, keeps)]
            if not keeps and written.deleted_count < len(won):  # a worker deleted some itself: theirs no longer hold our entry
                ours = _still_our_entries(store, won)
                won = [event for event in won if event[ID] in ours]
        winners = {event[ID] for event in won}
        outcome.won = won
        outcome.lost += [event for event in claims.to_finish if event[ID] not in winners]
    now = utc_now()
    outcome.effects = after_finish(store, side, _finished(outcome.won), now, session)
    outcome.effects.update(after_finish(store, side, _finished(outcome.done_before), now, session, count=False))
    return outcome


def _finished(events: list[ZombieEvent]) -> list[Finished]:
    return [Finished(event[Event.JOB], event[Event.FINALIZED_AT]) for event in events]


def _jobs_of(store: Store, events: list[Mapping[str, Any]], session: ClientSession | None) -> dict[Any, dict[str, Any]]:
    ids = [event[ID] for event in events]
    return {job[ID]: job for job in store.jobs.find({ID: {"$in": ids}}, _JOB_STATE, session=session).batch_size(READ_BATCH)}


def _finished_by_us(job: Mapping[str, Any] | None, event: Mapping[str, Any], keeps: bool) -> bool:
    if not keeps:
        return job is None
    return job is not None and job.get(Job.STATUS) == Status.ERROR and as_utc(job.get(Job.FINISHED_AT)) == event[Event.FINALIZED_AT]


def _finish_operation(event: Mapping[str, Any], keeps: bool) -> UpdateOne | DeleteOne:
    """The compare-and-set on what detection saw: the job is set to ``error`` (or deleted) only while still as seen.

    A kept job's update selects it by ``_id`` alone and compares in the update itself (an update pipeline's
    ``$cond``, atomic on the document like a filter): a job no longer as seen is left exactly as it is and
    not counted as modified. Same outcome as a filter on every field, but the embedded server serves an
    ``_id``-only filter by a point lookup, and plans every other field of a filter against its index catalog
    first (about 1 ms per statement: docs/benchmarks.md); MongoDB serves both by the ``_id`` index.
    """
    job = event[Event.JOB]
    if keeps:
        seen = as_seen_expression(job)
        finish_job = {
            Job.STATUS: {"$cond": [seen, Status.ERROR, f"${Job.STATUS}"]},
            Job.FINISHED_AT: {"$cond": [seen, event[Event.FINALIZED_AT], f"${Job.FINISHED_AT}"]},
        }
        return UpdateOne({ID: job[ID]}, [{"$set": finish_job}])
    return DeleteOne(as_seen_filter(job))


def _still_our_entries(store: Store, events: list[Mapping[str, Any]]) -> set[Any]:
    """The events whose job's cache entry is still the error we wrote for it: nobody finished the job after us.

    A worker writes its result before it deletes its job, so a job gone beside our entry was deleted by us.
    """
    if not events:
        return set()
    entries = entries_of_jobs(store.cache, [event[Event.JOB] for event in events], {Cache.DETAILS: 1, Cache.ERROR_CODE: 1})
    return {event[ID] for event in events if written_for(entries.get(key_of(cache_key_of_job(event[Event.JOB]))), event)}
