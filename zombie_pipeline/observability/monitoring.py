"""What the sensors and asset checks read.

Plain Python and pymongo: the Dagster wiring in ``defs/`` calls these.
Every read here is meant to run every minute against a production queue, so
each one is a count or a small projected find on an index: the stale count on
``(status, started_at)``, the audit trail on ``finalized_at``, the cache on its
unique key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymongo.collection import Collection

from zombie_pipeline.cleanup.detection import (
    Detection,
    count_stale,
    detect,
    stale_pipeline,
    started_filter,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import CacheOutcome, CompensationState, Event, EventState, ZombieEvent
from zombie_pipeline.queue.cache import Cache, CacheEntry, cache_key_of_job
from zombie_pipeline.queue.cache_entries import entries_of_jobs, key_of
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status, job_row, job_type_problem
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import as_utc, utc
from zombie_pipeline.trail import (
    active_quarantines,
    compensations_in,
    finalizations_since,
    pending_retries,
    unfinished_finalizations,
)

_BATCH = 500


# --- the stale-jobs sensor ------------------------------------------------------


@dataclass(frozen=True)
class StaleState:
    """The set of jobs past their thresholds, reduced to a count and a digest of their ids."""

    count: int
    digest: str = ""

    @property
    def run_key(self) -> str:
        """Equal for equal sets of stale jobs: the same state never launches two cleanups."""
        return f"stale-{self.count}-{self.digest[:16]}"


def stale_state(
    jobs: Collection[JobDocument], policy: ZombiePolicy, now: dt.datetime, job_types: Iterable[str] | None = None
) -> StaleState:
    """A count on the index; only when it is not zero, the ids (and nothing else) of the stale jobs."""
    if count_stale(jobs, policy, now, job_types) == 0:
        return StaleState(0)
    ids = sorted(
        str(job[ID]) for job in jobs.aggregate(stale_pipeline(policy, now, job_types) + [{"$project": {ID: 1}}])
    )
    return StaleState(len(ids), hashlib.sha256("\n".join(ids).encode()).hexdigest())


# --- the job-types sensor ---------------------------------------------------------


@dataclass(frozen=True)
class JobTypes:
    valid: tuple[str, ...]
    refused: tuple[Any, ...]  # values no query of ours would take as a type name


def job_types_in_queue(jobs: Collection[JobDocument]) -> JobTypes:
    """The distinct ``type`` values of the jobs collection (one ``distinct``, served by any index led by type).

    A type is refused when detection would call a job of it malformed.
    """
    valid: list[str] = []
    refused: list[Any] = []
    for value in jobs.distinct(Job.TYPE):
        (refused if job_type_problem(value) else valid).append(value)
    return JobTypes(tuple(sorted(valid)), tuple(refused))


# --- the queue's state after a cleanup --------------------------------------------


@dataclass(frozen=True)
class QueueSnapshot:
    """Counts an operator plots over time; each is one indexed count."""

    started: int
    waiting: int
    stale: int
    unfinished_finalizations: int  # audit events a crashed cleanup left; reconcile completes them
    zombies_finalized_last_24h: int
    retries_waiting_for_their_delay: int
    compensations_pending: int  # zombies whose actions still run, or failed and will be tried again
    compensations_given_up: int
    quarantined: int = 0  # (dataset, job type) pairs quarantined now: their crashes are not re-enqueued

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def queue_snapshot(store: Store, policy: ZombiePolicy, now: dt.datetime) -> QueueSnapshot:
    return QueueSnapshot(
        started=store.jobs.count_documents(started_filter()),
        waiting=store.jobs.count_documents({Job.STATUS: Status.WAITING}),
        stale=count_stale(store.jobs, policy, now),
        unfinished_finalizations=unfinished_finalizations(store),
        zombies_finalized_last_24h=finalizations_since(store, now - dt.timedelta(days=1)),
        retries_waiting_for_their_delay=pending_retries(store),
        compensations_pending=compensations_in(store, CompensationState.PENDING),
        compensations_given_up=compensations_in(store, CompensationState.FAILED),
        quarantined=len(active_quarantines(store, now)),
    )


# --- check: no zombies left -----------------------------------------------------------


def zombies_left(
    jobs: Collection[JobDocument], policy: ZombiePolicy, as_of: dt.datetime, job_types: Iterable[str] | None = None
) -> Detection:
    """The jobs that were already zombies at ``as_of`` and are still started.

    With ``as_of`` = the start of a cleanup, a job that became stale during or
    after the cleanup is not held against it, and a job whose worker beat since
    is no longer stale.
    """
    return detect(jobs, policy, as_of, job_types)


# --- check: every finalized zombie has its cache error ------------------------------


@dataclass
class CacheErrorAudit:
    """Audited finalizations whose cache error entry is not (or no longer) there."""

    checked: int = 0
    missing: int = 0  # no entry at all
    wrong: int = 0  # an entry not newer than the finalization, without its error code
    sample: list[dict[str, Any]] = field(default_factory=list)  # the first offenders, for the UI

    @property
    def passed(self) -> bool:
        return self.missing == 0 and self.wrong == 0


def audit_cache_errors(store: Store, since: dt.datetime, sample_size: int = 20) -> CacheErrorAudit:
    """For every finalization since ``since`` whose cache error was written, the entry must hold it.

    An entry updated after the finalization holds a newer result (a retry
    succeeded, the dataset was refreshed): that is the queue moving on, not a
    broken invariant.
    """
    audit = CacheErrorAudit()
    query = {
        Event.STATE: EventState.DONE,
        Event.CACHE_OUTCOME: CacheOutcome.WRITTEN,
        Event.FINALIZED_AT: {"$gte": since},
    }
    projection = {Event.ERROR_CODE: 1, Event.FINALIZED_AT: 1} | {f"{Event.JOB}.{name}": 1 for name in _KEY_FIELDS}
    batch: list[ZombieEvent] = []
    for event in store.events.find(query, projection).sort(Event.FINALIZED_AT, 1).batch_size(_BATCH):
        batch.append(event)
        if len(batch) >= _BATCH:
            _audit_batch(store.cache, batch, audit, sample_size)
            batch = []
    if batch:
        _audit_batch(store.cache, batch, audit, sample_size)
    return audit


_KEY_FIELDS = (Job.TYPE, Job.DATASET, Job.CONFIG, Job.SPLIT)


def _audit_batch(
    cache: Collection[CacheEntry], events: Sequence[ZombieEvent], audit: CacheErrorAudit, sample_size: int
) -> None:
    """The cache entries of a batch of events: one query per job type among them."""
    entries = entries_of_jobs(cache, [event[Event.JOB] for event in events], {Cache.ERROR_CODE: 1, Cache.UPDATED_AT: 1})
    for event in events:
        audit.checked += 1
        entry = entries.get(key_of(cache_key_of_job(event[Event.JOB])))
        if entry is None:
            audit.missing += 1
        elif entry.get(Cache.ERROR_CODE) == event[Event.ERROR_CODE] or _newer(entry, event):
            continue
        else:
            audit.wrong += 1
        if len(audit.sample) < sample_size:
            audit.sample.append(_audit_row(event, entry))


def _newer(entry: CacheEntry, event: ZombieEvent) -> bool:
    updated_at = as_utc(entry.get(Cache.UPDATED_AT))
    return updated_at is not None and updated_at > utc(event[Event.FINALIZED_AT])


def _audit_row(event: ZombieEvent, entry: CacheEntry | None) -> dict[str, Any]:
    updated_at = as_utc(entry.get(Cache.UPDATED_AT)) if entry else None
    return job_row(
        event[ID],
        event[Event.JOB],
        expected_error_code=event[Event.ERROR_CODE],
        found_error_code=entry.get(Cache.ERROR_CODE) if entry else None,
        finalized_at=utc(event[Event.FINALIZED_AT]).isoformat(),
        entry_updated_at=updated_at.isoformat() if updated_at else None,
    )
