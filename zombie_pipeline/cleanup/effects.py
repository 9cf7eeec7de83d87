"""What the deployment does around a job's finish and a job's insert, done for the jobs the cleanup touches.

dataset-viewer keeps counters in step with its queue (``jobTotalMetric``,
``workerTypeJobCounts``), rate-limits datasets from the runs of the last hour
(``pastJobs``, ``datasetBlockages``) and frees locks when a job finishes. A zombie
never finishes, so its cleanup does all of that in its stead, in the collections
the queue's generation keeps (which of them, and whether finished jobs are
counted, the finish strategy says: ``strategies``). The rules and constants are
the deployment's (docs/generations.md).

Every write here is one command per batch, and takes the session of the
transaction the finish runs in, when the server has transactions.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo import UpdateMany, UpdateOne
from pymongo.client_session import ClientSession

from zombie_pipeline.queue.documents import (
    BLOCKAGES_COLLECTION,
    CACHE_METRICS_COLLECTION,
    DATASET_STATUS_NORMAL,
    ID,
    JOB_METRICS_COLLECTION,
    LOCKS_COLLECTION,
    PAST_JOBS_COLLECTION,
    WORKER_SIZE_METRICS_COLLECTION,
    Blockage,
    Effect,
    Job,
    JobMetric,
    Lock,
    PastJob,
    Status,
    WorkerSizeMetric,
    utc,
)
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.store import Store

#: Worker sizes by job difficulty: up to 40 light, up to 70 medium, heavier above.
WORKER_SIZE_LIMITS = ((40, "light"), (70, "medium"))
HEAVY = "heavy"
#: A run shorter than this leaves no ``pastJobs`` record.
PAST_JOB_MIN_SECONDS = 30
#: A dataset whose recorded runs of the last hour exceed this (times its multiplier) is blocked.
BLOCKAGE_THRESHOLD_SECONDS = 7_200
COMPUTE_MULTIPLIER_BY_DATASET = {"HuggingFaceFW/fineweb-2": 100}


def worker_size(difficulty: Any) -> str:
    for limit, size in WORKER_SIZE_LIMITS:
        if isinstance(difficulty, (int, float)) and difficulty <= limit:
            return size
    return HEAVY


def run_seconds(job: Mapping[str, Any], finished_at: dt.datetime) -> int:
    """The whole seconds a run lasted, as ``pastJobs`` records them."""
    return int((finished_at - utc(job[Job.STARTED_AT])).total_seconds())


@dataclass(frozen=True)
class SideCollections:
    """Which of the deployment's collections this cleanup keeps in step: the generation's, where they exist."""

    generation: QueueGeneration
    kept: frozenset[str]
    #: ``jobTotalMetric`` rows are keyed by ``dataset_status`` too: as the rows there say, else as the generation does.
    by_dataset_status: bool

    @classmethod
    def of(cls, store: Store, generation: QueueGeneration, only_existing: bool) -> SideCollections:
        """The generation's collections; with ``only_existing``, those of them that exist.

        From 2023-12 the deployment writes its counters at its first job, creating them: so do we. Before,
        they came and went with releases (a recount in another database, then in step): kept only where
        they exist. Which applies is the finish strategy's to say.
        """
        kept = generation.side_collections
        if only_existing and kept:
            existing = store.queue_collection_names() | (
                {CACHE_METRICS_COLLECTION} if store.has_cache_metrics() else set()
            )
            kept &= existing
        row = store.job_metrics.find_one({}, {JobMetric.DATASET_STATUS: 1}) if JOB_METRICS_COLLECTION in kept else None
        by_dataset_status = JobMetric.DATASET_STATUS in row if row else generation.job_metrics_by_dataset_status
        return cls(generation, kept, by_dataset_status)

    def __contains__(self, collection: str) -> bool:
        return collection in self.kept

    @property
    def cache_metrics(self) -> bool:
        return CACHE_METRICS_COLLECTION in self.kept

    def job_metric_key(self, job_type: str, status: str) -> dict[str, Any]:
        key = {JobMetric.JOB_TYPE: job_type, JobMetric.STATUS: status}
        if self.by_dataset_status:
            key[JobMetric.DATASET_STATUS] = DATASET_STATUS_NORMAL
        return key


@dataclass(frozen=True)
class Finished:
    """A job just finished (by its worker, or by us for a zombie) and when: what the effects need."""

    job: Mapping[str, Any]
    finished_at: dt.datetime
    status: str = Status.ERROR  # where finished jobs are kept, the status it was given

    @property
    def id(self) -> Any:
        return self.job[ID]


def after_finish(
    store: Store,
    side: SideCollections,
    finished: list[Finished],
    now: dt.datetime,
    session: ClientSession | None = None,
    count: bool = True,
    count_final_status: bool = False,
) -> dict[Any, list[str]]:
    """Counters, rate limiter and locks around the finish of each job of ``finished``; the effects per job id.

    ``count=False`` leaves the counters alone: a finish found done by an earlier
    attempt that died before recording it may have counted already, and a
    counter is never moved twice (the deployment recounts them periodically).
    ``count_final_status``: the queue keeps finished jobs, so ``jobTotalMetric``
    counts them under their final status too.
    """
    effects: dict[Any, list[str]] = {item.id: [] for item in finished}
    if not finished:
        return effects
    if JOB_METRICS_COLLECTION in side and count:
        changes: Counter = Counter()
        for item in finished:
            changes[(item.job[Job.TYPE], Status.STARTED)] -= 1
            if count_final_status:
                changes[(item.job[Job.TYPE], item.status)] += 1
            effects[item.id].append(Effect.JOB_METRICS)
        _add_to_job_metrics(store, side, changes, session)
    if PAST_JOBS_COLLECTION in side:
        for job_id, effect in _record_past_jobs(store, side, finished, now, session, count).items():
            effects[job_id].append(effect)
    if LOCKS_COLLECTION in side:
        _release_locks(store, [item.job for item in finished], now, session)
        for item in finished:
            effects[item.id].append(Effect.LOCKS_RELEASED)
    return effects


def after_insert(
    store: Store, side: SideCollections, jobs: Sequence[Mapping[str, Any]], session: ClientSession | None = None
) -> None:
    """The counters the deployment increments when it inserts waiting jobs (our retries)."""
    if not jobs:
        return
    if JOB_METRICS_COLLECTION in side:
        _add_to_job_metrics(store, side, Counter((job[Job.TYPE], Status.WAITING) for job in jobs), session)
    if WORKER_SIZE_METRICS_COLLECTION in side:
        blocked = _blocked(store, side, {job[Job.DATASET] for job in jobs}, session)
        sizes = Counter(worker_size(job.get(Job.DIFFICULTY)) for job in jobs if job[Job.DATASET] not in blocked)
        _add_to_worker_sizes(store, sizes, session)


def _add_to_job_metrics(store: Store, side: SideCollections, changes: Counter, session: ClientSession | None) -> None:
    operations = [
        UpdateOne(side.job_metric_key(job_type, status), {"$inc": {JobMetric.TOTAL: change}}, upsert=True)
        for (job_type, status), change in sorted(changes.items())
        if change
    ]
    if operations:
        store.job_metrics.bulk_write(operations, ordered=False, session=session)


def _add_to_worker_sizes(store: Store, changes: Counter, session: ClientSession | None) -> None:
    operations = [
        UpdateOne({WorkerSizeMetric.WORKER_SIZE: size}, {"$inc": {WorkerSizeMetric.JOBS_COUNT: change}}, upsert=True)
        for size, change in sorted(changes.items())
        if change
    ]
    if operations:
        store.worker_size_metrics.bulk_write(operations, ordered=False, session=session)


def _blocked(store: Store, side: SideCollections, datasets: Iterable[str], session: ClientSession | None) -> set[str]:
    if BLOCKAGES_COLLECTION not in side:
        return set()
    return set(
        store.blockages.distinct(Blockage.DATASET, {Blockage.DATASET: {"$in": sorted(datasets)}}, session=session)
    )


def _record_past_jobs(
    store: Store,
    side: SideCollections,
    finished: list[Finished],
    now: dt.datetime,
    session: ClientSession | None,
    count: bool,
) -> dict[Any, str]:
    """A ``pastJobs`` record per run of at least 30 s (``_id`` = the job's, so never twice); block the datasets over the limit."""
    records = {}
    for item in finished:
        seconds = run_seconds(item.job, item.finished_at)
        if seconds >= PAST_JOB_MIN_SECONDS:
            records[item.id] = (item, seconds)
    if not records:
        return {}
    present = {
        document[ID] for document in store.past_jobs.find({ID: {"$in": list(records)}}, {ID: 1}, session=session)
    }
    new = [
        {
            ID: job_id,
            PastJob.DATASET: item.job[Job.DATASET],
            PastJob.DURATION: seconds,
            PastJob.FINISHED_AT: item.finished_at,
        }
        for job_id, (item, seconds) in records.items()
        if job_id not in present
    ]
    if new:
        store.past_jobs.insert_many(new, ordered=True, session=session)
    effects: dict[Any, str] = dict.fromkeys(records, Effect.PAST_JOB)
    effects.update(_block_datasets(store, side, [records[document[ID]] for document in new], now, session, count))
    return effects


def _block_datasets(
    store: Store,
    side: SideCollections,
    recorded: list[tuple[Finished, int]],
    now: dt.datetime,
    session: ClientSession | None,
    count: bool,
) -> dict[Any, str]:
    """Block each dataset whose last hour of runs now exceeds the deployment's threshold, once.

    Only a run longer than the minimum can block; its dataset's pending jobs then
    leave the worker-size counters, as the deployment does.
    """
    if BLOCKAGES_COLLECTION not in side:
        return {}
    triggering: dict[str, Any] = {}  # dataset -> the job whose run blocks it
    for item, seconds in recorded:
        if seconds > PAST_JOB_MIN_SECONDS:
            triggering.setdefault(item.job[Job.DATASET], item.id)
    if not triggering:
        return {}
    already = _blocked(store, side, triggering, session)
    totals = {
        row[ID]: row["seconds"]
        for row in store.past_jobs.aggregate(
            [
                {"$match": {PastJob.DATASET: {"$in": sorted(set(triggering) - already)}}},
                {"$group": {ID: f"${PastJob.DATASET}", "seconds": {"$sum": f"${PastJob.DURATION}"}}},
            ],
            session=session,
        )
    }
    to_block = {
        dataset: event_id
        for dataset, event_id in triggering.items()
        if dataset not in already
        and totals.get(dataset, 0) > BLOCKAGE_THRESHOLD_SECONDS * COMPUTE_MULTIPLIER_BY_DATASET.get(dataset, 1)
    }
    if not to_block:
        return {}
    store.blockages.insert_many(
        [
            {ID: event_id, Blockage.DATASET: dataset, Blockage.BLOCKED_AT: now}
            for dataset, event_id in sorted(to_block.items())
        ],
        session=session,
    )
    if WORKER_SIZE_METRICS_COLLECTION in side and count:
        pending = store.jobs.find({Job.DATASET: {"$in": sorted(to_block)}}, {Job.DIFFICULTY: 1}, session=session)
        _add_to_worker_sizes(
            store,
            Counter(
                {
                    size: -count
                    for size, count in Counter(worker_size(job.get(Job.DIFFICULTY)) for job in pending).items()
                }
            ),
            session,
        )
    return dict.fromkeys(to_block.values(), Effect.BLOCKED_DATASET)


def _release_locks(
    store: Store, jobs: list[Mapping[str, Any]], now: dt.datetime, session: ClientSession | None
) -> None:
    """Free the lock keyed by each job's ``unicity_id``, as the deployment's finish does, so its re-run can start.

    Locks the job took for itself (a git branch) are left to their TTL, as the
    deployment leaves them: a job past its maximum duration may still be running.
    Only the owner field a lock document already has is written (early locks named it ``job_id``).
    """
    keys = sorted({job[Job.UNICITY_ID] for job in jobs})
    released = {Lock.UPDATED_AT: now}
    store.locks.bulk_write(
        [
            UpdateMany({ID: {"$in": keys}, Lock.OWNER: {"$exists": True}}, {"$set": {Lock.OWNER: None, **released}}),
            UpdateMany(
                {ID: {"$in": keys}, Lock.JOB_ID: {"$ne": None}, Lock.OWNER: {"$exists": False}},
                {"$set": {Lock.JOB_ID: None, **released}},
            ),
        ],
        ordered=False,
        session=session,
    )
