"""Every death with its cause (``cleanup/causes.py``), and each cause's retry (``cleanup/retries.py``).

The cause is judged from the queue alone: a wave of workers stopped at once is a deploy, SIGTERM is a deploy, a
worker that died alone a crash (or, without a heartbeat ever, never_started), a live job past T2 a timeout. It is
recorded on the event, in the cache error's details, in the run's counts, and it decides the retry: a deploy death
costs no failed run and runs again at once, a timeout runs once more at +20 difficulty, a crash is counted as the
deployment counts it. At the early-2023 queue (finished jobs kept as ``error``) and today's (deleted).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest

from tests.faults.scenario import counters_off
from tests.helpers import cleanup_at, found
from zombie_pipeline.cleanup import causes
from zombie_pipeline.cleanup.run import run_cleanup, summarize
from zombie_pipeline.messages import DEPLOY_WAVE_MESSAGE
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, RetryOutcome, ScheduledRetry, ZombieEvent
from zombie_pipeline.queue.cache import CACHE_CONTENT_ERROR, CACHE_METRICS_COLLECTION, Cache, CacheEntry
from zombie_pipeline.queue.cache_entries import DETAIL_QUARANTINED, stored_failed_runs
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms
from zombie_pipeline.simulation.shapes import cache_document, job_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload
from zombie_pipeline.trail import causes_between

NOW = truncate_ms(dt.datetime(2026, 6, 10, 12, 0, tzinfo=dt.UTC))
#: The early-2023 queue (finished jobs kept as error, no difficulty, no failed_runs field) and today's.
BOTH = pytest.mark.parametrize("generation", ["2023-01", "2026-05"])
#: A kept queue with difficulty (July 2023) and today's: the retry's difficulty can be read.
WITH_DIFFICULTY = pytest.mark.parametrize("generation", ["2023-07", "2026-05"])


def ago(seconds: float) -> dt.datetime:
    return truncate_ms(NOW - dt.timedelta(seconds=seconds))


def deployment(store: Store, generation: str, **policy: Any) -> ZombiePolicy:
    """An empty queue as ``generation``'s deployment leaves it (its collections and counters); the policy for it."""
    nothing = Workload(
        finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0, waiting=0, generation=generation
    )
    simulate(store, nothing, now=NOW - dt.timedelta(days=1))
    cache = QUEUE_GENERATIONS[generation].cache_generation
    return ZombiePolicy(**{"queue_generation": generation, "cache_generation": cache, **policy})


def dead_job(generation: str, dataset: str, last_heartbeat: dt.datetime | None, **fields: Any) -> JobDocument:
    """A started job of ``dataset`` whose worker was last heard of at ``last_heartbeat`` (None: never)."""
    started_at = fields.pop("started_at", (last_heartbeat or ago(700)) - dt.timedelta(minutes=5))
    job_type = fields.pop("job_type", "/first-rows")
    return job_document(
        job_type, dataset, generation=generation, started_at=started_at, last_heartbeat=last_heartbeat, **fields
    )


def events_by_dataset(store: Store) -> dict[str, ZombieEvent]:
    return {event[Event.JOB][Job.DATASET]: event for event in store.events.find()}


def entry_of(store: Store, dataset: str) -> CacheEntry:
    return found(store.cache.find_one({Cache.DATASET: dataset}))


def waiting(store: Store) -> list[JobDocument]:
    return list(store.jobs.find({Job.STATUS: Status.WAITING}))


# --- the rule, pure ----------------------------------------------------------------------------------------------


