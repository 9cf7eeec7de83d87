"""Which generation a database is, told once per run from what it holds: :func:`decide`.

A queue generation is recognized from evidence in the database (job fields,
statuses, collections, indexes): each piece of evidence allows a range of
generations, and the ranges must meet. When they do not, or when they leave the
choice between keeping and deleting finished jobs open, the verdict says so and
a cleanup writes nothing until ``queue_generation`` is set. A cache generation
is the oldest that declares every field its newest entries hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pymongo
from pymongo.collection import Collection
from pymongo.database import Database

from zombie_pipeline.queue.blockages import BLOCKAGES_COLLECTION
from zombie_pipeline.queue.cache import Cache, CacheEntry
from zombie_pipeline.queue.generations import (
    CACHE_GENERATIONS,
    NEWEST_CACHE_GENERATION,
    QUEUE_GENERATION_NAMES,
    QUEUE_GENERATIONS,
    CacheGeneration,
    FinishStyle,
    QueueGeneration,
    cache_generation_of,
)
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION, JobMetric
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.locks import LOCKS_COLLECTION
from zombie_pipeline.queue.past_jobs import PAST_JOBS_COLLECTION
from zombie_pipeline.queue.worker_type_counts import WORKER_SIZE_METRICS_COLLECTION

if TYPE_CHECKING:
    from zombie_pipeline.policy import ZombiePolicy
    from zombie_pipeline.queue.store import Store


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


def queue_clues(database: Database[Any], jobs_collection: str) -> list[Clue]:
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


def detect_queue_generation(
    database: Database[Any], jobs_collection: str, configured: str | None = None
) -> QueueVerdict:
    if configured is not None:
        return judge([], configured)
    return judge(queue_clues(database, jobs_collection))


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


def detect_cache_generation(
    cache: Collection[CacheEntry], configured: str | None, queue: QueueGeneration | None
) -> CacheVerdict:
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
