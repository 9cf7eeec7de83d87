"""Late results (``cleanup/late_results.py``): finalized jobs that showed life afterwards, counted once, never undone."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.helpers import ago, crashed_job, found, job_document
from zombie_pipeline import trail
from zombie_pipeline.cleanup.late_results import audit_late_results
from zombie_pipeline.cleanup.results import Count
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.observability import metrics
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, LateEvidence, LateResult
from zombie_pipeline.queue.cache import Cache, CacheEntry, cache_key_of_job
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import Job, JobDocument
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.statistics.window import window_report

POLICY = ZombiePolicy(claim_lease_seconds=0)
TODAY = "2026-05"  # finished jobs deleted, cache entries with their duration
KEPT = "2023-07"  # finished jobs kept with their status, cache entries without a duration


def finalized(store: Store, generation: str, dataset: str = "user/slow") -> JobDocument:
    """A job whose worker looked dead (silent for 800 s), finalized by a cleanup: returned as detection saw it."""
    job = crashed_job(dataset, generation=generation)
    store.jobs.insert_one(job)
    assert run_cleanup(store, policy_of(generation), "run-1").counts[Count.FINALIZED] == 1
    return job


def policy_of(generation: str) -> ZombiePolicy:
    return POLICY.model_copy(update={"queue_generation": generation})


def result_of(job: JobDocument, generation: str, started_at: dt.datetime, updated_at: dt.datetime) -> CacheEntry:
    """What a worker writes at the end of a run that started at ``started_at``: a success, its duration measured."""
    cache = QUEUE_GENERATIONS[generation].cache_generation
    return cache_document(job, updated_at, generation=cache, duration=(updated_at - started_at).total_seconds())


def write_result(store: Store, job: JobDocument, generation: str, started_at: dt.datetime) -> dt.datetime:
    """The worker's success, written now over whatever the cache holds; when it was written."""
    written_at = utc_now()
    store.cache.replace_one(cache_key_of_job(job), result_of(job, generation, started_at, written_at))
    return written_at


def late_result(store: Store, job: JobDocument) -> dict[str, object] | None:
    event = found(store.events.find_one({"_id": job["_id"]}))
    record = event.get(Event.LATE_RESULT)
    return dict(record) if record is not None else None


def test_a_slow_workers_success_written_after_its_job_was_finalized_is_a_late_result_counted_once(store):
    job = finalized(store, TODAY)
    written_at = write_result(store, job, TODAY, started_at=job[Job.STARTED_AT])  # the same run, ended at last

    assert audit_late_results(store, POLICY, utc_now()) == 1
    record = found(late_result(store, job))
    assert record[LateResult.EVIDENCE] == LateEvidence.RESULT
    assert abs((record[LateResult.SEEN_AT] - written_at).total_seconds()) < 0.01  # type: ignore[operator]
    assert record[LateResult.SECONDS_AFTER] > 0  # type: ignore[operator]
    assert found(store.cache.find_one(cache_key_of_job(job)))[Cache.HTTP_STATUS] == 200  # the worker's, kept

    assert audit_late_results(store, POLICY, utc_now()) == 0  # counted once
    assert late_result(store, job) == record
    assert trail.audit_totals(store.events, metrics.DETECTION_BUCKETS, metrics.RELEASE_LAG_BUCKETS).late_results == {
        job[Job.TYPE]: 1
    }
    generation = QUEUE_GENERATIONS[TODAY]
    report = window_report(store, generation, POLICY, [], ago(86_400), utc_now() + dt.timedelta(seconds=1))
    assert report.late_results == {job[Job.TYPE]: 1}


def test_a_cleanup_run_audits_the_jobs_finalized_before_and_counts_what_it_found(store):
    job = finalized(store, TODAY)
    write_result(store, job, TODAY, started_at=job[Job.STARTED_AT])

    report = run_cleanup(store, policy_of(TODAY), "run-2")

    assert report.counts[Count.LATE_RESULTS] == 1 and late_result(store, job) is not None


def test_a_retrys_result_is_not_a_late_result(store):
    """The retry's run started after the finalization: its duration does not reach back to the job's start."""
    job = finalized(store, TODAY)
    write_result(store, job, TODAY, started_at=utc_now() - dt.timedelta(seconds=30))

    assert audit_late_results(store, POLICY, utc_now()) == 0
    assert late_result(store, job) is None


@pytest.mark.parametrize("generation", [TODAY, KEPT])
def test_our_own_error_entry_is_not_a_late_result(store, generation):
    job = finalized(store, generation)

    assert audit_late_results(store, POLICY, utc_now()) == 0
    assert late_result(store, job) is None


def test_where_finished_jobs_are_kept_a_heartbeat_after_the_finalization_is_a_late_result(store):
    """The deployment's heartbeat writes whatever the job's status: a worker still running beats on an error job."""
    job = finalized(store, KEPT)
    beat = utc_now()
    store.jobs.update_one({"_id": job["_id"]}, {"$set": {Job.LAST_HEARTBEAT: beat}})

    assert audit_late_results(store, POLICY, utc_now()) == 1
    record = found(late_result(store, job))
    assert (record[LateResult.EVIDENCE], record[LateResult.SEEN_AT]) == (LateEvidence.HEARTBEAT, beat)


def test_where_finished_jobs_are_kept_a_result_with_no_job_started_since_is_the_same_runs(store):
    """Without a duration in the cache entry, a result is the late run's only if nothing of its unicity id started
    since the finalization."""
    late, retried = finalized(store, KEPT, "user/late"), finalized(store, KEPT, "user/retried")
    for job in (late, retried):
        write_result(store, job, KEPT, started_at=job[Job.STARTED_AT])
    store.jobs.insert_one(
        job_document(dataset="user/retried", generation=KEPT, started_at=utc_now(), last_heartbeat=utc_now())
    )

    assert audit_late_results(store, POLICY, utc_now()) == 1
    assert found(late_result(store, late))[LateResult.EVIDENCE] == LateEvidence.RESULT
    assert late_result(store, retried) is None


def test_jobs_finalized_before_the_window_are_no_longer_watched(store):
    job = finalized(store, TODAY)
    write_result(store, job, TODAY, started_at=job[Job.STARTED_AT])
    policy = POLICY.model_copy(update={"late_result_window_hours": 1})

    assert audit_late_results(store, policy, utc_now() + dt.timedelta(hours=2)) == 0
