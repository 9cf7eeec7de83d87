"""The vocabulary: job and cache documents of every shape read without error, names checked, dates made UTC.

Documents are written to the real server and read back through pymongo before the
helpers see them, so the tests cover what BSON round trips actually return
(aware datetimes, missing keys, explicit nulls).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest
from bson import ObjectId

from tests.helpers import found
from zombie_pipeline.queue import audit_documents
from zombie_pipeline.queue.audit_documents import CompensationEntry, Event, PreviousEntry, ScheduledRetry
from zombie_pipeline.queue.cache import Cache, CacheEntry, ErrorCode, cache_key_of_job
from zombie_pipeline.queue.generations import OLDEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import (
    ID,
    MAX_NAME_LENGTH,
    Job,
    JobDocument,
    Status,
    job_row,
    job_type_problem,
    name_problem,
)
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.times import as_utc, truncate_ms, utc_now

UTC = dt.UTC
NOW = dt.datetime(2024, 7, 1, 12, 0, 0, tzinfo=UTC)
JOB_FIELDS = QUEUE_GENERATIONS[OLDEST_QUEUE_GENERATION].job_fields


# --- jobs of older and newer shapes ----------------------------------------------


def job_document(dataset: str, config=None, split=None, **extra) -> dict:
    document = {
        Job.TYPE: "/first-rows",
        Job.DATASET: dataset,
        Job.UNICITY_ID: QUEUE_GENERATIONS[OLDEST_QUEUE_GENERATION].unicity_id(
            "/first-rows", dataset, None, config, split
        ),
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

    naive_client: MongoClient[Mapping[str, Any]] = MongoClient(mongo_url, tz_aware=False)
    try:
        naive_client[queue_db.name]["jobsBlue"].insert_one(job_document("u/naive", **{Job.LAST_HEARTBEAT: NOW}))
        stored = found(naive_client[queue_db.name]["jobsBlue"].find_one())
    finally:
        naive_client.close()

    assert stored[Job.LAST_HEARTBEAT].tzinfo is None
    assert as_utc(stored[Job.LAST_HEARTBEAT]) == NOW
    assert found(as_utc(stored[Job.LAST_HEARTBEAT])).tzinfo is not None


def test_as_utc_converts_other_zones_and_refuses_non_dates():
    paris = dt.timezone(dt.timedelta(hours=2))
    assert as_utc(dt.datetime(2024, 7, 1, 14, 0, tzinfo=paris)) == NOW
    assert found(as_utc(dt.datetime(2024, 7, 1, 14, 0, tzinfo=paris))).utcoffset() == dt.timedelta(0)
    for not_a_date in (None, "2024-07-01T12:00:00Z", 1719835200, dt.date(2024, 7, 1)):
        assert as_utc(not_a_date) is None


def test_now_is_at_the_millisecond_bson_keeps(queue_db):
    moment = utc_now()
    queue_db["dates"].insert_one({"at": moment})

    assert moment.tzinfo is not None and moment.microsecond % 1000 == 0
    assert queue_db["dates"].find_one()["at"] == moment  # written and read back, equal
    assert truncate_ms(dt.datetime(2024, 7, 1, 12, 0, 0, 123_456, tzinfo=UTC)).microsecond == 123_000


# --- names and values ----------------------------------------------------------


def test_statuses_codes_and_reasons_are_stored_as_plain_strings(queue_db):
    queue_db["values"].insert_one(
        {"status": Status.STARTED, "code": ErrorCode.CRASHED, "reason": Reason.NEVER_HEARTBEATED}
    )

    stored = queue_db["values"].find_one()

    assert (stored["status"], stored["code"], stored["reason"]) == (
        "started",
        "JobManagerCrashedError",
        "never_heartbeated",
    )
    assert type(stored["status"]) is str
    assert queue_db["values"].count_documents({"status": "started"}) == 1


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "type is missing"),
        (42, "type is missing or not a non-empty string"),
        ("", "type is missing"),
        ("/" + "x" * MAX_NAME_LENGTH, f"longer than {MAX_NAME_LENGTH}"),
        ("$where", "starts with '$'"),
        ("/first.rows", "contains a dot"),
        ("tab\there", "control character"),
    ],
)
def test_a_job_type_that_is_no_name_says_why(value, problem):
    assert problem in found(job_type_problem(value))


def test_valid_names_have_no_problem_and_only_a_type_refuses_dots():
    assert job_type_problem("/split-names-from-streaming") is None
    assert job_type_problem("x" * MAX_NAME_LENGTH) is None
    assert name_problem(Job.DATASET, "user/dotted.name") is None  # dots are legal in Hub names
    assert name_problem(Job.DATASET, "$gt") == "dataset starts with '$'"


def test_a_job_row_names_the_job_and_carries_the_extras():
    job_id = ObjectId()
    job = {Job.TYPE: "/splits", Job.DATASET: "u/d", Job.SPLIT: "train", Job.STATUS: Status.STARTED}

    row = job_row(job_id, job, reason=Reason.MISSING_HEARTBEAT)

    assert row == {
        "job_id": str(job_id),
        "type": "/splits",
        "dataset": "u/d",
        "config": None,
        "split": "train",
        "reason": Reason.MISSING_HEARTBEAT,
    }


# --- the shapes, named once ---------------------------------------------------------------------------------


def _names(vocabulary: type) -> set[str]:
    return {value for name, value in vars(vocabulary).items() if name.isupper() and isinstance(value, str)}


@pytest.mark.parametrize(
    "shape, vocabulary, besides",
    [
        (JobDocument, Job, {ID}),
        (CacheEntry, Cache, {ID}),
        (audit_documents.ZombieEvent, Event, {ID}),
        (audit_documents.RetryDocument, ScheduledRetry, {ID}),
        (audit_documents.CompensationRecord, CompensationEntry, set()),
        (audit_documents.PreviousEntrySummary, PreviousEntry, set()),
        (audit_documents.LateResultRecord, audit_documents.LateResult, set()),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_each_document_shape_has_exactly_the_fields_its_vocabulary_names(shape, vocabulary, besides):
    """A field is named once (the vocabulary's constant) and typed once (the shape): the two never drift apart."""
    assert set(shape.__annotations__) == _names(vocabulary) | besides


def test_an_events_cache_result_is_a_part_of_the_event():
    assert set(audit_documents.CacheResult.__annotations__) <= set(audit_documents.ZombieEvent.__annotations__)
