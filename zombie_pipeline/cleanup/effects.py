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

A counter is moved with ``$inc``, which no write of ours can make idempotent:
the deployment's counter documents have no room for a mark of ours. So a move a
pass that died may or may not have applied is never applied again, nor skipped:
its key is returned as :class:`CountersInDoubt`, and the pass sets that counter
to a recount of the documents it counts (``counters.repair``) before it
completes its events.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass
class CountersInDoubt:
    """Counter moves a pass that died may or may not have applied: the keys to set to a recount, never to move."""

    job_metrics: set[tuple[str, str]] = field(default_factory=set)  # (job type, status) of jobTotalMetric
    worker_sizes: bool = False  # workerTypeJobCounts (its few keys are recounted together)
    cache_metrics: set[tuple[Any, Any, Any]] = field(default_factory=set)  # (kind, http_status, error_code)

    def __bool__(self) -> bool:
        return bool(self.job_metrics or self.worker_sizes or self.cache_metrics)

    def merge(self, other: CountersInDoubt) -> CountersInDoubt:
        self.job_metrics |= other.job_metrics
        self.worker_sizes |= other.worker_sizes
        self.cache_metrics |= other.cache_metrics
        return self


@dataclass
class Effects:
    """What was done around a batch of finishes: per job id, the effects for its event; the counters in doubt."""

    by_job: dict[Any, list[str]]
    in_doubt: CountersInDoubt = field(default_factory=CountersInDoubt)


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
) -> Effects:
    """Counters, rate limiter and locks around the finish of each job of ``finished``; the effects per job id.

    ``count=False``: these finishes were found done by a pass that died before
    recording them; it may or may not have moved their counters, so they are not
    moved again but returned in doubt (within a transaction, the finish and its
    counters committed together: nothing is in doubt, and the caller knows it).
    Either way the event records ``job_metrics``: the counters are in step once
    the pass ends. A ``pastJobs`` record, a blockage and a lock are written so as
    to be found, never doubled.
    ``count_final_status``: the queue keeps finished jobs, so ``jobTotalMetric``
    counts them under their final status too.
    """
    effects = Effects({item.id: [] for item in finished})
    if not finished:
        return effects
    if JOB_METRICS_COLLECTION in side:
        changes: Counter = Counter()
        for item in finished:
            changes[(item.job[Job.TYPE], Status.STARTED)] -= 1
            if count_final_status:
                changes[(item.job[Job.TYPE], item.status)] += 1
            effects.by_job[item.id].append(Effect.JOB_METRICS)
        if count:
            _add_to_job_metrics(store, side, changes, session)
        else:
            effects.in_doubt.job_metrics |= set(changes)
    if PAST_JOBS_COLLECTION in side:
        recorded = _record_past_jobs(store, side, finished, now, session)
        for job_id, job_effects in recorded.by_job.items():
            effects.by_job[job_id] += job_effects
        effects.in_doubt.merge(recorded.in_doubt)
    if LOCKS_COLLECTION in side:
        _release_locks(store, [item.job for item in finished], now, session)
        for item in finished:
            effects.by_job[item.id].append(Effect.LOCKS_RELEASED)
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
        blocked = set(_blockages(store, side, {job[Job.DATASET] for job in jobs}, session))
        sizes = Counter(worker_size(job.get(Job.DIFFICULTY)) for job in jobs if job[Job.DATASET] not in blocked)
        _add_to_worker_sizes(store, sizes, session)


def inserted_before(side: SideCollections, jobs: Sequence[Mapping[str, Any]]) -> CountersInDoubt:
    """The counters :func:`after_insert` moves for ``jobs``, found inserted by a pass that died: in doubt."""
    doubt = CountersInDoubt()
    if jobs and JOB_METRICS_COLLECTION in side:
        doubt.job_metrics |= {(job[Job.TYPE], Status.WAITING) for job in jobs}
    if jobs and WORKER_SIZE_METRICS_COLLECTION in side:
        doubt.worker_sizes = True
    return doubt


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


def _blockages(
    store: Store, side: SideCollections, datasets: Iterable[str], session: ClientSession | None
) -> dict[str, Any]:
    """dataset -> ``_id`` of its blockage, for the blocked ones among ``datasets``."""
    if BLOCKAGES_COLLECTION not in side:
        return {}
    found = store.blockages.find({Blockage.DATASET: {"$in": sorted(datasets)}}, {Blockage.DATASET: 1}, session=session)
    return {blockage[Blockage.DATASET]: blockage[ID] for blockage in found}


def _record_past_jobs(
    store: Store,
    side: SideCollections,
    finished: list[Finished],
    now: dt.datetime,
    session: ClientSession | None,
) -> Effects:
    """A ``pastJobs`` record per run of at least 30 s (``_id`` = the job's, so never twice); block the datasets over the limit."""
    records = {}
    for item in finished:
        seconds = run_seconds(item.job, item.finished_at)
        if seconds >= PAST_JOB_MIN_SECONDS:
            records[item.id] = (item, seconds)
    if not records:
        return Effects({})
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
    effects = Effects({job_id: [Effect.PAST_JOB] for job_id in records})
    blocked = _block_datasets(store, side, list(records.values()), now, session)
    for job_id, job_effects in blocked.by_job.items():
        effects.by_job[job_id] += job_effects
    effects.in_doubt = blocked.in_doubt
    return effects


def _block_datasets(
    store: Store,
    side: SideCollections,
    recorded: list[tuple[Finished, int]],
    now: dt.datetime,
    session: ClientSession | None,
) -> Effects:
    """Block each dataset whose last hour of runs now exceeds the deployment's threshold, once.

    Only a run longer than the minimum can block; its dataset's pending jobs then
    leave the worker-size counters, as the deployment does. The blockage's ``_id``
    is the smallest job id of the batch's runs that trigger it, so a pass redone
    writes the same one; a blockage found with the id of one of the batch's jobs
    was written by a pass that died, which may or may not have lowered the
    counters: in doubt.
    """
    if BLOCKAGES_COLLECTION not in side:
        return Effects({})
    triggering: dict[str, Any] = {}  # dataset -> the job whose run blocks it
    for item, seconds in recorded:
        if seconds > PAST_JOB_MIN_SECONDS:
            dataset = item.job[Job.DATASET]
            triggering[dataset] = min(triggering.get(dataset, item.id), item.id)
    if not triggering:
        return Effects({})
    already = _blockages(store, side, triggering, session)
    batch = {item.id for item, _ in recorded}
    effects = Effects({blockage: [Effect.BLOCKED_DATASET] for blockage in already.values() if blockage in batch})
    effects.in_doubt.worker_sizes = bool(effects.by_job) and WORKER_SIZE_METRICS_COLLECTION in side
    totals = {
        row[ID]: row["seconds"]
        for row in store.past_jobs.aggregate(
            [
                {"$match": {PastJob.DATASET: {"$in": sorted(set(triggering) - set(already))}}},
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
        return effects
    store.blockages.insert_many(
        [
            {ID: event_id, Blockage.DATASET: dataset, Blockage.BLOCKED_AT: now}
            for dataset, event_id in sorted(to_block.items())
        ],
        session=session,
    )
    if WORKER_SIZE_METRICS_COLLECTION in side:
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
    for event_id in to_block.values():
        effects.by_job[event_id] = [Effect.BLOCKED_DATASET]
    return effects


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
