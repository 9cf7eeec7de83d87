"""Reading cache entries of any generation: the entries of a batch of jobs in one indexed read, and their fields."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from zombie_pipeline.queue.documents import (
    CACHE_KEY,
    ID,
    Cache,
    CacheEntry,
    Event,
    Job,
    ZombieEvent,
    as_utc,
    cache_key_of_job,
    utc,
)
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.store import READ_BATCH

#: A cache entry's unique key, (kind, dataset, config, split): what a job writes to.
CacheKey = tuple[Any, ...]
#: Our own keys in an error entry's ``details`` (a free dictionary in every generation).
DETAIL_JOB_ID = "job_id"
DETAIL_PREVIOUS = "previous_entry"
DETAIL_QUARANTINED = "quarantined"


def key_of(document: Mapping[str, Any]) -> CacheKey:
    """The cache key of an entry, or of ``cache_key_of_job``'s result, as a tuple."""
    return tuple(document.get(name) for name in CACHE_KEY)


def entries_of_jobs(
    cache: Collection[CacheEntry],
    jobs: Iterable[Mapping[str, Any]],
    projection: Mapping[str, Any],
    session: ClientSession | None = None,
) -> dict[CacheKey, CacheEntry]:
    """The current entry of each job that has one, by key: one read for the batch, whatever its job types.

    The datasets first, then the kinds (``mongo.on_index``): MongoDB plans the two as one range of the
    deployment's ``(dataset, kind, http_status)`` index; the embedded server reads the datasets' entries
    on that index and filters them (a single ``$in`` on both makes it scan the cache: docs/benchmarks.md).
    Type names are only ever values.
    """
    if any(projection.values()):  # fields named to be returned: the key must come back too
        projection = {**projection, **dict.fromkeys(CACHE_KEY, 1)}
    keys = {key_of(cache_key_of_job(job)) for job in jobs}
    if not keys:
        return {}
    datasets = sorted({dataset for _, dataset, _, _ in keys})
    kinds = sorted({kind for kind, _, _, _ in keys})
    pipeline = on_index(
        {Cache.DATASET: {"$in": datasets}}, {Cache.KIND: {"$in": kinds}}, {"$project": dict(projection)}
    )
    found: dict[CacheKey, CacheEntry] = {}
    for entry in cache.aggregate(pipeline, session=session, batchSize=READ_BATCH):
        if key_of(entry) in keys:
            found[key_of(entry)] = entry
    return found


def runner_version_of(entry: Mapping[str, Any]) -> Any:
    """The runner version of a cache entry, whichever generation wrote it."""
    if Cache.JOB_RUNNER_VERSION in entry:
        return entry[Cache.JOB_RUNNER_VERSION]
    return entry.get(Cache.WORKER_VERSION)


def stored_failed_runs(entry: Mapping[str, Any] | None) -> int:
    """The failed runs an entry records: its field where the generation has one, else in ``details``."""
    if not entry:
        return 0
    value = entry.get(Cache.FAILED_RUNS)
    if value is None:
        details = entry.get(Cache.DETAILS)
        value = details.get(Cache.FAILED_RUNS) if isinstance(details, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def failed_runs_after_crash(previous: Mapping[str, Any] | None, job: Mapping[str, Any]) -> int:
    """``failed_runs`` of the error entry of a crashed ``job``, as the deployment counts it.

    The previous entry's count carries over when it is about the same revision
    of the dataset (or the job carries no revision); a success does not reset it.
    """
    return carried_failed_runs(previous, job) + 1


def carried_failed_runs(previous: Mapping[str, Any] | None, job: Mapping[str, Any]) -> int:
    """The failed runs ``job``'s error entry starts from: the previous entry's, if about the same revision."""
    if not previous:
        return 0
    revision = job.get(Job.REVISION)
    same_revision = revision is None or previous.get(Cache.DATASET_GIT_REVISION) == revision
    return stored_failed_runs(previous) if same_revision else 0


def written_for(entry: Mapping[str, Any] | None, event: ZombieEvent) -> bool:
    """Whether ``entry`` is the error entry written for this event's job (by this or an earlier attempt)."""
    if entry is None:
        return False
    details = entry.get(Cache.DETAILS)
    return (
        isinstance(details, Mapping)
        and details.get(DETAIL_JOB_ID) == str(event[ID])
        and entry.get(Cache.ERROR_CODE) == event[Event.ERROR_CODE]
    )


def is_fresher(entry: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """An entry updated after the zombie started holds a newer result than the zombie could give."""
    updated_at = as_utc(entry.get(Cache.UPDATED_AT))
    return updated_at is not None and updated_at > utc(job[Job.STARTED_AT])
