"""The deployment's ``workerTypeJobCounts``: waiting jobs per worker size, which its autoscaler reads, and its writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pymongo import UpdateOne
from pymongo.client_session import ClientSession
from pymongo.collection import Collection

WORKER_SIZE_METRICS_COLLECTION = "workerTypeJobCounts"


class WorkerSizeMetric:
    """Field names of ``workerTypeJobCounts``: waiting jobs per worker size (the autoscaler reads it)."""

    WORKER_SIZE: Final = "worker_size"
    JOBS_COUNT: Final = "jobs_count"
    CREATED_AT: Final = "created_at"


#: Worker sizes by job difficulty, as the deployment counts its waiting jobs: up to 40 light, up to 70 medium.
WORKER_SIZE_LIMITS = ((40, "light"), (70, "medium"))

HEAVY = "heavy"


def worker_size(difficulty: Any) -> str:
    """The worker size ``workerTypeJobCounts`` counts a job of ``difficulty`` under."""
    for limit, size in WORKER_SIZE_LIMITS:
        if isinstance(difficulty, (int, float)) and difficulty <= limit:
            return size
    return HEAVY


def add_to_counts(counts: Collection[Any], changes: Mapping[str, int], session: ClientSession | None = None) -> None:
    """Move the waiting jobs counted per worker size by ``changes``, in one command (a size not counted yet is)."""
    operations = [
        UpdateOne({WorkerSizeMetric.WORKER_SIZE: size}, {"$inc": {WorkerSizeMetric.JOBS_COUNT: change}}, upsert=True)
        for size, change in sorted(changes.items())
        if change
    ]
    if operations:
        counts.bulk_write(operations, ordered=False, session=session)
