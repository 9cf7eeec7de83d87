"""Late results: finalized jobs that showed life afterwards, the mistakes detection can make, counted and never undone.

A job finalized as dead whose worker was only slow goes on: its heartbeats, or its own result written over our error
entry, say so later. What the database holds is the evidence, read for the events finalized in the last
``late_result_window_hours``:

- ``heartbeat``: where the generation keeps finished jobs, the job's ``last_heartbeat`` is later than its
  finalization (the deployment's heartbeat writes whatever the job's status);
- ``result``: the job's cache entry was rewritten after the finalization, not with one of our errors, for the job's
  revision, by the same run: its ``duration`` runs from the job's own start (a retry's runs from the retry's), or,
  without a duration, no job of the same unicity id has started since (where finished jobs are kept). Queues that
  delete finished jobs with a cache that records no duration (2023-12 to 2024-06) cannot tell a late result from a
  retry's: nothing is counted there.

Each is recorded once, on the event (``late_result``): what the deployment wrote is left as it is.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo import UpdateOne

from zombie_pipeline.cleanup.events import batched
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, LateEvidence, LateResult, LateResultRecord, ZombieEvent
from zombie_pipeline.queue.cache import Cache, CacheEntry, ErrorCode, cache_key_of_job
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, JobSnapshot
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import as_utc
from zombie_pipeline.trail import finalized_between

#: How far a result's start (its ``updated_at`` less its ``duration``) may lie from the job's own start and still be
#: that run's: the worker takes both times within a moment; a retry starts minutes later, after the finalization.
SAME_RUN_SECONDS = 10.0

_OUR_ERRORS = frozenset(str(code) for code in ErrorCode)
_READ = {ID: 1, Event.JOB: 1, Event.FINALIZED_AT: 1, Event.QUEUE_GENERATION: 1}


@dataclass(frozen=True)
class _Finalized:
    """What the audit needs of an event, its dates read."""

    id: Any
    job: JobSnapshot
    started_at: dt.datetime
    finalized_at: dt.datetime
    keeps_jobs: bool  # its generation keeps finished jobs

    @classmethod
    def of(cls, event: ZombieEvent) -> _Finalized | None:
        """None for an event whose job snapshot or dates cannot be read (never audited)."""
        job = event.get(Event.JOB)
        if not isinstance(job, Mapping) or not isinstance(job.get(Job.TYPE), str):
            return None
        started_at, finalized_at = as_utc(job.get(Job.STARTED_AT)), as_utc(event.get(Event.FINALIZED_AT))
        if started_at is None or finalized_at is None:
            return None
        generation = QUEUE_GENERATIONS.get(event.get(Event.QUEUE_GENERATION, ""))
        keeps_jobs = generation is not None and generation.keeps_finished_jobs
        return cls(event[ID], job, started_at, finalized_at, keeps_jobs)

    @property
    def key(self) -> tuple[Any, ...]:
        return _key(self.job)

    def late(self, evidence: LateEvidence, seen_at: dt.datetime) -> LateResultRecord:
        seconds = round((seen_at - self.finalized_at).total_seconds(), 3)
        return {LateResult.EVIDENCE: evidence, LateResult.SEEN_AT: seen_at, LateResult.SECONDS_AFTER: seconds}


def audit_late_results(store: Store, policy: ZombiePolicy, now: dt.datetime, run_id: str | None = None) -> int:
    """Record on each event finalized in the window whose job has shown life since what showed it; how many were new.

    The events of ``run_id`` (the run auditing) are left to the next run: their jobs were dead a moment ago.
    """
    since = now - dt.timedelta(hours=policy.late_result_window_hours)
    query = {**finalized_between(since, now), Event.LATE_RESULT: None, Event.RUN_ID: {"$ne": run_id}}
    finalized = [item for event in store.events.find(query, _READ) if (item := _Finalized.of(event)) is not None]
    if not finalized:
        return 0
    late: dict[Any, LateResultRecord] = {}
    for batch in batched(finalized, policy.batch_size):  # a $or of cache keys per batch
        for event_id, record in (*_by_result(store, batch).items(), *_by_heartbeat(store, batch).items()):
            if event_id not in late or record[LateResult.SEEN_AT] < late[event_id][LateResult.SEEN_AT]:
                late[event_id] = record  # the first sign of life
    if not late:
        return 0
    written = store.events.bulk_write(
        [
            UpdateOne({ID: event_id, Event.LATE_RESULT: None}, {"$set": {Event.LATE_RESULT: record}})
            for event_id, record in late.items()
        ],
        ordered=False,
    )
    return written.modified_count


def _by_heartbeat(store: Store, finalized: Iterable[_Finalized]) -> dict[Any, LateResultRecord]:
    kept = {item.id: item for item in finalized if item.keeps_jobs}
    if not kept:
        return {}
    late = {}
    for job in store.jobs.find({ID: {"$in": list(kept)}}, {Job.LAST_HEARTBEAT: 1}):
        item = kept[job[ID]]
        beat = as_utc(job.get(Job.LAST_HEARTBEAT))
        if beat is not None and beat > item.finalized_at:
            late[item.id] = item.late(LateEvidence.HEARTBEAT, beat)
    return late


def _by_result(store: Store, finalized: Sequence[_Finalized]) -> dict[Any, LateResultRecord]:
    by_key = {item.key: item for item in finalized}
    entries = store.cache.find({"$or": [cache_key_of_job(item.job) for item in finalized]})
    rewritten = [
        (entry, updated_at, by_key[_key(entry)])
        for entry in entries
        if _key(entry) in by_key and (updated_at := _rewritten_after(entry, by_key[_key(entry)])) is not None
    ]
    restarted = _restarted(store, [item for _, _, item in rewritten if item.keeps_jobs])
    return {
        item.id: item.late(LateEvidence.RESULT, updated_at)
        for entry, updated_at, item in rewritten
        if _same_run(entry, updated_at, item, restarted)
    }


def _key(document: Mapping[str, Any]) -> tuple[Any, ...]:
    """A job's or a cache entry's cache key, as one value (a missing config or split is None)."""
    kind = document.get(Cache.KIND, document.get(Job.TYPE))
    return (kind, document.get(Cache.DATASET), document.get(Cache.CONFIG), document.get(Cache.SPLIT))


def _rewritten_after(entry: CacheEntry, item: _Finalized) -> dt.datetime | None:
    """When the entry was written, if after the finalization, not as one of our errors, for the job's revision."""
    updated_at = as_utc(entry.get(Cache.UPDATED_AT))
    revision = item.job.get(Job.REVISION)
    if updated_at is None or updated_at <= item.finalized_at or entry.get(Cache.ERROR_CODE) in _OUR_ERRORS:
        return None
    return updated_at if revision is None or entry.get(Cache.DATASET_GIT_REVISION) == revision else None


