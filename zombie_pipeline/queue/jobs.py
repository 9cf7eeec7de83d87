"""The deployment's jobs (``jobsBlue``): their fields in every generation, their statuses, the names they carry.

Which fields each generation declares is the table in :mod:`zombie_pipeline.queue.generations`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final, TypedDict

from bson import ObjectId

DEFAULT_QUEUE_DATABASE = "datasets_server_queue"
DEFAULT_JOBS_COLLECTION = "jobsBlue"

ID: Final = "_id"

#: The longest type, dataset or unicity id we accept (a longer one is not a name, it is an accident).
MAX_NAME_LENGTH = 512


class Job:
    """Field names of a job document, across every generation (see ``generations.QUEUE_GENERATIONS``)."""

    TYPE: Final = "type"
    DATASET: Final = "dataset"
    REVISION: Final = "revision"
    CONFIG: Final = "config"
    SPLIT: Final = "split"
    UNICITY_ID: Final = "unicity_id"
    NAMESPACE: Final = "namespace"
    FORCE: Final = "force"
    PRIORITY: Final = "priority"
    STATUS: Final = "status"
    DIFFICULTY: Final = "difficulty"
    CREATED_AT: Final = "created_at"
    STARTED_AT: Final = "started_at"
    FINISHED_AT: Final = "finished_at"
    LAST_HEARTBEAT: Final = "last_heartbeat"
    TERMINATED_AT: Final = "terminated_at"  # the worker got SIGTERM


#: Fields of one run of a job: a re-enqueued job never inherits them.
RUN_FIELDS = frozenset(
    {Job.STATUS, Job.CREATED_AT, Job.STARTED_AT, Job.FINISHED_AT, Job.LAST_HEARTBEAT, Job.TERMINATED_AT}
)


class JobDocument(TypedDict, total=False):
    """A job document, the fields of every generation (:class:`Job` names them; which ones a generation has:
    ``generations.QUEUE_GENERATIONS``). Read with a projection, it holds only what was asked for."""

    _id: ObjectId
    type: str
    dataset: str
    revision: str
    config: str | None
    split: str | None
    unicity_id: str
    namespace: str
    force: bool
    priority: str
    status: str
    difficulty: int
    created_at: dt.datetime
    started_at: dt.datetime
    finished_at: dt.datetime | None
    last_heartbeat: dt.datetime | None
    terminated_at: dt.datetime | None


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


#: The deployment's own constants (libcommon/constants.py): a failed run raises the next run's difficulty by this,
#: up to the maximum.
DIFFICULTY_BONUS_BY_FAILED_RUNS = 20

DIFFICULTY_MAX = 100

#: Its executors look at their own job's duration every 0.5-1.5 x killLongJobIntervalSeconds (the chart: 60 s).
KILL_LONG_JOB_CHECK_SECONDS = 90

#: A job document as detection read it: only the fields its generation has are present.
JobSnapshot = JobDocument


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
