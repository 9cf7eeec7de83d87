"""The generations of the deployment's documents: what each declares, from the oldest queue to today's.

The deployment loads its collections through strict models that refuse
undeclared fields and statuses, and what finishing a job means changed in
December 2023 (finished jobs are deleted). This module is the table of every
generation of the queue and of the cache; which one a database is, is told by
``queue.evidence``, once per run. How a generation finishes a job is a *finish
style* here, and behaviour in the cleanup's strategies (``cleanup/strategies.py``);
nobody else branches on a generation. Adding a generation is an entry of the
table, and a strategy only if finishing itself changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

from zombie_pipeline.queue import locks
from zombie_pipeline.queue.blockages import BLOCKAGES_COLLECTION
from zombie_pipeline.queue.cache import CACHE_METRICS_COLLECTION, Cache, CacheEntry
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.locks import LOCKS_COLLECTION
from zombie_pipeline.queue.past_jobs import PAST_JOBS_COLLECTION
from zombie_pipeline.queue.worker_type_counts import WORKER_SIZE_METRICS_COLLECTION


class FinishStyle(StrEnum):
    """How the deployment finishes a job; each has its strategy in ``cleanup/strategies.py``."""

    KEPT_AS_ERROR = "kept_as_error"  # before 2023-12: the job stays, with its final status and finished_at
    DELETED = "deleted"  # 2023-12 on: the job is deleted once its cache entry is written


class FailedRunsRule(StrEnum):
    """How the deployment counts ``failed_runs`` in a failed job's error entry (its code's era, not its cache's)."""

    #: 2024-01-10 (9cd2be848) to 2026-05-27: the previous entry's count + 1 when that entry is about the job's revision,
    #: else 0, no previous entry included (``orchestrator.finish_job``).
    SAME_REVISION_ELSE_ZERO = "same_revision_else_zero"
    #: 2026-05-27 (f3763e22c) on: the previous entry's count when about the job's revision (else 0), + 1
    #: (``orchestrator.get_failed_runs``, ``save_job_result``). Before 2024 the deployment counted none: the cleanup's
    #: own count (in ``details``) follows this rule.
    EVERY_FAILURE = "every_failure"


class DurationsSource(StrEnum):
    """Where the durations of finished runs can be read, once a day is over."""

    FINISHED_JOBS = "jobs"  # every run of the day, kept in the queue
    CACHE_ENTRIES = "cache"  # the latest run of each artifact, in its cache entry's duration


class UnicityFormat(StrEnum):
    """How the deployment builds ``unicity_id`` (the simulator writes it; the cleanup copies it)."""

    BRACKETS = "brackets"  # Job[type][dataset][config][split], None written out (to 2023-04-27)
    COMMAS = "commas"  # type,dataset[,config[,split]] (2023-04-27 on)
    COMMAS_WITH_REVISION = "commas_with_revision"  # type,dataset,revision[,config[,split]] (2023-10-18 on)


@dataclass(frozen=True)
class QueueGeneration:
    """One version of the queue's models, named by the month it shipped."""

    name: str
    job_fields: frozenset[str]
    statuses: frozenset[str]
    #: The deployment's collections beside ``jobsBlue`` that this generation keeps in step.
    side_collections: frozenset[str]
    unicity_format: UnicityFormat
    #: The cache generation a deployment of this generation writes (the simulator's default).
    cache_generation: str
    #: From December 2023, a finished job is deleted; before, it is kept with its final status.
    finish: FinishStyle = FinishStyle.KEPT_AS_ERROR
    #: ``jobTotalMetric`` rows carry ``dataset_status`` (from July 2024; the rows updated in step are "normal").
    job_metrics_by_dataset_status: bool = False
    #: The fields of a ``locks`` document (the lock's key is its ``_id``).
    lock_fields: frozenset[str] = frozenset()
    #: The cache has the ``(kind, updated_at, dataset)`` index (named ``kind_updated``, 2026 on).
    cache_updated_index: bool = False
    #: A job's heartbeat may be an explicit null (an update that set it to None), not only a missing key.
    null_heartbeats: bool = False
    #: How the deployment of the time counts a crashed job's failed runs.
    failed_runs: FailedRunsRule = FailedRunsRule.EVERY_FAILURE
    #: The finish frees every lock the job owns (``release_locks(owner=job_id)``: 2023-08-07, 664692d90, to
    #: 2024-08-22, 9e221e096), such as the ``refs/convert/parquet`` branch lock of a conversion that died holding it.
    frees_owned_locks: bool = False
    #: The commit of dataset-viewer the generation's finish was read from (its date in ``docs/generations.md``).
    read_from: str = ""

    def declares(self, field_name: str) -> bool:
        return field_name in self.job_fields

    def keeps(self, collection: str) -> bool:
        """Whether the deployment keeps ``collection`` (beside the queue, or ``cacheTotalMetric`` beside the cache)."""
        return collection in self.side_collections

    @property
    def cache_metrics(self) -> bool:
        return self.keeps(CACHE_METRICS_COLLECTION)

    @property
    def keeps_finished_jobs(self) -> bool:
        """Whether a finished job stays in the queue (with its final status), so that its history lives there too."""
        return self.finish is FinishStyle.KEPT_AS_ERROR

    @property
    def durations_source(self) -> DurationsSource:
        """Finished jobs where the queue keeps them; else the cache entries, which outlive them."""
        return DurationsSource.FINISHED_JOBS if self.keeps_finished_jobs else DurationsSource.CACHE_ENTRIES

    def unicity_id(
        self, job_type: str, dataset: str, revision: str | None, config: str | None, split: str | None
    ) -> str:
        if self.unicity_format is UnicityFormat.BRACKETS:
            return f"Job[{job_type}][{dataset}][{config}][{split}]"
        parts = [job_type, dataset]
        if self.unicity_format is UnicityFormat.COMMAS_WITH_REVISION:
            parts.append(revision or "")
        if config is not None:
            parts.append(config)
            if split is not None:
                parts.append(split)
        return ",".join(parts)


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


