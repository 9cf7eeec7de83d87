"""The deployment's counters as a recount of the documents they count, and their repair after a fault.

``jobTotalMetric`` counts jobs per (type, status), ``workerTypeJobCounts`` the
waiting jobs of datasets not blocked per worker size, ``cacheTotalMetric`` cache
entries per (kind, http_status, error_code); the deployment moves them by one
at every insert, start, finish and cache write. A cleanup is checked against
this recount (so is the simulated deployment, which keeps its counters with a
model of its own, ``simulation/deployment_writes.py``): after a cleanup every
counter must equal its recount.

:func:`repair` sets the counters an earlier pass (one that died, or whose
reply was lost) may or may not have moved (:class:`CountersInDoubt`) to a
recount of their keys only, on the indexes.
It races the deployment's live workers, each of which moves a counter in two
writes (its job, then the ``$inc``). So a repair reads the counters, counts,
and writes each counter that differs by compare-and-set on the value it read:
a worker's ``$inc`` landing in between makes the write miss, never lost. What
a compare-and-set cannot see is a worker whose job was written before the count
and whose ``$inc`` lands after the write: that counter ends one off. So the
repair samples again, and again corrects, until a sample finds every counter
equal to its count, a moment after its last write (at most :data:`REPAIR_ROUNDS`). Measured amid busy simulated
workers against a plain recount written as it is (the deployment's periodic
recount): ``tests/faults/repair_race.py``, docs/reliability.md. Only passes that
redo an earlier one repair: an uninterrupted cleanup sends no command more.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pymongo import UpdateOne
from pymongo.collection import Collection

from zombie_pipeline.cleanup.side_collections import SideCollections
from zombie_pipeline.queue.blockages import BLOCKAGES_COLLECTION, Blockage
from zombie_pipeline.queue.cache import CACHE_METRICS_COLLECTION, Cache, CacheMetric
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.job_metrics import DATASET_STATUS_NORMAL, JOB_METRICS_COLLECTION, JobMetric
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.worker_type_counts import (
    HEAVY,
    WORKER_SIZE_LIMITS,
    WORKER_SIZE_METRICS_COLLECTION,
    WorkerSizeMetric,
    worker_size,
)


@dataclass
class CountersInDoubt:
    """Counter moves an earlier pass may or may not have applied: the keys to set to a recount, never to move."""

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


#: Read, count, compare-and-set, until a round finds every counter equal to its count; at most this many rounds.
REPAIR_ROUNDS = 5
#: Between two rounds: longer than a worker takes from its job's write to its ``$inc`` (a few round trips), so that
#: the ``$inc`` of a worker caught between the two by the last count has landed when the next round reads.
SETTLE_SECONDS = 0.1


def recount(store: Store, generation: QueueGeneration) -> dict[str, Counter[Any]]:
    """Every counter the generation keeps, recounted from the documents (zeros left out)."""
    counts: dict[str, Counter[Any]] = {}
    if generation.keeps(JOB_METRICS_COLLECTION):
        counts[JOB_METRICS_COLLECTION] = _count(
            store.jobs.aggregate([_BY_TYPE_AND_STATUS]),
            _type_and_status,
        )
    if generation.keeps(WORKER_SIZE_METRICS_COLLECTION):
        blocked = set(store.blockages.distinct(Blockage.DATASET)) if generation.keeps(BLOCKAGES_COLLECTION) else set()
        waiting = store.jobs.find({Job.STATUS: Status.WAITING}, {Job.DATASET: 1, Job.DIFFICULTY: 1})
        counts[WORKER_SIZE_METRICS_COLLECTION] = Counter(
            worker_size(job.get(Job.DIFFICULTY)) for job in waiting if job.get(Job.DATASET) not in blocked
        )
    if generation.cache_metrics:
        counts[CACHE_METRICS_COLLECTION] = _count(
            store.cache.aggregate([_BY_KIND_STATUS_AND_CODE]),
            _kind_status_and_code,
        )
    return counts


def stored(store: Store, generation: QueueGeneration) -> dict[str, Counter[Any]]:
    """The counters as the deployment's collections hold them (zeros left out)."""
    counts: dict[str, Counter[Any]] = {}
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