def test_fifty_workers_stopped_within_thirty_seconds_are_a_deploy_and_two_lone_crashes_an_hour_earlier_are_crashes():
    wave = [(dead_job("2026-05", f"user{n}/data", ago(400 + 30 * n / 50)), Reason.MISSING_HEARTBEAT) for n in range(50)]
    lone = [
        (dead_job("2026-05", f"lone{n}/data", ago(3_600 + 400 + 200 * n)), Reason.MISSING_HEARTBEAT) for n in (0, 1)
    ]
    judged = causes.causes_of(wave + lone, [], window_seconds=60, min_workers=10)
    assert Counter(judged) == {Cause.DEPLOY: 50, Cause.CRASH: 2}
    assert judged[-2:] == [Cause.CRASH, Cause.CRASH]


def test_nine_workers_at_once_are_no_wave_under_the_default_ten_but_ten_are():
    policy = ZombiePolicy()
    nine = [(dead_job("2026-05", f"user{n}/data", ago(400 + n)), Reason.MISSING_HEARTBEAT) for n in range(9)]
    assert set(causes.causes_of(nine, [], policy.wave_window_seconds, policy.wave_min_workers)) == {Cause.CRASH}
    ten = nine + [(dead_job("2026-05", "user9/data", ago(409)), Reason.MISSING_HEARTBEAT)]
    assert set(causes.causes_of(ten, [], policy.wave_window_seconds, policy.wave_min_workers)) == {Cause.DEPLOY}


def test_the_splits_of_one_dataset_crashing_together_are_a_poison_pill_not_a_wave():
    splits = [
        (dead_job("2026-05", "user/huge-audio", ago(400 + n), split=f"train-{n}"), Reason.MISSING_HEARTBEAT)
        for n in range(12)
    ]
    assert set(causes.causes_of(splits, [], window_seconds=60, min_workers=10)) == {Cause.CRASH}


def test_a_sigterm_is_a_deploy_a_silent_start_never_started_and_a_live_job_past_t2_a_timeout():
    jobs = [
        (dead_job("2026-05", "a/a", ago(400), terminated_at=ago(380)), Reason.TERMINATED),
        (dead_job("2026-05", "b/b", None, started_at=ago(900)), Reason.NEVER_HEARTBEATED),
        (dead_job("2026-05", "c/c", ago(20), started_at=ago(5_000)), Reason.EXCEEDED_MAX_DURATION),
        (dead_job("2026-05", "d/d", ago(600)), Reason.MISSING_HEARTBEAT),
    ]
    assert causes.causes_of(jobs, [], 60, 10) == [Cause.DEPLOY, Cause.NEVER_STARTED, Cause.TIMEOUT, Cause.CRASH]


def test_jobs_that_never_beat_and_started_in_a_wave_died_in_it():
    wave = [(dead_job("2026-05", f"user{n}/data", ago(400 + n)), Reason.MISSING_HEARTBEAT) for n in range(10)]
    starting = (dead_job("2026-05", "new/job", None, started_at=ago(405)), Reason.NEVER_HEARTBEATED)
    assert causes.causes_of([*wave, starting], [], 60, 10)[-1] == Cause.DEPLOY


# --- on the queue: recorded everywhere ------------------------------------------------------------------------------


@BOTH
def test_a_planted_wave_and_two_older_crashes_are_recorded_as_fifty_deploys_and_two_crashes(store, generation):
    policy = deployment(store, generation)
    store.jobs.insert_many([dead_job(generation, f"user{n}/data", ago(400 + 30 * n / 50)) for n in range(50)])
    store.jobs.insert_many([dead_job(generation, f"lone{n}/data", ago(3_600 + 400 + 200 * n)) for n in (0, 1)])

    counts = cleanup_at(store, policy, NOW).counts

    events = list(store.events.find())
    assert Counter(event[Event.CAUSE] for event in events) == {Cause.DEPLOY: 50, Cause.CRASH: 2}
    details = entry_of(store, "user7/data")[Cache.DETAILS]
    assert details[Event.CAUSE] == Cause.DEPLOY and details[DETAIL_QUARANTINED] is False
    assert entry_of(store, "user7/data")[Cache.CONTENT] == {CACHE_CONTENT_ERROR: DEPLOY_WAVE_MESSAGE}
    assert entry_of(store, "lone0/data")[Cache.DETAILS][Event.CAUSE] == Cause.CRASH
    summary = summarize(store, "run", counts)
    assert (summary.counts["cause:deploy"], summary.counts["cause:crash"], summary.counts["cause:timeout"]) == (
        50,
        2,
        0,
    )
    assert "| `/first-rows` | deploy | missing_heartbeat | 50 | 50 |" in summary.markdown()
    assert "by cause: 50 deploy, 2 crash, 0 never started, 0 timeout" in summary.one_line()


