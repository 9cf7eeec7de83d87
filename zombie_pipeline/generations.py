"""The generations of the deployment's documents: which fields each declares, and how to tell them apart.

The deployment loads its collections through strict models that refuse
undeclared fields, so what we may write depends on the generation a deployment
runs. The cleanup and the simulator ask this module; none of them branches on a
generation name by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from zombie_pipeline.documents import HTTP_OK, ID, STATUSES, Cache, Job

# --- queue generations -----------------------------------------------------


@dataclass(frozen=True)
class QueueGeneration:
    """One version of the job model, named by the month it shipped."""

    name: str
    job_fields: frozenset[str]
    statuses: frozenset[str]


_JOB_2023_01 = frozenset(
    {
        Job.TYPE,
        Job.DATASET,
        Job.CONFIG,
        Job.SPLIT,
        Job.UNICITY_ID,
        Job.NAMESPACE,
        Job.FORCE,
        Job.PRIORITY,
        Job.STATUS,
        Job.CREATED_AT,
        Job.STARTED_AT,
        Job.FINISHED_AT,
        Job.LAST_HEARTBEAT,
    }
)
QUEUE_GENERATIONS: dict[str, QueueGeneration] = {
    generation.name: generation for generation in (QueueGeneration("2023-01", _JOB_2023_01, STATUSES),)
}
OLDEST_QUEUE_GENERATION = "2023-01"


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

    def keep_declared(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """``entry`` without the fields this generation does not declare, nor None values."""
        return {name: value for name, value in entry.items() if value is not None and (name == ID or name in self.fields)}


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
            _CACHE_BASE | {Cache.JOB_RUNNER_VERSION, Cache.PROGRESS, Cache.FAILED_RUNS, Cache.DURATION},
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


# --- reading cache entries of any generation ------------------------------------


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


def failed_runs_of(entry: Mapping[str, Any] | None) -> int:
    """Failed runs so far; a successful entry resets the count."""
    if not entry or entry.get(Cache.HTTP_STATUS) == HTTP_OK:
        return 0
    return stored_failed_runs(entry)
