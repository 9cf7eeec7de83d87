"""Durations read from the cache where the queue deletes finished jobs (``statistics/cache_history.py``)."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.helpers import logged_store
from tests.statistics.builders import DAY, NEXT_DAY, NOON, event, job
from zombie_pipeline.cleanup.cache_errors import DETAIL_JOB_ID
from zombie_pipeline.cleanup.detection import query_plan_of
from zombie_pipeline.queue.documents import HTTP_OK, Cache, ErrorCode, Reason, Status
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.indexes import CACHE_UPDATED_INDEX
from zombie_pipeline.statistics.cache_history import (
    CacheIndexMissing,
    read_cache_period,
)

INDEX_NAME = CACHE_UPDATED_INDEX.full_name
from zombie_pipeline.statistics.history import read_history
from zombie_pipeline.statistics.tallies import BadData

KIND_UPDATED = [(Cache.KIND, 1), (Cache.UPDATED_AT, 1), (Cache.DATASET, 1)]


def entry(kind: str, dataset: str, duration, http_status: int = HTTP_OK, error_code: str | None = None, updated_at=NOON, **fields) -> dict:
    document = {Cache.KIND: kind, Cache.DATASET: dataset, Cache.HTTP_STATUS: http_status, Cache.CONTENT: {}, Cache.UPDATED_AT: updated_at}
    if duration is not None:
        document[Cache.DURATION] = duration
    if error_code is not None:
        document[Cache.ERROR_CODE] = error_code
    document.update(fields)
    return document


@pytest.fixture
def cache(store):
    store.cache.create_index(KIND_UPDATED, name=INDEX_NAME)
    return store.cache


def test_each_artifacts_latest_run_of_the_day_counts_once_by_its_outcome(store, cache):
    cache.insert_many(
        [entry("split-first-rows", f"u/d{i}", 10.0 + i) for i in range(5)]
        + [entry("split-first-rows", "u/failed", 30.0, http_status=500, error_code="UnexpectedError")]
        + [entry("config-parquet", "u/p", 600.5), entry("config-parquet", "u/yesterday", 1.0, updated_at=DAY - dt.timedelta(hours=1))]
    )

    period = read_cache_period(cache, store.events, DAY, NEXT_DAY)

    rows = period.tallies["split-first-rows"]
    assert period.source == "cache" and period.jobs_read == 7
    assert sorted(rows.success.tolist()) == [10.0, 11.0, 12.0, 13.0, 14.0] and rows.error.tolist() == [30.0]
    assert rows.statuses == {Status.SUCCESS: 5, Status.ERROR: 1} and rows.started == 6
    assert period.tallies["config-parquet"].success.tolist() == [600.5]  # yesterday's entry is yesterday's


def test_our_own_error_entries_count_from_their_events_and_the_deployments_kills_from_the_cache(store, cache):
    zombie = job("split-first-rows", Status.ERROR, 1_300)
    store.events.insert_one(event(zombie, Reason.EXCEEDED_MAX_DURATION))
    cache.insert_many(
        [
            entry("split-first-rows", "u/ours", 1_300.0, 501, ErrorCode.EXCEEDED_MAX_DURATION, **{Cache.DETAILS: {DETAIL_JOB_ID: str(zombie["_id"])}}),
            entry("split-first-rows", "u/killed", 1_250.0, 501, ErrorCode.EXCEEDED_MAX_DURATION, **{Cache.DETAILS: {"error": "x"}}),
            entry("split-first-rows", "u/crashed", 42.0, 501, ErrorCode.CRASHED),
        ]
    )

    rows = read_cache_period(cache, store.events, DAY, NEXT_DAY).tallies["split-first-rows"]

    assert sorted(rows.stopped.tolist()) == [1_250.0, 1_300.0]  # ours from its event, the deployment's from its entry
    assert rows.zombies == {Reason.EXCEEDED_MAX_DURATION: 2, Reason.MISSING_HEARTBEAT: 1}
    assert rows.error.tolist() == [] and rows.success.tolist() == []  # a kill is not a run's duration


def test_entries_without_a_usable_duration_or_status_are_counted_by_their_reason(store, cache):
    cache.insert_many(
        [
            entry("a", "u/ok", 1.0),
            entry("a", "u/old", None),  # written before 2024-07
            entry("a", "u/negative", -3.0),
            entry("b", "u/ok", 2.0),
            entry("b", "u/text", "12 s"),  # a value that does not fit the column: this kind is read entry by entry
        ]
    )

    period = read_cache_period(cache, store.events, DAY, NEXT_DAY)

    assert period.bad_data == {BadData.MISSING_DURATION: 1, BadData.INVALID_DURATION: 2}
    assert period.tallies["a"].success.tolist() == [1.0] and period.tallies["b"].success.tolist() == [2.0]


def test_without_the_kind_updated_index_the_read_is_refused_never_a_scan(store):
    store.cache.insert_one(entry("a", "u/d", 1.0))

    with pytest.raises(CacheIndexMissing, match="createIndex"):
        read_cache_period(store.cache, store.events, DAY, NEXT_DAY)
    assert INDEX_NAME not in store.cache.index_information()

    period = read_cache_period(store.cache, store.events, DAY, NEXT_DAY, create_index=True)  # the operator asked for it
    assert INDEX_NAME in store.cache.index_information() and period.tallies["a"].success.tolist() == [1.0]


def test_a_day_is_read_one_kind_at_a_time_on_the_index(store, cache, mongo_url):
    cache.insert_many([entry(kind, f"u/d{i}-{day}", 1.0, updated_at=NOON + dt.timedelta(days=day)) for kind in ("a", "b") for i in range(20) for day in (-3, 0, 3)])

    with logged_store(mongo_url, store) as (logged, log):
        read_cache_period(logged.cache, logged.events, DAY, NEXT_DAY)

    finds = [command for command in log.named("find") if command["find"] == store.cache.name]
    assert [command["filter"][Cache.KIND] for command in finds] == ["a", "b"] and all(command["hint"] == INDEX_NAME for command in finds)
    explained = store.cache.database.command(
        "explain", {"find": store.cache.name, "filter": finds[0]["filter"], "hint": INDEX_NAME}, verbosity="executionStats"
    )
    assert query_plan_of(explained)["executionStats"]["totalDocsExamined"] == 20  # the day's entries of one kind only


def test_where_finished_jobs_are_deleted_the_history_is_the_cache(store, cache):
    cache.insert_one(entry("a", "u/d", 5.0))
    store.jobs.insert_one(job("a", Status.SUCCESS, 99))  # a kept-jobs shape: ignored by a deleting generation

    assert read_history(store, QUEUE_GENERATIONS["2026-05"], DAY, NEXT_DAY).tallies["a"].success.tolist() == [5.0]
    assert read_history(store, QUEUE_GENERATIONS["2023-01"], DAY, NEXT_DAY).tallies["a"].success.tolist() == [99.0]
