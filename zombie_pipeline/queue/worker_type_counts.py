"""The deployment's ``workerTypeJobCounts``: waiting jobs per worker size, which its autoscaler reads."""

from __future__ import annotations

from typing import Any, Final

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