@BOTH
def test_a_window_counts_its_finalizations_by_type_and_cause_and_an_event_older_than_causes_by_its_reason(
    store, generation
):
    policy = deployment(store, generation)
    store.jobs.insert_many([dead_job(generation, f"user{n}/data", ago(400 + 30 * n / 50)) for n in range(50)])
    store.jobs.insert_many([dead_job(generation, f"lone{n}/data", ago(3_600 + 400 + 200 * n)) for n in (0, 1)])
    cleanup_at(store, policy, NOW)
    store.events.update_one({Event.CAUSE: Cause.CRASH}, {"$unset": {Event.CAUSE: ""}})  # recorded before causes

    assert causes_between(store, NOW - dt.timedelta(minutes=1), NOW + dt.timedelta(minutes=1)) == {
        "/first-rows": {Cause.DEPLOY: 50, Cause.CRASH: 2}
    }
    assert causes_between(store, NOW + dt.timedelta(minutes=1), NOW + dt.timedelta(hours=1)) == {}


def test_a_wave_split_across_two_runs_is_still_a_wave_for_the_second(store):
    policy = deployment(store, "2026-05")
    store.jobs.insert_many([dead_job("2026-05", f"early{n}/data", ago(400 + n)) for n in range(6)])
    cleanup_at(store, policy, NOW)
    store.jobs.insert_many([dead_job("2026-05", f"late{n}/data", ago(370 + n)) for n in range(6)])

    cleanup_at(store, policy, NOW + dt.timedelta(seconds=40), run_id="second")

    causes_by_dataset = {dataset: event[Event.CAUSE] for dataset, event in events_by_dataset(store).items()}
    assert {causes_by_dataset[f"late{n}/data"] for n in range(6)} == {Cause.DEPLOY}  # 12 within a minute
    assert {causes_by_dataset[f"early{n}/data"] for n in range(6)} == {Cause.CRASH}  # 6 alone; never rewritten


def test_a_dry_run_shows_each_candidates_cause(store):
    policy = deployment(store, "2026-05")
    store.jobs.insert_one(dead_job("2026-05", "a/a", ago(400), terminated_at=ago(390)))
    report = run_cleanup(store, policy, "dry", now=NOW, dry_run=True)
    assert [row["cause"] for row in report.candidate_rows()] == [Cause.DEPLOY]


# --- retries by cause ---------------------------------------------------------------------------------------------


def _with_previous_entry(store: Store, job: JobDocument, generation: str, failed_runs: int) -> None:
    """An earlier crash of the job's artifact at its revision, a day old, with ``failed_runs``."""
    cache = QUEUE_GENERATIONS[generation].cache_generation
    store.cache.insert_one(
        cache_document(
            job, NOW - dt.timedelta(days=1), 501, "JobManagerCrashedError", generation=cache, failed_runs=failed_runs
        )
    )


def _wave(store: Store, generation: str, size: int = 10, difficulty: int = 50) -> list[JobDocument]:
    jobs = [dead_job(generation, f"user{n}/data", ago(400 + n), difficulty=difficulty) for n in range(size)]
    store.jobs.insert_many(jobs)
    return jobs


