"""The generations of the deployment's documents: what each declares, and which one a database is, decided once a run.

The deployment loads its collections through strict models that refuse
undeclared fields and statuses, and what finishing a job means changed in
December 2023 (finished jobs are deleted). This module is the table of every
generation, the evidence that tells a database's generation, and
:func:`decide`, asked once per run: the queue's and the cache's generation
with their evidence. How a generation finishes a job is a *finish style* here,
and behaviour in the cleanup's strategies (``cleanup/strategies.py``); nobody
else branches on a generation.

A queue generation is recognized from evidence in the database (job fields,
statuses, collections, indexes): each piece of evidence allows a range of
generations, and the ranges must meet. When they do not, or when they leave the
choice between keeping and deleting finished jobs open, the verdict says so and
a cleanup writes nothing until ``queue_generation`` is set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pymongo
from pymongo.collection import Collection
from pymongo.database import Database

from zombie_pipeline.queue.documents import (
    BLOCKAGES_COLLECTION,
    CACHE_METRICS_COLLECTION,
    HTTP_OK,
    ID,
    JOB_METRICS_COLLECTION,
    LOCKS_COLLECTION,
    PAST_JOBS_COLLECTION,
    WORKER_SIZE_METRICS_COLLECTION,
    Cache,
    Job,
    JobMetric,
    Lock,
    Status,
)

if TYPE_CHECKING:
    from zombie_pipeline.policy import ZombiePolicy
    from zombie_pipeline.queue.store import Store

# --- queue generations -----------------------------------------------------


class FinishStyle(StrEnum):
    """How the deployment finishes a job; each has its strategy in ``cleanup/strategies.py``."""

    KEPT_AS_ERROR = "kept_as_error"  # before 2023-12: the job stays, with its final status and finished_at
    DELETED = "deleted"  # 2023-12 on: the job is deleted once its cache entry is written


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

    def declares(self, field_name: str) -> bool:
        return field_name in self.job_fields

    def keeps(self, collection: str) -> bool:
        """Whether the deployment keeps ``collection`` (beside the queue, or ``cacheTotalMetric`` beside the cache)."""
        return collection in self.side_collections

    @property
    def cache_metrics(self) -> bool:
        return self.keeps(CACHE_METRICS_COLLECTION)

    @property
    def durations_source(self) -> DurationsSource:
        """Finished jobs where the queue keeps them; else the cache entries, which outlive them."""
        return (
            DurationsSource.FINISHED_JOBS if self.finish is FinishStyle.KEPT_AS_ERROR else DurationsSource.CACHE_ENTRIES
        )

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
_LOCK_2023_06 = frozenset({Lock.JOB_ID, Lock.CREATED_AT, Lock.UPDATED_AT})
_LOCK_2023_07 = _LOCK_2023_06 | {Lock.OWNER}
_LOCK_2023_12 = _LOCK_2023_07 | {Lock.TTL}
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
        QueueGeneration("2023-01", _JOB_2023_01, _ALL_STATUSES, frozenset(), UnicityFormat.BRACKETS, "2023-01"),
        QueueGeneration("2023-05", _JOB_2023_05, _NO_SKIPPED, frozenset(), UnicityFormat.COMMAS, "2023-04"),
        QueueGeneration(
            "2023-06",
            _JOB_2023_05,
            _NO_SKIPPED,
            frozenset({LOCKS_COLLECTION}),
            UnicityFormat.COMMAS,
            "2023-04",
            lock_fields=_LOCK_2023_06,
        ),
        QueueGeneration(
            "2023-07",
            _JOB_2023_07,
            _NO_SKIPPED,
            frozenset({LOCKS_COLLECTION, JOB_METRICS_COLLECTION, CACHE_METRICS_COLLECTION}),
            UnicityFormat.COMMAS_WITH_REVISION,
            "2023-04",
            lock_fields=_LOCK_2023_07,
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
            lock_fields=_LOCK_2023_12,
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
            lock_fields=_LOCK_2023_12,
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
            lock_fields=_LOCK_2023_12,
            cache_updated_index=True,
        ),
    )
}
QUEUE_GENERATION_NAMES = tuple(QUEUE_GENERATIONS)
OLDEST_QUEUE_GENERATION = QUEUE_GENERATION_NAMES[0]
NEWEST_QUEUE_GENERATION = QUEUE_GENERATION_NAMES[-1]


def _from(name: str) -> frozenset[str]:
    return frozenset(QUEUE_GENERATION_NAMES[QUEUE_GENERATION_NAMES.index(name) :])


def _until(name: str) -> frozenset[str]:
    return frozenset(QUEUE_GENERATION_NAMES[: QUEUE_GENERATION_NAMES.index(name) + 1])


_KEPT = frozenset(
    name for name, generation in QUEUE_GENERATIONS.items() if generation.finish is FinishStyle.KEPT_AS_ERROR
)


@dataclass(frozen=True)
class Clue:
    """One thing seen in the database, and the generations it allows."""

    seen: str
    allows: frozenset[str]


@dataclass(frozen=True)
class QueueVerdict:
    """Which generation the queue database is, and why; ``generation`` is None when undecided."""

    generation: QueueGeneration | None
    candidates: tuple[str, ...]
    clues: tuple[Clue, ...]
    configured: bool = False
    problem: str | None = None

    def evidence(self) -> dict[str, Any]:
        """For run metadata: what was seen, what it allows, and the verdict."""
        return {
            "generation": self.generation.name if self.generation else None,
            "configured": self.configured,
            "candidates": list(self.candidates),
            "clues": [{"seen": clue.seen, "allows": sorted(clue.allows)} for clue in self.clues],
            "problem": self.problem,
        }


#: (what a job field's presence says, generations it allows)
_FIELD_CLUES = {
    Job.FORCE: _until("2023-01"),
    Job.REVISION: _from("2023-05"),
    Job.DIFFICULTY: _from("2023-07"),
    Job.FINISHED_AT: _KEPT,
    Job.TERMINATED_AT: _from("2026-05"),
}
#: Fields written on every job of the generations that have them (required, or a default that is not None).
_MISSING_FIELD_CLUES = {
    Job.FORCE: _from("2023-05"),
    Job.REVISION: _until("2023-01"),
    Job.DIFFICULTY: _until("2023-06"),
}
_COLLECTION_CLUES = {
    LOCKS_COLLECTION: _from("2023-06"),
    JOB_METRICS_COLLECTION: _from("2023-07"),
    WORKER_SIZE_METRICS_COLLECTION: _from("2023-12"),
    PAST_JOBS_COLLECTION: _from("2024-06"),
    BLOCKAGES_COLLECTION: _from("2024-06"),
}
_SAMPLE = 200
#: The newest jobs of the whole queue walk the ``_id`` index backwards. MongoDB plans that sort on it
#: anyway; the embedded server sorts the whole collection instead unless told (1.5 s of a 10k-job
#: queue's cleanup, 0.18 s hinted: docs/benchmarks.md).
_ID_INDEX = [(ID, pymongo.ASCENDING)]


def queue_clues(database: Database, jobs_collection: str) -> list[Clue]:
    """What the queue database shows about its generation: a few small, indexed reads."""
    jobs = database[jobs_collection]
    clues = []
    fields: set[str] = set()
    newest = jobs.find({}).sort(ID, -1).hint(_ID_INDEX).limit(_SAMPLE).batch_size(_SAMPLE)
    newest_started = jobs.find({Job.STATUS: Status.STARTED}).sort(ID, -1).limit(_SAMPLE).batch_size(_SAMPLE)
    for cursor in (newest, newest_started):
        for job in cursor:
            fields |= set(job)
    for name, allows in _FIELD_CLUES.items():
        if name in fields:
            clues.append(Clue(f"jobs with a {name!r} field", allows))
    if fields:  # fields the deployment always writes: their absence from every job is evidence too
        for name, allows in _MISSING_FIELD_CLUES.items():
            if name not in fields:
                clues.append(Clue(f"no job has a {name!r} field", allows))
    statuses = {status for status in jobs.distinct(Job.STATUS) if isinstance(status, str)}
    if Status.SKIPPED in statuses:
        clues.append(Clue("jobs with status 'skipped'", _until("2023-01")))
    finished = sorted(statuses & {Status.SUCCESS, Status.ERROR, Status.CANCELLED})
    if finished:
        clues.append(Clue(f"finished jobs kept (status {', '.join(finished)})", _KEPT))
    if any(_is_ttl_on(info, Job.FINISHED_AT) for info in jobs.index_information().values()):
        clues.append(Clue("a TTL index on jobs' finished_at", _KEPT))
    collections = set(database.list_collection_names())
    for name, allows in _COLLECTION_CLUES.items():
        if name in collections:
            clues.append(Clue(f"collection {name!r}", allows))
    if fields and LOCKS_COLLECTION not in collections:
        # from 2023-06-26 every start takes a lock, and lock documents outlive it
        clues.append(Clue(f"no {LOCKS_COLLECTION} collection", _until("2023-05")))
    if WORKER_SIZE_METRICS_COLLECTION in collections and not collections & {PAST_JOBS_COLLECTION, BLOCKAGES_COLLECTION}:
        # a deployment with a rate limiter records a past job at its first run of 30 s
        clues.append(Clue(f"no {PAST_JOBS_COLLECTION} nor {BLOCKAGES_COLLECTION} collection", _until("2023-12")))
    if JOB_METRICS_COLLECTION in collections:
        metrics = database[JOB_METRICS_COLLECTION]
        if metrics.find_one({JobMetric.STATUS: {"$in": [Status.SUCCESS, Status.ERROR, Status.CANCELLED]}}, {ID: 1}):
            clues.append(Clue(f"{JOB_METRICS_COLLECTION} counts finished jobs", _KEPT))
        row = metrics.find_one({}, {JobMetric.DATASET_STATUS: 1})
        if row is not None and JobMetric.DATASET_STATUS in row:
            clues.append(Clue(f"{JOB_METRICS_COLLECTION} rows with dataset_status", _from("2024-06")))
    return clues


def _is_ttl_on(index: Mapping[str, Any], field_name: str) -> bool:
    return "expireAfterSeconds" in index and [key for key, _ in index.get("key", [])] == [field_name]


def judge(clues: list[Clue], configured: str | None = None) -> QueueVerdict:
    """The generation the clues point to, or why none can be chosen.

    Absence proves little (mongoengine omits None fields; a young deployment has
    not created every collection yet), so among candidates that finalize alike
    the newest is chosen. Candidates that disagree on keeping finished jobs are
    a question only the operator can answer.
    """
    if configured is not None:
        return QueueVerdict(QUEUE_GENERATIONS[configured], (configured,), tuple(clues), configured=True)
    candidates = set(QUEUE_GENERATION_NAMES)
    for clue in clues:
        candidates &= clue.allows
    ordered = tuple(name for name in QUEUE_GENERATION_NAMES if name in candidates)
    hint = f"set the policy's queue_generation to one of {', '.join(QUEUE_GENERATION_NAMES)}"
    if not ordered:
        seen = "; ".join(f"{clue.seen} (allows {_span(clue.allows)})" for clue in clues)
        problem = (
            f"the queue's evidence contradicts itself: {seen}. Nothing was written; check the database, or {hint}."
        )
        return QueueVerdict(None, (), tuple(clues), problem=problem)
    if len({QUEUE_GENERATIONS[name].finish for name in ordered}) > 1:
        problem = (
            f"the queue could be any of {', '.join(ordered)}: nothing seen tells whether finished jobs are kept "
            f"(before 2023-12) or deleted. Nothing was written; {hint}."
        )
        return QueueVerdict(None, ordered, tuple(clues), problem=problem)
    return QueueVerdict(QUEUE_GENERATIONS[ordered[-1]], ordered, tuple(clues))


def _span(names: frozenset[str]) -> str:
    ordered = [name for name in QUEUE_GENERATION_NAMES if name in names]
    if not ordered:
        return "none"
    return ordered[0] if len(ordered) == 1 else f"{ordered[0]} to {ordered[-1]}"


def detect_queue_generation(database: Database, jobs_collection: str, configured: str | None = None) -> QueueVerdict:
    if configured is not None:
        return judge([], configured)
    return judge(queue_clues(database, jobs_collection))


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
    fields: frozenset[str] = field(default_factory=frozenset)

    @property
    def version_field(self) -> str:
        if Cache.JOB_RUNNER_VERSION in self.fields:
            return Cache.JOB_RUNNER_VERSION
        return Cache.WORKER_VERSION

    def declares(self, field_name: str) -> bool:
        return field_name in self.fields

    def keep_declared(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """``entry`` without the fields this generation does not declare, nor None values."""
        return {
            name: value for name, value in entry.items() if value is not None and (name == ID or name in self.fields)
        }


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


_CACHE_SAMPLE = 200


@dataclass(frozen=True)
class CacheVerdict:
    """Which generation the cache's entries are written in, and why."""

    generation: CacheGeneration
    configured: bool = False
    fields_seen: tuple[str, ...] = ()  # in the newest entries; none: an empty cache, its queue's own assumed

    def evidence(self) -> dict[str, Any]:
        return {
            "generation": self.generation.name,
            "configured": self.configured,
            "fields_seen": list(self.fields_seen),
        }


