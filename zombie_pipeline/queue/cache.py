"""The deployment's cache (``cachedResponsesBlue``, ``cacheTotalMetric``): the fields of an entry, its key, the error
codes a killed job's entry carries.

Reading entries of any generation is :mod:`zombie_pipeline.queue.cache_entries`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final, TypedDict

from bson import ObjectId

from zombie_pipeline.queue.jobs import Job

DEFAULT_CACHE_DATABASE = "datasets_server_cache"
DEFAULT_CACHE_COLLECTION = "cachedResponsesBlue"
CACHE_METRICS_COLLECTION = "cacheTotalMetric"


class Cache:
    """Field names of a cache entry (``cachedResponsesBlue``)."""

    KIND: Final = "kind"
    DATASET: Final = "dataset"
    CONFIG: Final = "config"
    SPLIT: Final = "split"
    HTTP_STATUS: Final = "http_status"
    ERROR_CODE: Final = "error_code"
    CONTENT: Final = "content"
    DETAILS: Final = "details"
    WORKER_VERSION: Final = "worker_version"
    JOB_RUNNER_VERSION: Final = "job_runner_version"
    DATASET_GIT_REVISION: Final = "dataset_git_revision"
    PROGRESS: Final = "progress"
    UPDATED_AT: Final = "updated_at"
    DURATION: Final = "duration"
    FAILED_RUNS: Final = "failed_runs"


class CacheEntry(TypedDict, total=False):
    """A cache entry, the fields of every generation (:class:`Cache` names them; which ones a generation has:
    ``generations.CACHE_GENERATIONS``)."""

    _id: ObjectId
    kind: str
    dataset: str
    config: str | None
    split: str | None
    http_status: int
    error_code: str | None
    content: dict[str, Any]
    details: dict[str, Any]
    worker_version: str
    job_runner_version: int
    dataset_git_revision: str | None
    progress: float
    updated_at: dt.datetime
    duration: float
    failed_runs: int


#: The unique key of a cache entry, in the order of the deployment's index.
CACHE_KEY = (Cache.KIND, Cache.DATASET, Cache.CONFIG, Cache.SPLIT)

#: The key of a cache entry's ``content`` (and ``details``) that holds the error message users read.
CACHE_CONTENT_ERROR = "error"


class CacheMetric:
    """Field names of ``cacheTotalMetric``: cache entries per (kind, http_status, error_code)."""

    KIND: Final = "kind"
    HTTP_STATUS: Final = "http_status"
    ERROR_CODE: Final = "error_code"
    TOTAL: Final = "total"
    CREATED_AT: Final = "created_at"


class ErrorCode(StrEnum):
    CRASHED = "JobManagerCrashedError"
    EXCEEDED_MAX_DURATION = "JobManagerExceededMaximumDurationError"


HTTP_OK = 200

DEFAULT_ZOMBIE_HTTP_STATUS = 501  # what datasets-server writes for a killed job

#: The deployment's backfill re-runs a crashed job while its failed runs are below its error code's limit
#: (libcommon/constants.py).
DEPLOYMENT_MAX_FAILED_RUNS = {ErrorCode.CRASHED: 3}


def cache_key_of_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """The cache entry key a job writes to: ``kind`` is the job type.

    mongoengine stores no key for a None ``config`` or ``split``: missing and null are one.
    """
    return {
        Cache.KIND: job[Job.TYPE],
        Cache.DATASET: job[Job.DATASET],
        Cache.CONFIG: job.get(Job.CONFIG),
        Cache.SPLIT: job.get(Job.SPLIT),
    }