@BOTH
def test_a_deploy_death_costs_no_failed_run_and_runs_again_at_once_at_the_same_difficulty(store, generation):
    policy = deployment(store, generation, retry_delay_seconds=600, crashed_retry_limit=0)
    jobs = _wave(store, generation, difficulty=60)
    _with_previous_entry(store, jobs[0], generation, failed_runs=2)

    cleanup_at(store, policy, NOW)

    event = events_by_dataset(store)["user0/data"]
    assert (event[Event.CAUSE], event[Event.RETRY_OUTCOME], event[Event.FAILED_RUNS]) == (
        Cause.DEPLOY,
        RetryOutcome.ENQUEUED,  # at once despite the delay, beyond a crash limit of 0, where the backfill would wait
        2,
    )
    assert stored_failed_runs(entry_of(store, "user0/data")) == 2  # kept, not 3
    assert stored_failed_runs(entry_of(store, "user1/data")) == 0  # no earlier failure: none counted
    retries = {job[Job.DATASET]: job for job in waiting(store)}
    assert set(retries) == {job[Job.DATASET] for job in jobs}
    assert retries["user0/data"][ID] == event[Event.RETRY_JOB_ID]
    assert retries["user0/data"].get(Job.DIFFICULTY) == (
        60 if QUEUE_GENERATIONS[generation].declares(Job.DIFFICULTY) else None
    )
    off = counters_off(store, QUEUE_GENERATIONS[generation])
    assert not any(count for name, count in off.items() if name != CACHE_METRICS_COLLECTION)  # the inserts counted


@BOTH
def test_with_deploy_costs_failed_run_a_deploy_death_is_counted_as_the_deployment_counts_it(store, generation):
    policy = deployment(store, generation, deploy_costs_failed_run=True)
    jobs = _wave(store, generation)
    _with_previous_entry(store, jobs[0], generation, failed_runs=1)

    cleanup_at(store, policy, NOW)

    event = events_by_dataset(store)["user0/data"]
    assert event[Event.CAUSE] == Cause.DEPLOY and stored_failed_runs(entry_of(store, "user0/data")) == 2
    kept = QUEUE_GENERATIONS[generation].keeps_finished_jobs
    # retried as a crash: by the cleanup where jobs are kept, else left to the deployment's backfill
    assert event[Event.RETRY_OUTCOME] == (RetryOutcome.ENQUEUED if kept else RetryOutcome.NOT_RETRIED)


def _overrun(store: Store, generation: str, at: dt.datetime, difficulty: int = 50, minutes: float = 45) -> JobDocument:
    """A job of user/slow that still beats but started ``minutes`` before ``at``: past the default T2 (20 min), and by
    default past the deployment's own (40 min, + 90 s for its check): its executor did not stop it. The waiting retry
    of an earlier overrun is the one that starts, if there is one."""
    retry = store.jobs.find_one({Job.DATASET: "user/slow", Job.STATUS: Status.WAITING})
    started_at, last_heartbeat = at - dt.timedelta(minutes=minutes), at - dt.timedelta(seconds=30)
    if retry is not None:
        started = {Job.STATUS: Status.STARTED, Job.STARTED_AT: started_at, Job.LAST_HEARTBEAT: last_heartbeat}
        store.jobs.update_one({ID: retry[ID]}, {"$set": started})
        return found(store.jobs.find_one({ID: retry[ID]}))
    job = job_document(
        "/parquet",
        "user/slow",
        generation=generation,
        difficulty=difficulty,
        started_at=started_at,
        last_heartbeat=last_heartbeat,
    )
    store.jobs.insert_one(job)
    return job