def detect_cache_generation(cache: Collection, configured: str | None, queue: QueueGeneration | None) -> CacheVerdict:
    """The configured generation, else the one the newest existing entries were written in.

    An empty cache tells nothing: the cache the queue's generation writes is assumed (for an early
    queue, the oldest of its time, whose fields every later one of that time declares too).
    """
    if configured:
        return CacheVerdict(CACHE_GENERATIONS[configured], configured=True)
    seen: set[str] = set()
    for entry in cache.find({}, {Cache.CONTENT: 0, Cache.DETAILS: 0}).sort("$natural", -1).limit(_CACHE_SAMPLE):
        seen.update(entry)
    if not seen:
        return CacheVerdict(CACHE_GENERATIONS[queue.cache_generation if queue else NEWEST_CACHE_GENERATION])
    return CacheVerdict(cache_generation_of(seen), fields_seen=tuple(sorted(seen - {ID})))


def cache_generation_of(field_names: set[str]) -> CacheGeneration:
    """The oldest generation that declares every field seen in existing entries.

    mongoengine omits fields whose value is None, so absence proves little;
    presence of a field proves the generation is at least the one adding it.
    """
    for generation in CACHE_GENERATIONS.values():
        if field_names - {ID} <= generation.fields:
            return generation
    return CACHE_GENERATIONS[NEWEST_CACHE_GENERATION]