def _same_run(entry: CacheEntry, updated_at: dt.datetime, item: _Finalized, restarted: set[Any]) -> bool:
    duration = entry.get(Cache.DURATION)
    if isinstance(duration, (int, float)):
        run_start = updated_at - dt.timedelta(seconds=duration)
        return abs((run_start - item.started_at).total_seconds()) <= SAME_RUN_SECONDS
    return item.keeps_jobs and item.id not in restarted


def _restarted(store: Store, finalized: list[_Finalized]) -> set[Any]:
    """Those whose unicity id has had a job started since their finalization (a retry, a backfill's)."""
    if not finalized:
        return set()
    by_unicity: dict[Any, list[_Finalized]] = {}
    for item in finalized:
        by_unicity.setdefault(item.job.get(Job.UNICITY_ID), []).append(item)
    earliest = min(item.finalized_at for item in finalized)
    query = {Job.UNICITY_ID: {"$in": list(by_unicity)}, Job.STARTED_AT: {"$gt": earliest}}
    restarted = set()
    for job in store.jobs.find(query, {Job.UNICITY_ID: 1, Job.STARTED_AT: 1}):
        started_at = as_utc(job.get(Job.STARTED_AT))
        for item in by_unicity.get(job.get(Job.UNICITY_ID), []):
            if started_at is not None and started_at > item.finalized_at:
                restarted.add(item.id)
    return restarted
