"""The shapes of the documents this project reads and writes, defined once.

Field names, status values, error codes, cache generations and default names
of the datasets-server (dataset-viewer) queue and cache. Every other module
takes its names from here, so that a rename in the deployment is a one-line
change. The deployment reads these collections through strict models that
refuse undeclared fields: :data:`JOB_FIELDS` and :data:`CACHE_GENERATIONS`
are the lists of what may be written.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping

# --- names -----------------------------------------------------------------

DEFAULT_QUEUE_DATABASE = "datasets_server_queue"
DEFAULT_CACHE_DATABASE = "datasets_server_cache"
DEFAULT_JOBS_COLLECTION = "jobsBlue"
DEFAULT_CACHE_COLLECTION = "cachedResponsesBlue"
#: Our own bookkeeping lives in collections the deployment never reads.
DEFAULT_EVENTS_COLLECTION = "zombieEvents"
DEFAULT_FAILURES_COLLECTION = "zombiePipelineFailures"

ID = "_id"


class Job:
    """Field names of a job document (early-2023 shape)."""

    TYPE = "type"
    DATASET = "dataset"
    CONFIG = "config"
    SPLIT = "split"
    UNICITY_ID = "unicity_id"
    NAMESPACE = "namespace"
    FORCE = "force"
    PRIORITY = "priority"
    STATUS = "status"
    CREATED_AT = "created_at"
    STARTED_AT = "started_at"
    FINISHED_AT = "finished_at"
    LAST_HEARTBEAT = "last_heartbeat"


#: Every top-level field a job document may carry (besides ``_id``).
JOB_FIELDS: frozenset[str] = frozenset(
    value for name, value in vars(Job).items() if name.isupper()
)


class Status:
    WAITING = "waiting"
    STARTED = "started"
    SUCCESS = "success"
    ERROR = "error"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


STATUSES: frozenset[str] = frozenset(
    value for name, value in vars(Status).items() if name.isupper()
)
FINISHED_STATUSES: frozenset[str] = STATUSES - {Status.WAITING, Status.STARTED}


class Priority:
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"


class Cache:
    """Field names of a cache entry (``cachedResponsesBlue``)."""

    KIND = "kind"
    DATASET = "dataset"
    CONFIG = "config"
    SPLIT = "split"
    HTTP_STATUS = "http_status"
    ERROR_CODE = "error_code"
    CONTENT = "content"
    DETAILS = "details"
    WORKER_VERSION = "worker_version"
    JOB_RUNNER_VERSION = "job_runner_version"
    DATASET_GIT_REVISION = "dataset_git_revision"
    PROGRESS = "progress"
    UPDATED_AT = "updated_at"
    DURATION = "duration"
    FAILED_RUNS = "failed_runs"


#: The unique key of a cache entry, in the order of the deployment's index.
CACHE_KEY = (Cache.KIND, Cache.DATASET, Cache.CONFIG, Cache.SPLIT)


class ErrorCode:
    CRASHED = "JobManagerCrashedError"
    EXCEEDED_MAX_DURATION = "JobManagerExceededMaximumDurationError"


HTTP_OK = 200
DEFAULT_ZOMBIE_HTTP_STATUS = 501  # what datasets-server writes for a killed job

class Reason:
    """Why a started job is a zombie; each reason maps to the error code users see."""

    MISSING_HEARTBEAT = "missing_heartbeat"
    NEVER_HEARTBEATED = "never_heartbeated"
    EXCEEDED_MAX_DURATION = "exceeded_max_duration"


REASONS = (Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.EXCEEDED_MAX_DURATION)
ERROR_CODE_OF_REASON = {
    Reason.MISSING_HEARTBEAT: ErrorCode.CRASHED,
    Reason.NEVER_HEARTBEATED: ErrorCode.CRASHED,
    Reason.EXCEEDED_MAX_DURATION: ErrorCode.EXCEEDED_MAX_DURATION,
}
#: The message users read in the cache entry, in our own words.
ERROR_MESSAGE_OF_CODE = {
    ErrorCode.CRASHED: "The worker running this job stopped sending heartbeats and is presumed dead; "
    "the job was stopped by the zombie cleanup.",
    ErrorCode.EXCEEDED_MAX_DURATION: "This job ran longer than the maximum duration allowed for its type "
    "and was stopped by the zombie cleanup.",
}


class Event:
    """Field names of our audit collection: one document per zombie finalization.

    The ``_id`` of an event is the job's ``_id``: inserting it is the claim that
    makes a job ours to finalize, so two cleanups never finalize the same job.
    """

    JOB = "job"  # snapshot of the job as detection saw it
    REASON = "reason"
    ERROR_CODE = "error_code"
    THRESHOLD_SECONDS = "threshold_seconds"
    POLICY = "policy"
    DETECTED_AT = "detected_at"
    FINALIZED_AT = "finalized_at"  # also the job's new finished_at
    RUN_ID = "run_id"  # the run that claimed the job
    STATE = "state"
    LEASE_OWNER = "lease_owner"  # the run driving the event now (a reconcile may take over)
    LEASE_UNTIL = "lease_until"
    CACHE_OUTCOME = "cache_outcome"
    FAILED_RUNS = "failed_runs"
    RETRY_JOB_ID = "retry_job_id"
    RETRY_OUTCOME = "retry_outcome"
    COMPLETED_AT = "completed_at"


class EventState:
    """Where a finalization stands; every step after ``claimed`` is idempotent."""

    CLAIMED = "claimed"  # ours to finalize; the job update may not have happened
    FINALIZED = "finalized"  # the job is error; cache entry and retry may be missing
    DONE = "done"


class CacheOutcome:
    WRITTEN = "written"
    SKIPPED_FRESHER = "skipped_fresher"


class RetryOutcome:
    ENQUEUED = "enqueued"
    ALREADY_QUEUED = "already_queued"
    LIMIT_REACHED = "limit_reached"
    NOT_RETRIED = "not_retried"


class Failure:
    """Field names of ``zombiePipelineFailures``: one document per failed pipeline run, ``_id`` = run id."""

    JOB_NAME = "job_name"
    PARTITION_KEY = "partition_key"
    FAILED_AT = "failed_at"
    MESSAGE = "message"
    FAILED_STEPS = "failed_steps"
    WEBHOOK_OUTCOME = "webhook_outcome"


# --- cache generations -----------------------------------------------------

_CACHE_BASE = frozenset(
    {
        Cache.KIND,
        Cache.DATASET,
        Cache.CONFIG,
        Cache.SPLIT,
        Cache.HTTP_STATUS,
        Cache.ERROR_CODE,
        Cache.CONTENT,
        Cache.DETAILS,
        Cache.DATASET_GIT_REVISION,
        Cache.UPDATED_AT,
    }
)


@dataclass(frozen=True)
class CacheGeneration:
    """One version of the cache entry model, named by the month it shipped."""

    name: str
    fields: frozenset[str]

    @property
    def version_field(self) -> str:
        if Cache.JOB_RUNNER_VERSION in self.fields:
            return Cache.JOB_RUNNER_VERSION
        return Cache.WORKER_VERSION

    def declares(self, field: str) -> bool:
        return field in self.fields


CACHE_GENERATIONS: dict[str, CacheGeneration] = {
    generation.name: generation
    for generation in (
        CacheGeneration("2023-01", _CACHE_BASE | {Cache.WORKER_VERSION}),
        CacheGeneration("2023-03", _CACHE_BASE | {Cache.JOB_RUNNER_VERSION}),
        CacheGeneration("2023-04", _CACHE_BASE | {Cache.JOB_RUNNER_VERSION, Cache.PROGRESS}),
        CacheGeneration(
            "2024-01",
            _CACHE_BASE | {Cache.JOB_RUNNER_VERSION, Cache.PROGRESS, Cache.FAILED_RUNS},
        ),
        CacheGeneration(
            "2024-07",
            _CACHE_BASE
            | {Cache.JOB_RUNNER_VERSION, Cache.PROGRESS, Cache.FAILED_RUNS, Cache.DURATION},
        ),
    )
}
OLDEST_CACHE_GENERATION = "2023-01"
NEWEST_CACHE_GENERATION = "2024-07"


def cache_generation_of(field_names: set[str]) -> CacheGeneration:
    """The oldest generation that declares every field seen in existing entries.

    mongoengine omits fields whose value is None, so absence proves little;
    presence of a field proves the generation is at least the one adding it.
    """
    for generation in CACHE_GENERATIONS.values():
        if field_names - {ID} <= generation.fields:
            return generation
    return CACHE_GENERATIONS[NEWEST_CACHE_GENERATION]


# --- reading documents of any generation -------------------------------------


def as_utc(value: Any) -> dt.datetime | None:
    """A stored date as an aware UTC datetime; None for anything that is not a date."""
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


def optional_str(document: Mapping[str, Any], field: str) -> str | None:
    """``config`` and ``split``: mongoengine stores no key for None, so missing == null."""
    return document.get(field)


def cache_key_of_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """The cache entry key a job writes to: ``kind`` is the job type."""
    return {
        Cache.KIND: job[Job.TYPE],
        Cache.DATASET: job[Job.DATASET],
        Cache.CONFIG: optional_str(job, Job.CONFIG),
        Cache.SPLIT: optional_str(job, Job.SPLIT),
    }


def runner_version_of(entry: Mapping[str, Any]) -> Any:
    """The runner version of a cache entry, whichever generation wrote it."""
    if Cache.JOB_RUNNER_VERSION in entry:
        return entry[Cache.JOB_RUNNER_VERSION]
    return entry.get(Cache.WORKER_VERSION)


def failed_runs_of(entry: Mapping[str, Any] | None) -> int:
    """Failed runs so far: the field when the generation has it, else ``details``.

    A successful entry resets the count, as the deployment does.
    """
    if not entry or entry.get(Cache.HTTP_STATUS) == HTTP_OK:
        return 0
    value = entry.get(Cache.FAILED_RUNS)
    if value is None:
        details = entry.get(Cache.DETAILS)
        value = details.get(Cache.FAILED_RUNS) if isinstance(details, Mapping) else None
    return value if isinstance(value, int) and value >= 0 else 0


def unicity_id(job_type: str, dataset: str, config: str | None, split: str | None) -> str:
    """The unicity id format of early-2023 datasets-server."""
    return f"Job[{job_type}][{dataset}][{config}][{split}]"


def namespace_of(dataset: str) -> str:
    return dataset.split("/", 1)[0]


def without_none(document: Mapping[str, Any]) -> dict[str, Any]:
    """Drop None values, as mongoengine does when it saves a document."""
    return {key: value for key, value in document.items() if value is not None}


# --- T2 suggestions (our own collection, beside the queue) --------------------

DEFAULT_SUGGESTIONS_COLLECTION = "zombieT2Suggestions"


class T2Suggestion:
    """Field names of ``zombieT2Suggestions``: one document per statistics window.

    Job types are values in the ``by_type`` array, never keys: a type name may
    hold characters MongoDB refuses in keys.
    """

    WINDOW_START = "window_start"
    WINDOW_END = "window_end"  # the _id: recomputing a window replaces its document
    COMPUTED_AT = "computed_at"
    SETTINGS = "settings"
    BY_TYPE = "by_type"
    TYPE = "type"
    SUGGESTED_T2_SECONDS = "suggested_t2_seconds"
    CURRENT_T2_SECONDS = "current_t2_seconds"
    ENOUGH_DATA = "enough_data"
    CENSORED = "censored"
    SAMPLES = "samples"