#: The counts the deployment's counters hold, grouped as its counter documents are keyed.
_BY_TYPE_AND_STATUS = {"$group": {ID: {"type": f"${Job.TYPE}", "status": f"${Job.STATUS}"}, "n": {"$sum": 1}}}
_BY_KIND_STATUS_AND_CODE = {
    "$group": {
        ID: {"kind": f"${Cache.KIND}", "http": f"${Cache.HTTP_STATUS}", "code": f"${Cache.ERROR_CODE}"},
        "n": {"$sum": 1},
    }
}


def _type_and_status(key: Mapping[str, Any]) -> tuple[Any, Any]:
    return key["type"], key["status"]


def _kind_status_and_code(key: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return key["kind"], key["http"], key.get("code")


def _count(rows: Any, key_of: Any) -> Counter[Any]:
    return +Counter({key_of(row[ID]): row["n"] for row in rows})


def _set(collection: Any, rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    if rows:
        collection.bulk_write([UpdateOne(key, {"$set": values}, upsert=True) for key, values in rows], ordered=False)


# --- the repair of the counters an earlier pass may or may not have moved ---------------------------------


def repair(store: Store, side: SideCollections, doubt: CountersInDoubt, rounds: int = REPAIR_ROUNDS) -> int:
    """Set each counter in ``doubt`` to the recount of its key; how many were written. Nothing in doubt: no command.

    Per counter collection and round, two reads (the counters, the count; three for the worker sizes, which leave
    the blocked datasets out) and a write if one differs; the last round is a read that finds nothing to write.
    """
    written = 0
    if doubt.job_metrics and JOB_METRICS_COLLECTION in side:
        written += _repair(store.job_metrics, _JobMetrics(store, side, doubt.job_metrics), rounds)
    if doubt.worker_sizes and WORKER_SIZE_METRICS_COLLECTION in side:
        written += _repair(store.worker_size_metrics, _WorkerSizes(store, side), rounds)
    if doubt.cache_metrics and side.cache_metrics:
        written += _repair(store.cache_metrics, _CacheMetrics(store, doubt.cache_metrics), rounds)
    return written


class _Keys(Protocol):
    """One counter collection's keys in doubt: how to read them, count them, and select one key's document."""

    keys: set[Any]
    total: str

    def stored(self) -> dict[Any, int]: ...

    def counted(self) -> Counter[Any]: ...

    def selector(self, key: Any) -> dict[str, Any]: ...


def _repair(collection: Collection[Any], keys: _Keys, rounds: int) -> int:
    """Read, count, compare-and-set each counter that differs; again until a round finds none (or ``rounds`` ran)."""
    written = 0
    for _ in range(rounds):
        stored, counted = keys.stored(), keys.counted()  # the counters first: a worker's $inc after it misses the write
        operations = []
        for key in sorted(keys.keys, key=repr):
            value, total = stored.get(key), counted[key]
            if value == total or (value is None and total == 0):
                continue
            if value is None:  # no document yet: counted from zero, as the deployment's upsert does
                operations.append(UpdateOne(keys.selector(key), {"$inc": {keys.total: total}}, upsert=True))
            else:
                operations.append(UpdateOne({**keys.selector(key), keys.total: value}, {"$set": {keys.total: total}}))
        if not operations:
            break
        result = collection.bulk_write(operations, ordered=False)
        written += result.modified_count + result.upserted_count
        time.sleep(SETTLE_SECONDS)
    return written


class _JobMetrics(_Keys):
    total = JobMetric.TOTAL

    def __init__(self, store: Store, side: SideCollections, keys: set[tuple[str, str]]) -> None:
        self.store, self.side, self.keys = store, side, keys
        self.types = sorted({job_type for job_type, _ in keys})
        self.statuses = sorted({status for _, status in keys})

    def stored(self) -> dict[Any, int]:
        query = {JobMetric.JOB_TYPE: {"$in": self.types}, JobMetric.STATUS: {"$in": self.statuses}}
        rows = self.store.job_metrics.find(query)
        return {
            (row[JobMetric.JOB_TYPE], row[JobMetric.STATUS]): row.get(JobMetric.TOTAL, 0)
            for row in rows
            if not self.side.by_dataset_status or row.get(JobMetric.DATASET_STATUS) == DATASET_STATUS_NORMAL
        }

    def counted(self) -> Counter[Any]:
        pipeline = on_index(
            {Job.STATUS: {"$in": self.statuses}},
            {Job.TYPE: {"$in": self.types}},
            _BY_TYPE_AND_STATUS,
        )
        return _count(self.store.jobs.aggregate(pipeline), _type_and_status)

    def selector(self, key: Any) -> dict[str, Any]:
        job_type, status = key
        return self.side.job_metric_key(job_type, status)


class _WorkerSizes(_Keys):
    total = WorkerSizeMetric.JOBS_COUNT

    def __init__(self, store: Store, side: SideCollections) -> None:
        self.store, self.side = store, side
        self.keys = {size for _, size in WORKER_SIZE_LIMITS} | {HEAVY}

    def stored(self) -> dict[Any, int]:
        rows = self.store.worker_size_metrics.find({WorkerSizeMetric.WORKER_SIZE: {"$in": sorted(self.keys)}})
        return {row[WorkerSizeMetric.WORKER_SIZE]: row.get(WorkerSizeMetric.JOBS_COUNT, 0) for row in rows}

    def counted(self) -> Counter[Any]:
        blocked = self.store.blockages.distinct(Blockage.DATASET) if BLOCKAGES_COLLECTION in self.side else []
        size = {
            "$switch": {
                "branches": [
                    {
                        "case": {
                            "$and": [{"$isNumber": f"${Job.DIFFICULTY}"}, {"$lte": [f"${Job.DIFFICULTY}", limit]}]
                        },
                        "then": name,
                    }
                    for limit, name in WORKER_SIZE_LIMITS
                ],
                "default": HEAVY,
            }
        }
        pipeline = on_index(
            {Job.STATUS: Status.WAITING},
            {Job.DATASET: {"$nin": sorted(blocked)}},
            {"$group": {ID: size, "n": {"$sum": 1}}},
        )
        return _count(self.store.jobs.aggregate(pipeline), lambda key: key)

    def selector(self, key: Any) -> dict[str, Any]:
        return {WorkerSizeMetric.WORKER_SIZE: key}


class _CacheMetrics(_Keys):
    total = CacheMetric.TOTAL

    def __init__(self, store: Store, keys: set[tuple[Any, Any, Any]]) -> None:
        self.store, self.keys = store, keys
        self.kinds = sorted({kind for kind, _, _ in keys})

    def stored(self) -> dict[Any, int]:
        rows = self.store.cache_metrics.find({CacheMetric.KIND: {"$in": self.kinds}})
        return {
            (row[CacheMetric.KIND], row.get(CacheMetric.HTTP_STATUS), row.get(CacheMetric.ERROR_CODE)): row.get(
                CacheMetric.TOTAL, 0
            )
            for row in rows
        }

    def counted(self) -> Counter[Any]:
        statuses = sorted({http_status for _, http_status, _ in self.keys}, key=repr)
        pipeline = on_index(
            {Cache.KIND: {"$in": self.kinds}},
            {Cache.HTTP_STATUS: {"$in": statuses}},
            _BY_KIND_STATUS_AND_CODE,
        )
        return _count(self.store.cache.aggregate(pipeline), _kind_status_and_code)

    def selector(self, key: Any) -> dict[str, Any]:
        kind, http_status, error_code = key
        return {CacheMetric.KIND: kind, CacheMetric.HTTP_STATUS: http_status, CacheMetric.ERROR_CODE: error_code}
