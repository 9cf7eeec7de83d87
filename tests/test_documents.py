"""The document model: cache generations, and documents of every shape read without error.

Documents are written to the real server and read back through pymongo before the
helpers see them, so the tests cover what BSON round trips actually return
(aware datetimes, missing keys, explicit nulls).
"""

from __future__ import annotations

import datetime as dt

import pytest

from zombie_pipeline.documents import (
    CACHE_GENERATIONS,
    ID,
    JOB_FIELDS,
    NEWEST_CACHE_GENERATION,
    OLDEST_CACHE_GENERATION,
    Cache,
    Job,
    Status,
    as_utc,
    cache_generation_of,
    cache_key_of_job,
    failed_runs_of,
    runner_version_of,
    unicity_id,
)

UTC = dt.timezone.utc
NOW = dt.datetime(2024, 7, 1, 12, 0, 0, tzinfo=UTC)


def entry_of(generation_name: str, **overrides) -> dict:
    """A cache entry carrying every field its generation declares, and nothing else."""
    values = {
        Cache.KIND: "/splits",
        Cache.DATASET: "user/ds",
        Cache.CONFIG: "default",
        Cache.SPLIT: "train",
        Cache.HTTP_STATUS: 500,
        Cache.ERROR_CODE: "UnexpectedError",
        Cache.CONTENT: {"error": "boom"},
        Cache.DETAILS: {"error": "boom"},
        Cache.WORKER_VERSION: "1.0.0",
        Cache.JOB_RUNNER_VERSION: 3,
        Cache.DATASET_GIT_REVISION: "abc",
        Cache.PROGRESS: 1.0,
        Cache.UPDATED_AT: NOW,
        Cache.DURATION: 1.5,
        Cache.FAILED_RUNS: 2,
    }
    fields = CACHE_GENERATIONS[generation_name].fields
    entry = {name: value for name, value in values.items() if name in fields}
    entry.update(overrides)
    return entry


# --- cache generations -----------------------------------------------------------


def test_generations_run_from_oldest_to_newest_and_each_adds_fields():
    names = list(CACHE_GENERATIONS)
    assert names == sorted(names)
    assert names[0] == OLDEST_CACHE_GENERATION and names[-1] == NEWEST_CACHE_GENERATION
    assert len(names) >= 4


@pytest.mark.parametrize("generation_name", list(CACHE_GENERATIONS))
def test_entries_of_each_generation_are_recognized_after_a_round_trip(cache_db, generation_name):
    cache = cache_db["cachedResponsesBlue"]
    cache.insert_many([entry_of(generation_name), entry_of(generation_name, **{Cache.DATASET: "user/other"})])

    seen: set[str] = set()
    for entry in cache.find():
        seen |= set(entry)

    assert ID in seen  # the _id is ignored by the detection
    assert cache_generation_of(seen).name == generation_name


def test_an_entry_with_only_the_base_fields_is_the_oldest_generation():
    base = set(entry_of("2023-01")) - {Cache.WORKER_VERSION}
    assert cache_generation_of(base).name == OLDEST_CACHE_GENERATION


def test_the_version_field_tells_worker_version_from_job_runner_version():
    assert cache_generation_of({Cache.KIND, Cache.WORKER_VERSION}).name == "2023-01"
    assert cache_generation_of({Cache.KIND, Cache.JOB_RUNNER_VERSION}).name == "2023-03"
    assert cache_generation_of({Cache.KIND, Cache.JOB_RUNNER_VERSION, Cache.FAILED_RUNS}).name == "2024-01"
    assert CACHE_GENERATIONS["2023-01"].version_field == Cache.WORKER_VERSION
    assert CACHE_GENERATIONS["2024-07"].version_field == Cache.JOB_RUNNER_VERSION


def test_a_field_no_generation_declares_means_the_newest():
    assert cache_generation_of({Cache.KIND, "some_future_field"}).name == NEWEST_CACHE_GENERATION


def test_an_empty_collection_is_read_as_the_oldest_generation():
    assert cache_generation_of(set()).name == OLDEST_CACHE_GENERATION


# --- cache entries of older and newer shapes -------------------------------------


def test_runner_version_is_read_from_either_generation(cache_db):
    cache = cache_db["cachedResponsesBlue"]
    cache.insert_many(
        [
            entry_of("2023-01", **{Cache.DATASET: "old"}),  # worker_version "1.0.0"
            entry_of("2024-07", **{Cache.DATASET: "new"}),  # job_runner_version 3
            {Cache.KIND: "/splits", Cache.DATASET: "none", Cache.HTTP_STATUS: 200},
        ]
    )
    read = {entry[Cache.DATASET]: entry for entry in cache.find()}

    assert runner_version_of(read["old"]) == "1.0.0"
    assert runner_version_of(read["new"]) == 3
    assert runner_version_of(read["none"]) is None


