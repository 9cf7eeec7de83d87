"""Reading cache entries of any generation: the entries of a batch of jobs in one indexed read, and their fields."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from zombie_pipeline.queue.audit_documents import Event, ZombieEvent
from zombie_pipeline.queue.cache import CACHE_KEY, HTTP_OK, Cache, CacheEntry, cache_key_of_job
from zombie_pipeline.queue.generations import FailedRunsRule
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.store import READ_BATCH
from zombie_pipeline.queue.times import as_utc, utc

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


def step_version(cache: Collection[CacheEntry], kind: str, session: ClientSession | None = None) -> int | None:
    """The ``job_runner_version`` of the kind's newest successful entry: one the deployment's runner of the step wrote.

    A crashed job's entry carries the version of its step in the deployment's processing graph, which only the
    deployment knows; its cache shows it where a run of the step succeeded (the cleanup's own entries are errors).
    Newest by ``_id``: one point read on the deployment's ``(kind, http_status, _id)`` index (declared from 2023-07;
    ``(kind, _id)`` before). None for a kind without a successful entry.
    """
    newest = cache.find(
        {Cache.KIND: kind, Cache.HTTP_STATUS: HTTP_OK, Cache.JOB_RUNNER_VERSION: {"$type": "number"}},
        {Cache.JOB_RUNNER_VERSION: 1},
        session=session,
    )
    for entry in newest.sort(ID, -1).limit(1):
        return int(entry[Cache.JOB_RUNNER_VERSION])
    return None


def current_runner_version(previous: Mapping[str, Any] | None, step_version: int | None) -> int | None:
    """The ``job_runner_version`` the deployment writes on a crashed job's entry (its step's version now), as far as
    the cache shows it: the higher of the step's newest success's and the key's previous entry's (a version only
    grows); None when neither has one."""
    known = [step_version, (previous or {}).get(Cache.JOB_RUNNER_VERSION)]
    versions = [
        int(version) for version in known if isinstance(version, (int, float)) and not isinstance(version, bool)
    ]
    return max(versions) if versions else None


def stored_failed_runs(entry: Mapping[str, Any] | None) -> int:
    """The failed runs an entry records: its field where the generation has one, else in ``details``."""
    if not entry:
        return 0
    value = entry.get(Cache.FAILED_RUNS)
    if value is None:
        details = entry.get(Cache.DETAILS)
        value = details.get(Cache.FAILED_RUNS) if isinstance(details, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def failed_runs_after_crash(
    previous: Mapping[str, Any] | None, job: Mapping[str, Any], rule: FailedRunsRule = FailedRunsRule.EVERY_FAILURE
) -> int:
    """``failed_runs`` of the error entry of a crashed ``job``, as the deployment of ``rule``'s time counts it.

    Today's: the previous entry's count carries over when it is about the same revision of the dataset (or
    the job carries no revision), plus one; a success does not reset it. Until 2026-05: the same count plus
    one when that entry is about the same revision, else 0 (a first entry included).
    """
    if rule is FailedRunsRule.SAME_REVISION_ELSE_ZERO and not _about_the_same_revision(previous, job):
        return 0
    return carried_failed_runs(previous, job) + 1


def carried_failed_runs(previous: Mapping[str, Any] | None, job: Mapping[str, Any]) -> int:
    """The failed runs ``job``'s error entry starts from: the previous entry's, if about the same revision."""
    return stored_failed_runs(previous) if _about_the_same_revision(previous, job) else 0


def _about_the_same_revision(previous: Mapping[str, Any] | None, job: Mapping[str, Any]) -> bool:
    if not previous:
        return False
    revision = job.get(Job.REVISION)
    return revision is None or previous.get(Cache.DATASET_GIT_REVISION) == revision


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
