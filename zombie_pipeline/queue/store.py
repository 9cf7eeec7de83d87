"""The collections a pipeline works on, resolved once from names and databases."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pymongo.collection import Collection
from pymongo.command_cursor import CommandCursor
from pymongo.database import Database
from pymongo.errors import BulkWriteError

from zombie_pipeline.queue.audit_documents import (
    DEFAULT_EVENTS_COLLECTION,
    DEFAULT_FAILURES_COLLECTION,
    DEFAULT_SUGGESTIONS_COLLECTION,
    HEARTBEAT_GAPS_COLLECTION,
    QUARANTINE_COLLECTION,
    RETRIES_COLLECTION,
    WATCHERS_COLLECTION,
    QuarantineDocument,
    RetryDocument,
    WatchLeaseDocument,
    ZombieEvent,
)
from zombie_pipeline.queue.blockages import BLOCKAGES_COLLECTION
from zombie_pipeline.queue.cache import CACHE_METRICS_COLLECTION, DEFAULT_CACHE_COLLECTION, CacheEntry
from zombie_pipeline.queue.indexes import (
    CACHE_INDEXES,
    EVENT_INDEXES,
    HEARTBEAT_GAP_INDEXES,
    JOB_INDEXES,
    QUARANTINE_INDEXES,
    RETRY_INDEXES,
    ensure_indexes,
)
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, JobDocument
from zombie_pipeline.queue.locks import LOCKS_COLLECTION
from zombie_pipeline.queue.past_jobs import PAST_JOBS_COLLECTION
from zombie_pipeline.queue.worker_type_counts import WORKER_SIZE_METRICS_COLLECTION

#: A document of the deployment's side collections or of ours that has no shape of its own here.
Document = dict[str, Any]
Shape = TypeVar("Shape", bound=Mapping[str, Any])


def typed(database: Database[Document], name: str, shape: type[Shape]) -> Collection[Shape]:
    """``database[name]`` whose documents the type checker reads as ``shape`` (a ``TypedDict``): pymongo decodes
    every document into a plain dict, of which such a shape is only a view."""
    return cast(Collection[Shape], database[name])


def aggregate_rows(
    collection: Collection[Any], pipeline: Sequence[Mapping[str, Any]], **options: Any
) -> CommandCursor[Document]:
    """The rows of an aggregation over ``collection``: groups and counts of their own shape, not its documents'."""
    return cast(CommandCursor[Document], collection.aggregate(pipeline, **options))


#: The documents of a batch come back in one reply, not one ``getMore`` per 101.
READ_BATCH = 10_000
DUPLICATE_KEY = 11000


def duplicate_indexes(error: BulkWriteError) -> set[int]:
    """Indexes of a bulk write's operations refused as duplicates; any other write error is re-raised."""
    refused = set()
    for write_error in error.details.get("writeErrors", []):
        if write_error.get("code") != DUPLICATE_KEY:
            raise error
        refused.add(write_error["index"])
    return refused


@dataclass(frozen=True)
class Store:
    """Queue and cache may live on different clusters; our own collections sit beside the queue.

    Beside them, the deployment's collections around a job's life (locks,
    counters, rate limiter): which ones a generation keeps is
    ``generations.QueueGeneration.side_collections``, and we only ever write to
    those that exist.
    """

    jobs: Collection[JobDocument]
    events: Collection[ZombieEvent]
    cache: Collection[CacheEntry]
    failures: Collection[Document]
    suggestions: Collection[Document]
    retries: Collection[RetryDocument]
    locks: Collection[Document]
    job_metrics: Collection[Document]
    worker_size_metrics: Collection[Document]
    past_jobs: Collection[Document]
    blockages: Collection[Document]
    cache_metrics: Collection[Document]
    quarantine: Collection[QuarantineDocument]
    watchers: Collection[WatchLeaseDocument]
    heartbeat_gaps: Collection[Document]

    @classmethod
    def of(
        cls,
        queue_db: Database[Document],
        cache_db: Database[Document],
        jobs_collection: str = DEFAULT_JOBS_COLLECTION,
        cache_collection: str = DEFAULT_CACHE_COLLECTION,
        events_collection: str = DEFAULT_EVENTS_COLLECTION,
        failures_collection: str = DEFAULT_FAILURES_COLLECTION,
        suggestions_collection: str = DEFAULT_SUGGESTIONS_COLLECTION,
    ) -> Store:
        return cls(
            jobs=typed(queue_db, jobs_collection, JobDocument),
            events=typed(queue_db, events_collection, ZombieEvent),
            cache=typed(cache_db, cache_collection, CacheEntry),
            failures=queue_db[failures_collection],
            suggestions=queue_db[suggestions_collection],
            retries=typed(queue_db, RETRIES_COLLECTION, RetryDocument),
            locks=queue_db[LOCKS_COLLECTION],
            job_metrics=queue_db[JOB_METRICS_COLLECTION],
            worker_size_metrics=queue_db[WORKER_SIZE_METRICS_COLLECTION],
            past_jobs=queue_db[PAST_JOBS_COLLECTION],
            blockages=queue_db[BLOCKAGES_COLLECTION],
            cache_metrics=cache_db[CACHE_METRICS_COLLECTION],
            quarantine=typed(queue_db, QUARANTINE_COLLECTION, QuarantineDocument),
            watchers=typed(queue_db, WATCHERS_COLLECTION, WatchLeaseDocument),
            heartbeat_gaps=queue_db[HEARTBEAT_GAPS_COLLECTION],
        )

    @property
    def ours(self) -> tuple[Collection[Any], ...]:
        """The collections this project owns; the deployment never reads them."""
        return (
            self.events,
            self.failures,
            self.suggestions,
            self.retries,
            self.quarantine,
            self.watchers,
            self.heartbeat_gaps,
        )

    def beside_queue(self, name: str) -> Collection[Document]:
        """The collection ``name`` of the queue's database, one the pipeline itself does not work on."""
        return cast(Database[Document], self.jobs.database)[name]

    def queue_collection_names(self) -> frozenset[str]:
        return frozenset(self.jobs.database.list_collection_names())

    def has_cache_metrics(self) -> bool:
        """Whether the cache keeps ``cacheTotalMetric`` (from August 2023): we keep it in step, never create it."""
        return self.cache_metrics.name in self.cache.database.list_collection_names()

    def ensure_indexes(self) -> list[str]:
        """Create the indexes our queries need (``queue.indexes``: each says which query needs it); idempotent."""
        created = ensure_indexes(self.jobs, JOB_INDEXES)
        created += ensure_indexes(self.cache, CACHE_INDEXES)
        created += ensure_indexes(self.events, EVENT_INDEXES)
        created += ensure_indexes(self.retries, RETRY_INDEXES)
        created += ensure_indexes(self.quarantine, QUARANTINE_INDEXES)
        created += ensure_indexes(self.heartbeat_gaps, HEARTBEAT_GAP_INDEXES)
        return created
