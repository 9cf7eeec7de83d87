"""One job and one cache entry exactly as a generation's deployment stores them: the fixtures' building blocks.

Only the fields the generation declares, None values left out as mongoengine
leaves them out, so the deployment's strict models read what the tests write.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from bson import ObjectId

from zombie_pipeline.queue.cache import CACHE_CONTENT_ERROR, HTTP_OK, Cache, CacheEntry
from zombie_pipeline.queue.generations import (
    CACHE_GENERATIONS,
    NEWEST_QUEUE_GENERATION,
    QUEUE_GENERATIONS,
    QueueGeneration,
)
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Priority, Status, namespace_of, without_none
from zombie_pipeline.queue.times import truncate_ms, utc_now


def job_document(
    job_type: str = "/splits",
    dataset: str = "user/dataset",
    config: str | None = None,
    split: str | None = None,
    status: str = Status.STARTED,
    generation: QueueGeneration | str = NEWEST_QUEUE_GENERATION,
    revision: str = "abc123",
    difficulty: int = 50,
    force: bool = False,
    priority: str = Priority.NORMAL,
    created_at: dt.datetime | None = None,
    started_at: dt.datetime | None = None,
    finished_at: dt.datetime | None = None,
    last_heartbeat: dt.datetime | None = None,
    terminated_at: dt.datetime | None = None,
    **extra: Any,
) -> JobDocument:
    """One job exactly as ``generation``'s deployment stores it (None values omitted, as mongoengine does)."""
    generation = QUEUE_GENERATIONS[generation] if isinstance(generation, str) else generation
    created_at = truncate_ms(created_at or started_at or utc_now())
    values = {
        Job.TYPE: job_type,
        Job.DATASET: dataset,
        Job.REVISION: revision,
        Job.CONFIG: config,
        Job.SPLIT: split,
        Job.UNICITY_ID: generation.unicity_id(job_type, dataset, revision, config, split),
        Job.NAMESPACE: namespace_of(dataset),
        Job.FORCE: force,
        Job.PRIORITY: priority,
        Job.STATUS: status,
        Job.DIFFICULTY: difficulty,
        Job.CREATED_AT: created_at,
        Job.STARTED_AT: truncate_ms(started_at) if started_at else None,
        Job.FINISHED_AT: truncate_ms(finished_at) if finished_at else None,
        Job.LAST_HEARTBEAT: truncate_ms(last_heartbeat) if last_heartbeat else None,
        Job.TERMINATED_AT: truncate_ms(terminated_at) if terminated_at else None,
    }
    document: dict[str, Any] = {ID: extra.pop(ID, None) or ObjectId()}
    document.update(without_none({name: value for name, value in values.items() if generation.declares(name)}))
    document.update(extra)
    return cast(JobDocument, document)


def cache_document(
    job: JobDocument,
    updated_at: dt.datetime,
    http_status: int = HTTP_OK,
    error_code: str | None = None,
    generation: str = "2024-07",
    failed_runs: int = 0,
    duration: float = 12.5,
    content: dict[str, Any] | None = None,
) -> CacheEntry:
    """The cache entry a worker would have written for ``job``, in ``generation``'s fields."""
    failed = http_status != HTTP_OK
    entry = {
        Cache.KIND: job[Job.TYPE],
        Cache.DATASET: job[Job.DATASET],
        Cache.CONFIG: job.get(Job.CONFIG),
        Cache.SPLIT: job.get(Job.SPLIT),
        Cache.HTTP_STATUS: http_status,
        Cache.ERROR_CODE: error_code,
        Cache.CONTENT: content
        if content is not None
        else ({CACHE_CONTENT_ERROR: "failed"} if failed else {"result": "ok"}),
        Cache.DETAILS: {CACHE_CONTENT_ERROR: "failed", Cache.FAILED_RUNS: failed_runs} if failed else {},
        Cache.WORKER_VERSION: "2.0.0",
        Cache.JOB_RUNNER_VERSION: 2,
        Cache.DATASET_GIT_REVISION: job.get(Job.REVISION, "abc123"),
        Cache.PROGRESS: 1.0,
        Cache.UPDATED_AT: truncate_ms(updated_at),
        Cache.DURATION: duration,
        Cache.FAILED_RUNS: failed_runs,
    }
    return CACHE_GENERATIONS[generation].keep_declared(entry)
