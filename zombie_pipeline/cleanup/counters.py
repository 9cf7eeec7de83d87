"""The deployment's counters as a recount of the documents they count.

``jobTotalMetric`` counts jobs per (type, status), ``workerTypeJobCounts`` the
waiting jobs of datasets not blocked per worker size, ``cacheTotalMetric`` cache
entries per (kind, http_status, error_code); the deployment moves them by one
at every insert, start, finish and cache write. The simulator writes them from
this recount, and a cleanup is checked against it: after a cleanup every
counter must equal its recount.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pymongo import UpdateOne

from zombie_pipeline.cleanup.effects import worker_size
from zombie_pipeline.queue.documents import (
    BLOCKAGES_COLLECTION,
    CACHE_METRICS_COLLECTION,
    DATASET_STATUS_NORMAL,
    ID,
    JOB_METRICS_COLLECTION,
    WORKER_SIZE_METRICS_COLLECTION,
    Blockage,
    Cache,
    CacheMetric,
    Job,
    JobMetric,
    Status,
    WorkerSizeMetric,
)
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.store import Store


def recount(store: Store, generation: QueueGeneration) -> dict[str, Counter]:
    """Every counter the generation keeps, recounted from the documents (zeros left out)."""
    counts: dict[str, Counter] = {}
    if generation.keeps(JOB_METRICS_COLLECTION):
        counts[JOB_METRICS_COLLECTION] = _count(
            store.jobs.aggregate(
                [{"$group": {ID: {"type": f"${Job.TYPE}", "status": f"${Job.STATUS}"}, "n": {"$sum": 1}}}]
            ),
            lambda key: (key["type"], key["status"]),
        )
    if generation.keeps(WORKER_SIZE_METRICS_COLLECTION):
        blocked = set(store.blockages.distinct(Blockage.DATASET)) if generation.keeps(BLOCKAGES_COLLECTION) else set()
        waiting = store.jobs.find({Job.STATUS: Status.WAITING}, {Job.DATASET: 1, Job.DIFFICULTY: 1})
        counts[WORKER_SIZE_METRICS_COLLECTION] = Counter(
            worker_size(job.get(Job.DIFFICULTY)) for job in waiting if job.get(Job.DATASET) not in blocked
        )
    if generation.cache_metrics:
        counts[CACHE_METRICS_COLLECTION] = _count(
            store.cache.aggregate(
                [
                    {
                        "$group": {
                            ID: {
                                "kind": f"${Cache.KIND}",
                                "http": f"${Cache.HTTP_STATUS}",
                                "code": f"${Cache.ERROR_CODE}",
                            },
                            "n": {"$sum": 1},
                        }
                    }
                ]
            ),
            lambda key: (key["kind"], key["http"], key.get("code")),
        )
    return counts


def stored(store: Store, generation: QueueGeneration) -> dict[str, Counter]:
    """The counters as the deployment's collections hold them (zeros left out)."""
    counts: dict[str, Counter] = {}
    if generation.keeps(JOB_METRICS_COLLECTION):
        counts[JOB_METRICS_COLLECTION] = +Counter(
            {(row[JobMetric.JOB_TYPE], row[JobMetric.STATUS]): row[JobMetric.TOTAL] for row in store.job_metrics.find()}
        )
    if generation.keeps(WORKER_SIZE_METRICS_COLLECTION):
        counts[WORKER_SIZE_METRICS_COLLECTION] = +Counter(
            {
                row[WorkerSizeMetric.WORKER_SIZE]: row[WorkerSizeMetric.JOBS_COUNT]
                for row in store.worker_size_metrics.find()
            }
        )
    if generation.cache_metrics:
        counts[CACHE_METRICS_COLLECTION] = +Counter(
            {
                (row[CacheMetric.KIND], row[CacheMetric.HTTP_STATUS], row.get(CacheMetric.ERROR_CODE)): row[
                    CacheMetric.TOTAL
                ]
                for row in store.cache_metrics.find()
            }
        )
    return counts


def write_recount(store: Store, generation: QueueGeneration) -> None:
    """Set every counter the generation keeps to its recount, as the deployment's periodic recount does."""
    counts = recount(store, generation)
    if JOB_METRICS_COLLECTION in counts:
        _set(
            store.job_metrics,
            [
                (
                    {
                        JobMetric.JOB_TYPE: job_type,
                        JobMetric.STATUS: status,
                        **(
                            {JobMetric.DATASET_STATUS: DATASET_STATUS_NORMAL}
                            if generation.job_metrics_by_dataset_status
                            else {}
                        ),
                    },
                    {JobMetric.TOTAL: total},
                )
                for (job_type, status), total in counts[JOB_METRICS_COLLECTION].items()
            ],
        )
    if WORKER_SIZE_METRICS_COLLECTION in counts:
        _set(
            store.worker_size_metrics,
            [
                ({WorkerSizeMetric.WORKER_SIZE: size}, {WorkerSizeMetric.JOBS_COUNT: total})
                for size, total in counts[WORKER_SIZE_METRICS_COLLECTION].items()
            ],
        )
    if CACHE_METRICS_COLLECTION in counts:
        _set(
            store.cache_metrics,
            [
                (
                    {CacheMetric.KIND: kind, CacheMetric.HTTP_STATUS: http_status, CacheMetric.ERROR_CODE: code},
                    {CacheMetric.TOTAL: total},
                )
                for (kind, http_status, code), total in counts[CACHE_METRICS_COLLECTION].items()
            ],
        )


def _count(rows: Any, key_of: Any) -> Counter:
    return +Counter({key_of(row[ID]): row["n"] for row in rows})


def _set(collection: Any, rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    if rows:
        collection.bulk_write([UpdateOne(key, {"$set": values}, upsert=True) for key, values in rows], ordered=False)
