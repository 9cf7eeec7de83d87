"""The vocabulary of the documents this project reads and writes, defined once.

Field names, status values, error codes, collection names and the shapes of our
own documents. Every other module takes its names from here, so that a rename in
the deployment is a one-line change. Which fields each *generation* of the
deployment declares lives beside, in :mod:`zombie_pipeline.queue.generations`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

# --- names -----------------------------------------------------------------

DEFAULT_QUEUE_DATABASE = "datasets_server_queue"
DEFAULT_CACHE_DATABASE = "datasets_server_cache"
DEFAULT_JOBS_COLLECTION = "jobsBlue"
DEFAULT_CACHE_COLLECTION = "cachedResponsesBlue"
#: Our own bookkeeping lives in collections the deployment never reads.
DEFAULT_EVENTS_COLLECTION = "zombieEvents"
DEFAULT_FAILURES_COLLECTION = "zombiePipelineFailures"
DEFAULT_SUGGESTIONS_COLLECTION = "zombieT2Suggestions"
#: Written by the simulator: the proof that a database's documents are ours to drop or fill.
SIMULATIONS_COLLECTION = "zombieSimulations"
#: Retries waiting for their delay to pass (a field on the deployment's jobs could not hold it).
RETRIES_COLLECTION = "zombieRetries"
#: Written by the simulated workers while they run: the one process of them a simulated queue has.
SIMULATED_WORKERS_COLLECTION = "zombieSimulatedWorkers"
#: The deployment's collections beside the queue and the cache (which generation has which: ``generations``).
LOCKS_COLLECTION = "locks"
JOB_METRICS_COLLECTION = "jobTotalMetric"
WORKER_SIZE_METRICS_COLLECTION = "workerTypeJobCounts"
PAST_JOBS_COLLECTION = "pastJobs"
BLOCKAGES_COLLECTION = "datasetBlockages"
CACHE_METRICS_COLLECTION = "cacheTotalMetric"

ID = "_id"
#: The longest type, dataset or unicity id we accept (a longer one is not a name, it is an accident).
MAX_NAME_LENGTH = 512


class Job:
    """Field names of a job document, across every generation (see ``generations.QUEUE_GENERATIONS``)."""

    TYPE = "type"
    DATASET = "dataset"
    REVISION = "revision"
    CONFIG = "config"
    SPLIT = "split"
    UNICITY_ID = "unicity_id"
    NAMESPACE = "namespace"
    FORCE = "force"
    PRIORITY = "priority"
    STATUS = "status"
    DIFFICULTY = "difficulty"
    CREATED_AT = "created_at"
    STARTED_AT = "started_at"
    FINISHED_AT = "finished_at"
    LAST_HEARTBEAT = "last_heartbeat"
    TERMINATED_AT = "terminated_at"  # the worker got SIGTERM


#: Fields of one run of a job: a re-enqueued job never inherits them.
RUN_FIELDS = frozenset(
    {Job.STATUS, Job.CREATED_AT, Job.STARTED_AT, Job.FINISHED_AT, Job.LAST_HEARTBEAT, Job.TERMINATED_AT}
)


class Status(StrEnum):
    WAITING = "waiting"
    STARTED = "started"
    SUCCESS = "success"
    ERROR = "error"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


STATUSES: frozenset[str] = frozenset(Status)
FINISHED_STATUSES: frozenset[str] = STATUSES - {Status.WAITING, Status.STARTED}


class Priority(StrEnum):
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
#: The key of a cache entry's ``content`` (and ``details``) that holds the error message users read.
CACHE_CONTENT_ERROR = "error"


class Lock:
    """Field names of ``locks`` (2023-06 on): ``_id`` is the lock's key, a job's ``unicity_id`` for its start."""

    OWNER = "owner"
    TTL = "ttl"
    JOB_ID = "job_id"  # the owner's name before 2023-06-26
    CREATED_AT = "created_at"
    UPDATED_AT = "updated_at"


class WorkersClaim:
    """Field names of ``zombieSimulatedWorkers``: which process runs a simulated queue's workers, renewed meanwhile."""

    OWNER = "owner"
    PID = "pid"
    HOST = "host"
    STARTED_AT = "started_at"
    RENEWED_AT = "renewed_at"


class JobMetric:
    """Field names of ``jobTotalMetric``: started, waiting ... jobs per type, kept in step by the deployment."""

    JOB_TYPE = "job_type"
    STATUS = "status"
    DATASET_STATUS = "dataset_status"  # from 2024-07-31; incremental updates always use "normal"
    TOTAL = "total"
    CREATED_AT = "created_at"


DATASET_STATUS_NORMAL = "normal"


class WorkerSizeMetric:
    """Field names of ``workerTypeJobCounts``: waiting jobs per worker size (the autoscaler reads it)."""

    WORKER_SIZE = "worker_size"
    JOBS_COUNT = "jobs_count"
    CREATED_AT = "created_at"


