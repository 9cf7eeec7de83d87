"""The 2023 way of killing zombies, re-implemented for comparison only (never use it).

What datasets-server's queue library and worker loop did in 2023, as the
datasets-server reference notes shared with the team describe it,
written here in our own words with plain pymongo:

1. **Load every started job**, whole documents, through one cursor (the
   deployment iterated ``Job.objects(status="started")``): the cost grows with
   the started jobs, and every field of every started job crosses the wire.
2. **Filter in Python**: a job is a zombie when its last heartbeat is older
   than the timeout, or when it never beat and started before the timeout; a
   job running past the maximum duration is killed too. (In the deployment the
   long-job check ran in each worker for its own job; it is folded into the
   same loop here so that both contenders finalize exactly the same jobs.)
3. **One conditional update per zombie**: ``status`` still ``started`` ->
   ``error`` with ``finished_at`` = now.
4. **One cache upsert per zombie**, on the entry's unique key, setting every
   field of the error response (501, ``JobManagerCrashedError`` or
   ``JobManagerExceededMaximumDurationError``) and the *current* runner version,
   whatever step 3 did: when the update matched nothing (the job finished in
   between, or another killer got there first) the entry is rewritten anyway.

No claim, no audit, no retries, no batching: ``2 x zombies + 1 + getMores``
commands per pass.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pymongo.collection import Collection

from zombie_pipeline.queue.cache import DEFAULT_ZOMBIE_HTTP_STATUS, Cache, ErrorCode
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.times import as_utc

#: The messages the 2023 deployment wrote (quoted from the reference notes).
CRASHED_MESSAGE = "Job manager crashed while running this job (missing heartbeats)."
EXCEEDED_MESSAGE = "Job manager was killed while running this job (job exceeded maximum duration)."
#: The killer stamped the version of the runner doing the killing, not the job's.
CURRENT_RUNNER_VERSION = 1


@dataclass
class BaselineReport:
    started_loaded: int = 0
    zombies: list[Any] = field(default_factory=list)  # job ids, in load order
    jobs_updated: int = 0  # conditional updates that changed a job
    cache_writes: int = 0  # upserts sent (one per zombie, whatever the update did)
    by_error_code: dict[str, int] = field(default_factory=dict)


def is_zombie(
    job: dict[str, Any], now: dt.datetime, heartbeat_timeout_seconds: int, max_duration_seconds: int
) -> str | None:
    """The error code a started job is killed with, or None: the 2023 rules, evaluated in Python."""
    started_at = as_utc(job.get(Job.STARTED_AT))
    last_heartbeat = as_utc(job.get(Job.LAST_HEARTBEAT))
    if started_at is not None and now - started_at > dt.timedelta(seconds=max_duration_seconds):
        return ErrorCode.EXCEEDED_MAX_DURATION
    timeout = dt.timedelta(seconds=heartbeat_timeout_seconds)
    if last_heartbeat is not None:
        return ErrorCode.CRASHED if now - last_heartbeat > timeout else None
    if started_at is not None and now - started_at > timeout:
        return ErrorCode.CRASHED
    return None


def kill_zombies_2023(
    jobs: Collection,
    cache: Collection,
    now: dt.datetime,
    heartbeat_timeout_seconds: int = 300,
    max_duration_seconds: int = 1200,
    http_status: int = DEFAULT_ZOMBIE_HTTP_STATUS,
) -> BaselineReport:
    """One pass of the 2023 killer over the queue and the cache."""
    report = BaselineReport()
    zombies: list[tuple[dict[str, Any], str]] = []
    for job in jobs.find({Job.STATUS: Status.STARTED}):  # whole documents, default batches
        report.started_loaded += 1
        error_code = is_zombie(job, now, heartbeat_timeout_seconds, max_duration_seconds)
        if error_code is not None:
            zombies.append((job, error_code))
    for job, error_code in zombies:
        killed_at = dt.datetime.now(dt.UTC)
        result = jobs.update_one(
            {ID: job[ID], Job.STATUS: Status.STARTED},
            {"$set": {Job.STATUS: Status.ERROR, Job.FINISHED_AT: killed_at}},
        )
        report.jobs_updated += result.modified_count
        # Written whatever the update did: the weakness the compare-and-set design removes.
        message = EXCEEDED_MESSAGE if error_code == ErrorCode.EXCEEDED_MAX_DURATION else CRASHED_MESSAGE
        cache.update_one(
            {
                Cache.KIND: job[Job.TYPE],
                Cache.DATASET: job[Job.DATASET],
                Cache.CONFIG: job.get(Job.CONFIG),
                Cache.SPLIT: job.get(Job.SPLIT),
            },
            {
                "$set": {
                    Cache.HTTP_STATUS: http_status,
                    Cache.ERROR_CODE: error_code,
                    Cache.CONTENT: {"error": message},
                    Cache.DETAILS: {"error": message},
                    Cache.JOB_RUNNER_VERSION: CURRENT_RUNNER_VERSION,
                    Cache.PROGRESS: 1.0,
                    Cache.UPDATED_AT: killed_at,
                }
            },
            upsert=True,
        )
        report.cache_writes += 1
        report.zombies.append(job[ID])
        report.by_error_code[error_code] = report.by_error_code.get(error_code, 0) + 1
    return report
