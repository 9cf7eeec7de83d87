"""The collections a pipeline works on, resolved once from names and databases."""

from __future__ import annotations

from dataclasses import dataclass

from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import BulkWriteError

from zombie_pipeline.queue.documents import (
    BLOCKAGES_COLLECTION,
    CACHE_METRICS_COLLECTION,
    DEFAULT_CACHE_COLLECTION,
    DEFAULT_EVENTS_COLLECTION,
    DEFAULT_FAILURES_COLLECTION,
    DEFAULT_JOBS_COLLECTION,
    DEFAULT_SUGGESTIONS_COLLECTION,
    ID,
    JOB_METRICS_COLLECTION,
    LOCKS_COLLECTION,
    PAST_JOBS_COLLECTION,
    RETRIES_COLLECTION,
    SIMULATIONS_COLLECTION,
    WORKER_SIZE_METRICS_COLLECTION,
)
from zombie_pipeline.queue.indexes import (
    CACHE_INDEXES,
    EVENT_INDEXES,
    JOB_INDEXES,
    RETRY_INDEXES,
    ensure_indexes,
)

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

    jobs: Collection
    events: Collection
    cache: Collection
    failures: Collection
    suggestions: Collection
    retries: Collection
    locks: Collection
    job_metrics: Collection
    worker_size_metrics: Collection
    past_jobs: Collection
    blockages: Collection
    cache_metrics: Collection

    @classmethod
    def of(
        cls,
        queue_db: Database,
        cache_db: Database,
        jobs_collection: str = DEFAULT_JOBS_COLLECTION,
        cache_collection: str = DEFAULT_CACHE_COLLECTION,
        events_collection: str = DEFAULT_EVENTS_COLLECTION,
        failures_collection: str = DEFAULT_FAILURES_COLLECTION,
        suggestions_collection: str = DEFAULT_SUGGESTIONS_COLLECTION,
    ) -> Store:
        return cls(
            jobs=queue_db[jobs_collection],
            events=queue_db[events_collection],
            cache=cache_db[cache_collection],
            failures=queue_db[failures_collection],
            suggestions=queue_db[suggestions_collection],
            retries=queue_db[RETRIES_COLLECTION],
            locks=queue_db[LOCKS_COLLECTION],
            job_metrics=queue_db[JOB_METRICS_COLLECTION],
            worker_size_metrics=queue_db[WORKER_SIZE_METRICS_COLLECTION],
            past_jobs=queue_db[PAST_JOBS_COLLECTION],
            blockages=queue_db[BLOCKAGES_COLLECTION],
            cache_metrics=cache_db[CACHE_METRICS_COLLECTION],
        )

    @property
    def ours(self) -> tuple[Collection, ...]:
        """The collections this project owns; the deployment never reads them."""
        return (self.events, self.failures, self.suggestions, self.retries)

    def simulated_generation(self) -> str | None:
        """The queue generation the simulator wrote these databases in (its mark in ``zombieSimulations``), or None
        when it wrote none: a simulated queue is the simulator's to drop, its healthy jobs alive only while its
        simulated workers run."""
        marker = self.jobs.database[SIMULATIONS_COLLECTION].find_one(sort=[(ID, -1)])
        return marker.get("generation") if marker else None

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
        return created
