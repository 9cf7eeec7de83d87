"""Where the pipeline's collections are (``queue/store.py``): the queue's and ours in one database, the cache's in another."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError

from zombie_pipeline.queue.audit_documents import DEFAULT_EVENTS_COLLECTION
from zombie_pipeline.queue.cache import CACHE_METRICS_COLLECTION, DEFAULT_CACHE_COLLECTION
from zombie_pipeline.queue.indexes import (
    CACHE_INDEXES,
    EVENT_INDEXES,
    HEARTBEAT_GAP_INDEXES,
    JOB_INDEXES,
    QUARANTINE_INDEXES,
    RETRY_INDEXES,
)
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, ID
from zombie_pipeline.queue.locks import LOCKS_COLLECTION
from zombie_pipeline.queue.store import Store, duplicate_indexes


def test_the_queue_and_our_collections_share_a_database_and_the_cache_has_its_own(queue_db, cache_db):
    store = Store.of(queue_db, cache_db)

    assert {store.jobs.name, store.events.name, store.cache.name} == {
        DEFAULT_JOBS_COLLECTION,
        DEFAULT_EVENTS_COLLECTION,
        DEFAULT_CACHE_COLLECTION,
    }
    queue_side: tuple[Collection[Any], ...] = (store.jobs, store.locks, *store.ours)
    assert {collection.database.name for collection in queue_side} == {queue_db.name}
    assert {store.cache.database.name, store.cache_metrics.database.name} == {cache_db.name}


def test_collection_names_of_a_deployment_that_named_them_otherwise_are_taken_as_given(queue_db, cache_db):
    store = Store.of(queue_db, cache_db, jobs_collection="jobsGreen", cache_collection="cachedResponsesGreen")

    assert (store.jobs.name, store.cache.name) == ("jobsGreen", "cachedResponsesGreen")


def test_our_own_collections_are_never_the_deployments(queue_db, cache_db):
    store = Store.of(queue_db, cache_db)

    assert {collection.name for collection in store.ours}.isdisjoint(
        {store.jobs.name, store.locks.name, store.job_metrics.name, store.past_jobs.name, store.blockages.name}
    )


def test_which_of_the_deployments_collections_exist_is_read_not_assumed(queue_db, cache_db):
    store = Store.of(queue_db, cache_db)
    assert LOCKS_COLLECTION not in store.queue_collection_names() and not store.has_cache_metrics()

    queue_db.create_collection(LOCKS_COLLECTION)
    cache_db.create_collection(CACHE_METRICS_COLLECTION)

    assert LOCKS_COLLECTION in store.queue_collection_names() and store.has_cache_metrics()


def test_the_indexes_our_queries_need_are_created_once(queue_db, cache_db):
    store = Store.of(queue_db, cache_db)

    created = store.ensure_indexes()

    expected = [
        spec.full_name
        for spec in (
            *JOB_INDEXES,
            *CACHE_INDEXES,
            *EVENT_INDEXES,
            *RETRY_INDEXES,
            *QUARANTINE_INDEXES,
            *HEARTBEAT_GAP_INDEXES,
        )
    ]
    assert sorted(created) == sorted(expected)
    assert store.ensure_indexes() == []  # idempotent: every run asks


def test_only_duplicates_are_tolerated_among_refused_writes(store):
    store.events.insert_one({ID: 1})
    with pytest.raises(BulkWriteError) as duplicate:
        store.events.insert_many([{ID: 1}, {ID: 2}], ordered=False)
    assert duplicate_indexes(duplicate.value) == {0}

    store.events.database.command("collMod", store.events.name, validator={"must": {"$exists": True}})
    with pytest.raises(BulkWriteError) as invalid:
        store.events.insert_many([{ID: 3}], ordered=False)
    with pytest.raises(BulkWriteError):
        duplicate_indexes(invalid.value)