@WITH_DIFFICULTY
def test_a_timeout_runs_once_more_at_twenty_more_difficulty_then_its_error_stays(store, generation):
    policy = deployment(store, generation)
    first = _overrun(store, generation, NOW, difficulty=50)
    cleanup_at(store, policy, NOW)

    event = found(store.events.find_one({ID: first[ID]}))
    assert (event[Event.CAUSE], event[Event.RETRY_OUTCOME]) == (Cause.TIMEOUT, RetryOutcome.ENQUEUED)
    (rerun,) = waiting(store)
    assert rerun[Job.DIFFICULTY] == 70 and rerun[ID] == event[Event.RETRY_JOB_ID]

    later = NOW + dt.timedelta(hours=1)
    second = _overrun(store, generation, later)
    cleanup_at(store, policy, later, run_id="later")

    again = found(store.events.find_one({ID: second[ID]}))
    assert (again[Event.CAUSE], again[Event.RETRY_OUTCOME], again[Event.FAILED_RUNS]) == (
        Cause.TIMEOUT,
        RetryOutcome.LIMIT_REACHED,
        2,
    )
    assert waiting(store) == []
    assert entry_of(store, "user/slow")[Cache.ERROR_CODE] == "JobManagerExceededMaximumDurationError"


@WITH_DIFFICULTY
def test_a_timeout_whose_own_executor_still_runs_it_is_re_run_only_once_the_executor_has_stopped_it(store, generation):
    """Our T2 (20 min) below the deployment's (40 min): the process runs on until its executor's check past 40 min,
    so its re-run waits until then (+ 90 s) in our retries, and the first cleanup after that enqueues it."""
    policy = deployment(store, generation)
    job = _overrun(store, generation, NOW, minutes=30)
    cleanup_at(store, policy, NOW)

    event = found(store.events.find_one({ID: job[ID]}))
    due_at = job[Job.STARTED_AT] + dt.timedelta(seconds=2_400 + 90)
    assert (event[Event.CAUSE], event[Event.RETRY_OUTCOME]) == (Cause.TIMEOUT, RetryOutcome.SCHEDULED)
    assert found(store.retries.find_one({ID: event[Event.RETRY_JOB_ID]}))[ScheduledRetry.DUE_AT] == due_at
    assert waiting(store) == []

    cleanup_at(store, policy, due_at - dt.timedelta(seconds=1), run_id="before")
    assert waiting(store) == []
    cleanup_at(store, policy, due_at, run_id="after")
    (rerun,) = waiting(store)
    assert rerun[ID] == event[Event.RETRY_JOB_ID] and rerun[Job.DIFFICULTY] == 70


@WITH_DIFFICULTY
def test_a_timeout_with_exceeded_retry_limit_zero_stays_an_error_as_the_deployment_leaves_it(store, generation):
    policy = deployment(store, generation, exceeded_retry_limit=0)
    job = _overrun(store, generation, NOW)
    cleanup_at(store, policy, NOW)
    assert found(store.events.find_one({ID: job[ID]}))[Event.RETRY_OUTCOME] == RetryOutcome.LIMIT_REACHED
    assert waiting(store) == []


def test_a_rerun_never_lowers_a_difficulty_above_the_deployments_maximum(store):
    policy = deployment(store, "2026-05")
    _overrun(store, "2026-05", NOW, difficulty=95)
    cleanup_at(store, policy, NOW)
    assert [job[Job.DIFFICULTY] for job in waiting(store)] == [100]


@BOTH
def test_a_crash_costs_a_failed_run_and_is_retried_as_before(store, generation):
    policy = deployment(store, generation)
    job = dead_job(generation, "lone/data", ago(400))
    store.jobs.insert_one(job)
    _with_previous_entry(store, job, generation, failed_runs=1)

    cleanup_at(store, policy, NOW)

    event = found(store.events.find_one({ID: job[ID]}))
    assert (event[Event.CAUSE], event[Event.FAILED_RUNS]) == (Cause.CRASH, 2)
    assert stored_failed_runs(entry_of(store, "lone/data")) == 2
    kept = QUEUE_GENERATIONS[generation].keeps_finished_jobs
    assert event[Event.RETRY_OUTCOME] == (RetryOutcome.ENQUEUED if kept else RetryOutcome.NOT_RETRIED)
    assert len(waiting(store)) == (1 if kept else 0)
