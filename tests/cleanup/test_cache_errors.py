"""The error users see (``cleanup/cache_errors.py``): the deployment's entry, in the cache's generation, never over a fresher one."""

from __future__ import annotations

import pytest

from tests.helpers import ago, found
from tests.helpers import crashed_job as crashed_2023_job
from zombie_pipeline.cleanup.cache_errors import CacheErrors, error_entry
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import CacheOutcome, Event, ZombieEvent
from zombie_pipeline.queue.cache import CACHE_CONTENT_ERROR, Cache, CacheMetric, ErrorCode, cache_key_of_job
from zombie_pipeline.queue.cache_entries import DETAIL_JOB_ID, stored_failed_runs
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, NEWEST_QUEUE_GENERATION
from zombie_pipeline.queue.jobs import ID, JobDocument
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document

POLICY = ZombiePolicy()


def crashed_job(dataset: str = "user/crashed", **fields) -> JobDocument:
    """A zombie of today's queue, whose jobs carry their dataset's revision."""
    return crashed_2023_job(dataset, generation=NEWEST_QUEUE_GENERATION, **fields)


NEWEST = CACHE_GENERATIONS["2024-07"]


def event_of(job: JobDocument, reason: str = Reason.MISSING_HEARTBEAT, code: str = ErrorCode.CRASHED) -> ZombieEvent:
    """A claimed zombie's event, as the write-ahead log holds it."""
    return {
        ID: job[ID],
        Event.JOB: job,
        Event.REASON: reason,
        Event.ERROR_CODE: code,
        Event.THRESHOLD_SECONDS: 300,
        Event.FINALIZED_AT: utc_now(),
        Event.RUN_ID: "run",
    }


@pytest.mark.parametrize("generation", list(CACHE_GENERATIONS))
def test_the_error_entry_has_only_the_fields_its_generation_declares(generation):
    cache = CACHE_GENERATIONS[generation]
    job = crashed_job(revision="r2")
    previous = cache_document(job, ago(3_600), http_status=500, error_code="UnexpectedError", generation=generation)

    entry = error_entry(event_of(job), previous, cache, POLICY.http_status, failed_runs=2)

    assert set(entry) <= cache.fields
    assert (entry[Cache.HTTP_STATUS], entry[Cache.ERROR_CODE]) == (501, ErrorCode.CRASHED)
    assert entry[Cache.CONTENT] == {CACHE_CONTENT_ERROR: entry[Cache.DETAILS][CACHE_CONTENT_ERROR]}
    assert stored_failed_runs(entry) == 2  # its field where declared, else in details, the deployment's free dict
    for name in (Cache.DURATION, Cache.FAILED_RUNS):
        assert (name in entry) == cache.declares(name)


def test_the_entry_carries_the_jobs_revision_and_the_steps_version_the_cache_shows_never_an_invented_one():
    job = crashed_job(revision="rev-9")
    previous = cache_document(job, ago(3_600), generation=NEWEST.name) | {Cache.JOB_RUNNER_VERSION: 7}

    entry = error_entry(event_of(job), previous, NEWEST, POLICY.http_status, failed_runs=1, step_version=8)

    assert entry[Cache.DATASET_GIT_REVISION] == "rev-9"
    assert entry[Cache.JOB_RUNNER_VERSION] == 8  # the step's, as the deployment writes it on a crash
    assert (
        error_entry(event_of(job), None, NEWEST, POLICY.http_status, 1, step_version=8)[Cache.JOB_RUNNER_VERSION] == 8
    )
    assert error_entry(event_of(job), previous, NEWEST, POLICY.http_status, 1)[Cache.JOB_RUNNER_VERSION] == 7
    assert Cache.JOB_RUNNER_VERSION not in error_entry(
        event_of(job), None, NEWEST, POLICY.http_status, 1
    )  # where the cache shows none: never invented


def metrics(store) -> dict[tuple, int]:
    return {
        (row[CacheMetric.KIND], row[CacheMetric.HTTP_STATUS], row[CacheMetric.ERROR_CODE]): row[CacheMetric.TOTAL]
        for row in store.cache_metrics.find()
    }


def test_a_batch_writes_each_error_once_counting_failed_runs_as_the_deployment_does(store):
    failed_before, first_time = (
        crashed_job("user/failed-before", revision="r1"),
        crashed_job("user/first-time", revision="r1"),
    )
    store.cache.insert_one(
        cache_document(failed_before, ago(86_400), http_status=500, error_code="UnexpectedError", failed_runs=1)
    )
    batch = [event_of(failed_before), event_of(first_time)]

    outcomes = CacheErrors(store, NEWEST, POLICY.http_status, keeps_metrics=True).write(batch).outcomes

    assert {
        event_id: (outcome[Event.CACHE_OUTCOME], outcome[Event.FAILED_RUNS]) for event_id, outcome in outcomes.items()
    } == {
        failed_before[ID]: (CacheOutcome.WRITTEN, 2),
        first_time[ID]: (CacheOutcome.WRITTEN, 1),
    }
    for job in (failed_before, first_time):
        entry = store.cache.find_one(cache_key_of_job(job))
        assert entry[Cache.ERROR_CODE] == ErrorCode.CRASHED and entry[Cache.DETAILS][DETAIL_JOB_ID] == str(job[ID])
    assert metrics(store) == {("/splits", 500, "UnexpectedError"): -1, ("/splits", 501, ErrorCode.CRASHED): 2}
    previous = found(outcomes[failed_before[ID]][Event.PREVIOUS_ENTRY])
    assert (previous[Cache.HTTP_STATUS], previous[Cache.ERROR_CODE], previous[Cache.FAILED_RUNS]) == (
        500,
        "UnexpectedError",
        1,
    )


def test_a_batch_written_again_recognizes_its_entries_and_writes_nothing(store):
    job = crashed_job(revision="r1")
    batch = [event_of(job)]
    first = CacheErrors(store, NEWEST, POLICY.http_status, keeps_metrics=True).write(batch)
    entry, counted = store.cache.find_one(), metrics(store)

    again = CacheErrors(store, NEWEST, POLICY.http_status, keeps_metrics=True).write(
        batch
    )  # a pass redone after a crash

    assert again.outcomes == first.outcomes
    assert store.cache.find_one() == entry and metrics(store) == counted
    # whether the pass that died moved cacheTotalMetric nobody knows: its keys are left to a recount, never moved
    assert again.in_doubt.cache_metrics == {("/splits", 501, ErrorCode.CRASHED)} and not first.in_doubt


def test_an_entry_updated_after_the_zombie_started_is_fresher_and_kept(store):
    job = crashed_job(revision="r1")  # started 900 s ago
    newer = cache_document(job, ago(60), http_status=200)  # a result written since: a newer run's
    store.cache.insert_one(newer)

    outcomes = CacheErrors(store, NEWEST, POLICY.http_status, keeps_metrics=True).write([event_of(job)]).outcomes

    assert outcomes[job[ID]][Event.CACHE_OUTCOME] == CacheOutcome.SKIPPED_FRESHER
    assert store.cache.find_one() == newer and metrics(store) == {}