class PastJob:
    """Field names of ``pastJobs``: the runs of the last hour, for the deployment's rate limiter."""

    DATASET = "dataset"
    DURATION = "duration"  # whole seconds
    FINISHED_AT = "finished_at"


class Blockage:
    """Field names of ``datasetBlockages``: datasets whose jobs are not picked for a while."""

    DATASET = "dataset"
    BLOCKED_AT = "blocked_at"


class CacheMetric:
    """Field names of ``cacheTotalMetric``: cache entries per (kind, http_status, error_code)."""

    KIND = "kind"
    HTTP_STATUS = "http_status"
    ERROR_CODE = "error_code"
    TOTAL = "total"
    CREATED_AT = "created_at"


class ErrorCode(StrEnum):
    CRASHED = "JobManagerCrashedError"
    EXCEEDED_MAX_DURATION = "JobManagerExceededMaximumDurationError"


HTTP_OK = 200
DEFAULT_ZOMBIE_HTTP_STATUS = 501  # what datasets-server writes for a killed job


class Reason(StrEnum):
    """Why a started job is a zombie; each reason maps to the error code users see."""

    MISSING_HEARTBEAT = "missing_heartbeat"
    NEVER_HEARTBEATED = "never_heartbeated"
    TERMINATED = "terminated"  # SIGTERM recorded, then silence
    EXCEEDED_MAX_DURATION = "exceeded_max_duration"


REASONS = tuple(Reason)
ERROR_CODE_OF_REASON = {
    Reason.MISSING_HEARTBEAT: ErrorCode.CRASHED,
    Reason.NEVER_HEARTBEATED: ErrorCode.CRASHED,
    Reason.TERMINATED: ErrorCode.CRASHED,
    Reason.EXCEEDED_MAX_DURATION: ErrorCode.EXCEEDED_MAX_DURATION,
}
_CRASHED_MESSAGE = "The worker running this job stopped sending heartbeats and is presumed dead; the job was stopped by the zombie cleanup."
#: The message users read in the cache entry, in our own words.
ERROR_MESSAGE_OF_REASON = {
    Reason.MISSING_HEARTBEAT: _CRASHED_MESSAGE,
    Reason.NEVER_HEARTBEATED: _CRASHED_MESSAGE,
    Reason.TERMINATED: "The worker running this job was terminated by its platform (for instance to free resources) "
    "and did not finish it; the job was stopped by the zombie cleanup and may run again later.",
    Reason.EXCEEDED_MAX_DURATION: "This job ran longer than the maximum duration allowed for its type "
    "and was stopped by the zombie cleanup.",
}


# --- our audit trail ----------------------------------------------------------


class Event:
    """Field names of our audit collection: one document per zombie finalization.

    The ``_id`` of an event is the job's ``_id``: inserting it is the claim that
    makes a job ours to finalize, so two cleanups never finalize the same job.
    """

    JOB = "job"  # snapshot of the job as detection saw it
    REASON = "reason"
    ERROR_CODE = "error_code"
    THRESHOLD_SECONDS = "threshold_seconds"
    PAST_MAX_DURATION = "past_max_duration"  # a dead job that had also run longer than its T2 (still a crash)
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
    QUEUE_GENERATION = "queue_generation"  # the generation the finalization follows, to its end
    PREVIOUS_ENTRY = "previous_entry"  # what the cache knew before our error entry (small fields only)
    EFFECTS = "effects"  # what was done around the finish, as the deployment does it (counters, locks, ...)
    RETRY_DUE_AT = "retry_due_at"  # a retry scheduled after a delay: when it becomes due
    COMPENSATION_STATE = "compensation_state"  # pending, done or failed: the zombie's side effects undone?
    COMPENSATIONS = "compensations"  # one CompensationEntry per action
    COMPENSATION_LEASE_UNTIL = "compensation_lease_until"  # a run is running its actions until then
    COMPENSATION_LEASE_OWNER = "compensation_lease_owner"


class EventState(StrEnum):
    """Where a finalization stands; every step after ``claimed`` is idempotent."""

    CLAIMED = "claimed"  # ours to finalize; the job may still be started
    FINALIZED = "finalized"  # the job is finished (error, or deleted) by us; the retry may be missing
    DONE = "done"


class CacheOutcome(StrEnum):
    WRITTEN = "written"
    SKIPPED_FRESHER = "skipped_fresher"


class Effect(StrEnum):
    """What the deployment does around a finish, as recorded on the event once done."""

    JOB_METRICS = "job_metrics"  # jobTotalMetric: started -1 (and error +1 where finished jobs are kept)
    PAST_JOB = "past_job"  # a pastJobs record (runs of at least 30 s)
    BLOCKED_DATASET = "blocked_dataset"  # a datasetBlockages entry, worker-size counters lowered
    LOCKS_RELEASED = "locks_released"


class RetryOutcome(StrEnum):
    ENQUEUED = "enqueued"
    SCHEDULED = "scheduled"  # enqueued by a later run, once its delay has passed
    ALREADY_QUEUED = "already_queued"
    LIMIT_REACHED = "limit_reached"
    NOT_RETRIED = "not_retried"