# --- the decision of a run --------------------------------------------------------


class GenerationUnknown(RuntimeError):
    """The queue's generation cannot be told from the database; nothing was written."""


@dataclass(frozen=True)
class Generations:
    """The queue's and the cache's generation for one run, with their evidence: decided once, by :func:`decide`."""

    queue_verdict: QueueVerdict
    cache_verdict: CacheVerdict

    @property
    def queue(self) -> QueueGeneration | None:
        """None when the evidence leaves the queue's generation undecided (``problem`` says why)."""
        return self.queue_verdict.generation

    @property
    def cache(self) -> CacheGeneration:
        return self.cache_verdict.generation

    @property
    def problem(self) -> str | None:
        return self.queue_verdict.problem

    def required_queue(self) -> QueueGeneration:
        """The queue's generation, or :class:`GenerationUnknown` for a run that must write."""
        if self.queue is None:
            raise GenerationUnknown(self.problem)
        return self.queue

    def evidence(self) -> dict[str, Any]:
        """For run metadata: what was seen in each database, what it allows, and the verdicts."""
        return {**self.queue_verdict.evidence(), "cache": self.cache_verdict.evidence()}


def decide(store: Store, policy: ZombiePolicy) -> Generations:
    """Which generations the run's databases are: configured in the policy, or told from a few indexed reads."""
    verdict = detect_queue_generation(store.jobs.database, store.jobs.name, policy.queue_generation)
    return Generations(verdict, detect_cache_generation(store.cache, policy.cache_generation, verdict.generation))


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


def failed_runs_after_crash(previous: Mapping[str, Any] | None, job: Mapping[str, Any]) -> int:
    """``failed_runs`` of the error entry of a crashed ``job``, as the deployment counts it.

    The previous entry's count carries over when it is about the same revision
    of the dataset (or the job carries no revision); a success does not reset it.
    """
    if not previous:
        return 1
    revision = job.get(Job.REVISION)
    same_revision = revision is None or previous.get(Cache.DATASET_GIT_REVISION) == revision
    return (stored_failed_runs(previous) if same_revision else 0) + 1


def is_success(entry: Mapping[str, Any] | None) -> bool:
    return bool(entry) and entry.get(Cache.HTTP_STATUS) == HTTP_OK