_JOB_2023_05 = _JOB_2023_01 - {Job.FORCE} | {Job.REVISION}


_JOB_2023_07 = _JOB_2023_05 | {Job.DIFFICULTY}


_JOB_2023_12 = _JOB_2023_07 - {Job.FINISHED_AT}


_JOB_2026_05 = _JOB_2023_12 | {Job.TERMINATED_AT}


_ALL_STATUSES = frozenset(Status)


_NO_SKIPPED = _ALL_STATUSES - {Status.SKIPPED}


_LIVE_STATUSES = frozenset({Status.WAITING, Status.STARTED})


_RATE_LIMITED = frozenset(
    {
        LOCKS_COLLECTION,
        JOB_METRICS_COLLECTION,
        WORKER_SIZE_METRICS_COLLECTION,
        CACHE_METRICS_COLLECTION,
        PAST_JOBS_COLLECTION,
        BLOCKAGES_COLLECTION,
    }
)


QUEUE_GENERATIONS: dict[str, QueueGeneration] = {
    generation.name: generation
    for generation in (
        QueueGeneration(
            "2023-01",
            _JOB_2023_01,
            _ALL_STATUSES,
            frozenset(),
            UnicityFormat.BRACKETS,
            "2023-01",
            read_from="d55cbcc6f92564f042a4dafdbb3bb5e919099a15",
        ),
        QueueGeneration(
            "2023-05",
            _JOB_2023_05,
            _NO_SKIPPED,
            frozenset(),
            UnicityFormat.COMMAS,
            "2023-04",
            read_from="ca1d155af54b1aa372d9677115d12ce94fd1021b",
        ),
        QueueGeneration(
            "2023-06",
            _JOB_2023_05,
            _NO_SKIPPED,
            frozenset({LOCKS_COLLECTION}),
            UnicityFormat.COMMAS,
            "2023-04",
            lock_fields=locks.FIELDS_2023_06,
            read_from="2996e47b6f4abca258b1a59d942dd1019aac2c60",
        ),
        QueueGeneration(
            "2023-07",
            _JOB_2023_07,
            _NO_SKIPPED,
            frozenset({LOCKS_COLLECTION, JOB_METRICS_COLLECTION, CACHE_METRICS_COLLECTION}),
            UnicityFormat.COMMAS_WITH_REVISION,
            "2023-04",
            lock_fields=locks.FIELDS_2023_07,
            frees_owned_locks=True,
            read_from="d73fafbeb2a0a8848a30c038110820319e6a531f",
        ),
        QueueGeneration(
            "2023-12",
            _JOB_2023_12,
            _LIVE_STATUSES,
            frozenset(
                {LOCKS_COLLECTION, JOB_METRICS_COLLECTION, WORKER_SIZE_METRICS_COLLECTION, CACHE_METRICS_COLLECTION}
            ),
            UnicityFormat.COMMAS_WITH_REVISION,
            "2024-01",
            finish=FinishStyle.DELETED,
            null_heartbeats=True,
            lock_fields=locks.FIELDS_2023_12,
            failed_runs=FailedRunsRule.SAME_REVISION_ELSE_ZERO,
            frees_owned_locks=True,
            read_from="436f33a6ad6933f3d7b3ba50e7f820832cf62950",
        ),
        QueueGeneration(
            "2024-06",
            _JOB_2023_12,
            _LIVE_STATUSES,
            _RATE_LIMITED,
            UnicityFormat.COMMAS_WITH_REVISION,
            "2024-07",
            finish=FinishStyle.DELETED,
            null_heartbeats=True,
            job_metrics_by_dataset_status=True,
            lock_fields=locks.FIELDS_2023_12,
            failed_runs=FailedRunsRule.SAME_REVISION_ELSE_ZERO,
            read_from="c0e223c3886c1988d0eb5d856bd380347c9e0dea",
        ),
        QueueGeneration(
            "2026-05",
            _JOB_2026_05,
            _LIVE_STATUSES,
            _RATE_LIMITED,
            UnicityFormat.COMMAS_WITH_REVISION,
            "2024-07",
            finish=FinishStyle.DELETED,
            null_heartbeats=True,
            job_metrics_by_dataset_status=True,
            lock_fields=locks.FIELDS_2023_12,
            cache_updated_index=True,
            read_from="f62009e0555b1274e7f6ddc7058dc796993f28b6",
        ),
    )
}


QUEUE_GENERATION_NAMES = tuple(QUEUE_GENERATIONS)


OLDEST_QUEUE_GENERATION = QUEUE_GENERATION_NAMES[0]


NEWEST_QUEUE_GENERATION = QUEUE_GENERATION_NAMES[-1]


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
    fields: frozenset[str] = field(default_factory=frozenset)

    @property
    def version_field(self) -> str:
        if Cache.JOB_RUNNER_VERSION in self.fields:
            return Cache.JOB_RUNNER_VERSION
        return Cache.WORKER_VERSION

    def declares(self, field_name: str) -> bool:
        return field_name in self.fields

    def keep_declared(self, entry: Mapping[str, Any]) -> CacheEntry:
        """``entry`` without the fields this generation does not declare, nor None values."""
        declared = {
            name: value for name, value in entry.items() if value is not None and (name == ID or name in self.fields)
        }
        return cast(CacheEntry, declared)


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