class ScheduledRetry:
    """Field names of ``zombieRetries``: one document per delayed retry, ``_id`` = the retry job's ``_id``."""

    JOB = "job"  # the waiting job to insert, exactly as it will be inserted
    EVENT_ID = "event_id"
    QUEUE_GENERATION = "queue_generation"
    DUE_AT = "due_at"
    STATE = "state"
    DECIDED_AT = "decided_at"


class ScheduledState(StrEnum):
    PENDING = "pending"
    ENQUEUED = "enqueued"
    ALREADY_QUEUED = "already_queued"  # a twin waited or ran when it became due


class CompensationState(StrEnum):
    PENDING = "pending"  # still to run, or failed and tried again by later runs up to the policy's attempts
    DONE = "done"
    FAILED = "failed"  # given up on: for an operator


class CompensationEntry:
    """Field names of one action's record in an event's ``compensations``."""

    NAME = "name"
    STATE = "state"
    ATTEMPTS = "attempts"
    LAST_ERROR = "last_error"
    DONE_AT = "done_at"


#: A job document as detection read it: only the fields its generation has are present (the :class:`Job` names).
JobSnapshot = dict[str, Any]
#: One document of ``zombieEvents``: its keys are the :class:`Event` names, declared there once.
ZombieEvent = dict[str, Any]


class Failure:
    """Field names of ``zombiePipelineFailures``: one document per failed pipeline run, ``_id`` = run id."""

    JOB_NAME = "job_name"
    PARTITION_KEY = "partition_key"
    FAILED_AT = "failed_at"
    MESSAGE = "message"
    FAILED_STEPS = "failed_steps"
    WEBHOOK_OUTCOME = "webhook_outcome"


class T2Suggestion:
    """Field names of ``zombieT2Suggestions``: one document per statistics window.

    Job types are values in the ``by_type`` array, never keys: a type name may
    hold characters MongoDB refuses in keys.
    """

    WINDOW_START = "window_start"
    WINDOW_END = "window_end"  # the _id: recomputing a window replaces its document, unless it covers fewer days
    DAYS_PRESENT = "days_present"  # days of the window whose tallies were computed
    DAYS_EXPECTED = "days_expected"
    COMPUTED_AT = "computed_at"
    SETTINGS = "settings"
    BY_TYPE = "by_type"
    TYPE = "type"
    SUGGESTED_T2_SECONDS = "suggested_t2_seconds"
    CURRENT_T2_SECONDS = "current_t2_seconds"
    ENOUGH_DATA = "enough_data"
    CENSORED = "censored"
    SAMPLES = "samples"


# --- reading and writing values of any generation ------------------------------


def utc_now() -> dt.datetime:
    """Now at BSON's millisecond precision: a stamp written and read back compares equal."""
    return truncate_ms(dt.datetime.now(dt.UTC))


def truncate_ms(moment: dt.datetime) -> dt.datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def as_utc(value: Any) -> dt.datetime | None:
    """A stored date as an aware UTC datetime; None for anything that is not a date."""
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def utc(value: Any) -> dt.datetime:
    """:func:`as_utc` of a value already checked to be a date (a well-formed job's ``started_at``)."""
    moment = as_utc(value)
    if moment is None:
        raise TypeError(f"expected a date, got {type(value).__name__}")
    return moment


def name_problem(field: str, value: Any) -> str | None:
    """Why ``value`` cannot be used as a type, dataset or unicity id, or None.

    Such names only ever travel as values in our queries, but one that starts
    with ``$`` or is absurdly long is a sign of a broken writer, not a job.
    """
    if not isinstance(value, str) or not value:
        return f"{field} is missing or not a non-empty string"
    if len(value) > MAX_NAME_LENGTH:
        return f"{field} is longer than {MAX_NAME_LENGTH} characters"
    if value.startswith("$"):
        return f"{field} starts with '$'"
    return None


def job_type_problem(value: Any) -> str | None:
    """Why ``value`` is not a job type we act on (it also names a Dagster partition and a metadata key)."""
    problem = name_problem(Job.TYPE, value)
    if problem:
        return problem
    if "." in value:
        return "type contains a dot"
    if not value.isprintable():
        return "type contains a control character"
    return None


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


def job_row(job_id: Any, job: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """A job as one row of a table (dry-run evidence, finalized jobs, check offenders)."""
    return {
        "job_id": str(job_id),
        "type": job.get(Job.TYPE),
        "dataset": job.get(Job.DATASET),
        "config": job.get(Job.CONFIG),
        "split": job.get(Job.SPLIT),
        **extra,
    }


def namespace_of(dataset: str) -> str:
    return dataset.split("/", 1)[0]


def without_none(document: Mapping[str, Any]) -> dict[str, Any]:
    """Drop None values, as mongoengine does when it saves a document."""
    return {key: value for key, value in document.items() if value is not None}
