"""The generations of the deployment's documents: which fields each declares, and how to tell them apart.

Entries are written to the real server and read back through pymongo before the
helpers see them, so the tests cover what BSON round trips actually return
(missing keys, explicit nulls).
"""

from __future__ import annotations

import datetime as dt

import pytest

from zombie_pipeline.queue.cache import Cache
from zombie_pipeline.queue.cache_entries import failed_runs_after_crash, runner_version_of, stored_failed_runs
from zombie_pipeline.queue.generations import (
    CACHE_GENERATIONS,
    NEWEST_CACHE_GENERATION,
    OLDEST_CACHE_GENERATION,
    OLDEST_QUEUE_GENERATION,
    QUEUE_GENERATIONS,
    FailedRunsRule,
    FinishStyle,
    cache_generation_of,
)
from zombie_pipeline.queue.jobs import ID, STATUSES, Job

UTC = dt.UTC
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
            {Cache.DATASET: "a-success", Cache.HTTP_STATUS: 200, Cache.FAILED_RUNS: 5},
        ]
    )
    read = {entry[Cache.DATASET]: stored_failed_runs(entry) for entry in cache.find()}

    assert read == {
        "field": 2,
        "details": 4,
        "absent": 0,
        "null": 0,
        "garbage": 0,
        "negative": 0,
        "details-not-a-dict": 0,
        "a-success": 5,
    }
    assert stored_failed_runs(None) == 0
    assert stored_failed_runs({}) == 0


def test_a_crash_counts_one_failed_run_more_than_the_entry_of_the_same_revision():
    job = {Job.TYPE: "/splits", Job.DATASET: "u/d", Job.REVISION: "r2"}

    assert failed_runs_after_crash(None, job) == 1
    assert (
        failed_runs_after_crash({Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: 2, Cache.DATASET_GIT_REVISION: "r2"}, job)
        == 3
    )
    assert (
        failed_runs_after_crash({Cache.HTTP_STATUS: 200, Cache.FAILED_RUNS: 2, Cache.DATASET_GIT_REVISION: "r2"}, job)
        == 3
    )
    assert (
        failed_runs_after_crash({Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: 2, Cache.DATASET_GIT_REVISION: "r1"}, job)
        == 1
    )
    assert (
        failed_runs_after_crash({Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: 2}, {Job.TYPE: "/splits"}) == 3
    )  # no revision


@pytest.mark.parametrize(
    ("previous", "failed_runs"),
    [
        pytest.param(None, 0, id="no-entry"),
        pytest.param({Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: 2, Cache.DATASET_GIT_REVISION: "r1"}, 0, id="r1"),
        pytest.param({Cache.HTTP_STATUS: 500, Cache.FAILED_RUNS: 2, Cache.DATASET_GIT_REVISION: "r2"}, 3, id="r2"),
    ],
)
def test_until_2026_a_crash_counts_a_failed_run_only_after_an_entry_of_its_revision(previous, failed_runs):
    job = {Job.TYPE: "/splits", Job.DATASET: "u/d", Job.REVISION: "r2"}
    rule = FailedRunsRule.SAME_REVISION_ELSE_ZERO

    assert failed_runs_after_crash(previous, job, rule) == failed_runs
    assert {QUEUE_GENERATIONS[name].failed_runs for name in ("2023-12", "2024-06")} == {rule}
    assert QUEUE_GENERATIONS["2026-05"].failed_runs is FailedRunsRule.EVERY_FAILURE


def test_an_entry_keeps_only_what_its_generation_declares():
    entry = {ID: 1, **entry_of(NEWEST_CACHE_GENERATION), Cache.CONFIG: None, "some_future_field": 1}

    kept = CACHE_GENERATIONS[OLDEST_CACHE_GENERATION].keep_declared(entry)

    assert kept[ID] == 1  # the _id is never a field to drop
    assert set(kept) - {ID} == CACHE_GENERATIONS[OLDEST_CACHE_GENERATION].fields - {Cache.CONFIG, Cache.WORKER_VERSION}
    assert Cache.CONFIG not in kept  # None is dropped, as mongoengine stores no key for it


# --- queue generations -------------------------------------------------------------


def test_the_oldest_queue_generation_declares_the_early_2023_job_and_every_status():
    generation = QUEUE_GENERATIONS[OLDEST_QUEUE_GENERATION]

    assert generation.job_fields == {
        Job.TYPE, Job.DATASET, Job.CONFIG, Job.SPLIT, Job.UNICITY_ID, Job.NAMESPACE, Job.FORCE, Job.PRIORITY,
        Job.STATUS, Job.CREATED_AT, Job.STARTED_AT, Job.FINISHED_AT, Job.LAST_HEARTBEAT,
    }  # fmt: skip
    assert generation.statuses == STATUSES
    assert generation.finish is FinishStyle.KEPT_AS_ERROR