def test_failed_runs_are_read_from_the_field_from_details_or_are_zero(cache_db):
    cache = cache_db["cachedResponsesBlue"]
    cache.insert_many(
        [
            {Cache.DATASET: "field", Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: 2},
            {Cache.DATASET: "details", Cache.HTTP_STATUS: 500, Cache.DETAILS: {Cache.FAILED_RUNS: 4}},
            {Cache.DATASET: "absent", Cache.HTTP_STATUS: 500, Cache.DETAILS: {"error": "x"}},
            {Cache.DATASET: "null", Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: None},
            {Cache.DATASET: "garbage", Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: "many"},
            {Cache.DATASET: "negative", Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: -1},
            {Cache.DATASET: "details-not-a-dict", Cache.HTTP_STATUS: 500, Cache.DETAILS: "text"},
            {Cache.DATASET: "success-resets", Cache.HTTP_STATUS: 200, Cache.FAILED_RUNS: 5},
        ]
    )
    read = {entry[Cache.DATASET]: failed_runs_of(entry) for entry in cache.find()}

    assert read == {
        "field": 2,
        "details": 4,
        "absent": 0,
        "null": 0,
        "garbage": 0,
        "negative": 0,
        "details-not-a-dict": 0,
        "success-resets": 0,
    }
    assert failed_runs_of(None) == 0
    assert failed_runs_of({}) == 0


# --- jobs of older and newer shapes ----------------------------------------------


def job_document(dataset: str, config=None, split=None, **extra) -> dict:
    document = {
        Job.TYPE: "/first-rows",
        Job.DATASET: dataset,
        Job.UNICITY_ID: unicity_id("/first-rows", dataset, config, split),
        Job.NAMESPACE: dataset.split("/")[0],
        Job.FORCE: False,
        Job.PRIORITY: "normal",
        Job.STATUS: Status.STARTED,
        Job.CREATED_AT: NOW - dt.timedelta(minutes=10),
        Job.STARTED_AT: NOW - dt.timedelta(minutes=9),
    }
    if config is not None:
        document[Job.CONFIG] = config
    if split is not None:
        document[Job.SPLIT] = split
    document.update(extra)
    return document


def test_jobs_without_config_split_or_heartbeat_are_read(queue_db):
    jobs = queue_db["jobsBlue"]
    jobs.insert_many(
        [
            job_document("u/no-heartbeat"),  # mongoengine stores no key for None
            job_document("u/null-heartbeat", **{Job.LAST_HEARTBEAT: None}),
            job_document("u/full", "en", "train", **{Job.LAST_HEARTBEAT: NOW}),
            job_document("u/explicit-nulls", **{Job.CONFIG: None, Job.SPLIT: None}),
        ]
    )
    read = {job[Job.DATASET]: job for job in jobs.find()}

    assert as_utc(read["u/no-heartbeat"].get(Job.LAST_HEARTBEAT)) is None
    assert as_utc(read["u/null-heartbeat"].get(Job.LAST_HEARTBEAT)) is None
    assert as_utc(read["u/full"][Job.LAST_HEARTBEAT]) == NOW

    assert cache_key_of_job(read["u/no-heartbeat"]) == {
        Cache.KIND: "/first-rows",
        Cache.DATASET: "u/no-heartbeat",
        Cache.CONFIG: None,
        Cache.SPLIT: None,
    }
    assert cache_key_of_job(read["u/explicit-nulls"]) == cache_key_of_job(read["u/no-heartbeat"]) | {
        Cache.DATASET: "u/explicit-nulls"
    }
    assert cache_key_of_job(read["u/full"]) == {
        Cache.KIND: "/first-rows",
        Cache.DATASET: "u/full",
        Cache.CONFIG: "en",
        Cache.SPLIT: "train",
    }
    for job in read.values():
        assert set(job) - {ID} <= JOB_FIELDS


def test_the_cache_key_of_a_job_finds_its_entry_written_without_config_and_split(queue_db, cache_db):
    queue_db["jobsBlue"].insert_one(job_document("u/ds"))
    cache_db["cachedResponsesBlue"].insert_one(
        {Cache.KIND: "/first-rows", Cache.DATASET: "u/ds", Cache.HTTP_STATUS: 200}
    )
    job = queue_db["jobsBlue"].find_one()

    # {config: None} matches a missing key in MongoDB, as in the deployment's unique index
    assert cache_db["cachedResponsesBlue"].count_documents(cache_key_of_job(job)) == 1


# --- dates -----------------------------------------------------------------------


def test_as_utc_makes_naive_dates_from_a_naive_client_aware(mongo_url, queue_db):
    from pymongo import MongoClient

    naive_client = MongoClient(mongo_url, tz_aware=False)
    try:
        naive_client[queue_db.name]["jobsBlue"].insert_one(job_document("u/naive", **{Job.LAST_HEARTBEAT: NOW}))
        stored = naive_client[queue_db.name]["jobsBlue"].find_one()
    finally:
        naive_client.close()

    assert stored[Job.LAST_HEARTBEAT].tzinfo is None
    assert as_utc(stored[Job.LAST_HEARTBEAT]) == NOW
    assert as_utc(stored[Job.LAST_HEARTBEAT]).tzinfo is not None


def test_as_utc_converts_other_zones_and_refuses_non_dates():
    paris = dt.timezone(dt.timedelta(hours=2))
    assert as_utc(dt.datetime(2024, 7, 1, 14, 0, tzinfo=paris)) == NOW
    assert as_utc(dt.datetime(2024, 7, 1, 14, 0, tzinfo=paris)).utcoffset() == dt.timedelta(0)
    for not_a_date in (None, "2024-07-01T12:00:00Z", 1719835200, dt.date(2024, 7, 1)):
        assert as_utc(not_a_date) is None
