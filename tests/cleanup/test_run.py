"""Cleanup: zombies finalized exactly once, never over a live worker, with the error users see."""

import datetime as dt
import math
import subprocess
import sys
import threading
import time
from typing import Final

import pytest
from pymongo.results import InsertOneResult

from tests.helpers import (
    Crash,
    ago,
    crashed_job,
    crashing,
    documents,
    finalizer_for,
    found,
    job_document,
    logged_store,
    plan_for,
    workload,
)
from zombie_pipeline.cleanup import cache_errors, run
from zombie_pipeline.cleanup.detection import detect
from zombie_pipeline.cleanup.events import EventLog
from zombie_pipeline.cleanup.run import BrakeEngaged, run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue import cache_entries
from zombie_pipeline.queue.audit_documents import CacheOutcome, Event, EventState, RetryOutcome
from zombie_pipeline.queue.cache import CACHE_KEY, Cache, ErrorCode
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms, utc_now
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.simulation.simulator import simulate

POLICY = ZombiePolicy(heartbeat_timeout_seconds=300, max_duration_seconds=1200, claim_lease_seconds=0)
SMALL = workload(finished=200, crashed=12, never_heartbeated=4, overdue=4, running=30, waiting=10, seed=7)
JOB_FIELDS = QUEUE_GENERATIONS[SMALL.generation].job_fields


# --- the whole cleanup ---------------------------------------------------------


def test_every_zombie_is_finalized_and_nothing_else(store):
    simulation = simulate(store, SMALL)
    before = {job[ID]: job for job in store.jobs.find()}
    report = run_cleanup(store, POLICY, "run-1")

    assert report.counts["finalized"] == len(simulation.zombie_ids) == 20
    for job in store.jobs.find({ID: {"$in": list(before)}}):
        old = before[job[ID]]
        if job[ID] in simulation.zombie_ids:
            assert job[Job.STATUS] == Status.ERROR
            # status and finished_at, nothing else
            assert {k for k in job if job.get(k) != old.get(k)} == {Job.STATUS, Job.FINISHED_AT}
        else:
            assert job == old
    assert store.events.count_documents({}) == 20
    assert store.events.count_documents({Event.STATE: EventState.DONE}) == 20


def test_a_finalize_step_given_a_moment_stamps_every_write_at_it(store):
    """As a replay drives the steps in virtual time: the events, the jobs and the cache errors say the same moment."""
    simulation = simulate(store, SMALL)
    at = truncate_ms(utc_now() + dt.timedelta(minutes=1))  # not the wall clock of any write
    plan = plan_for(store, POLICY, "run-at", override_brake=True)

    result = run.claim_and_finalize(store, plan, run.find(store, plan, at).candidates, at)

    events = list(store.events.find())
    assert len(events) == len(simulation.zombie_ids) and {e[Event.FINALIZED_AT] for e in events} == {at}
    assert {job[Job.FINISHED_AT] for job in store.jobs.find({ID: {"$in": simulation.zombie_ids}})} == {at}
    assert result.counts["cache_written"] > 0
    assert store.cache.count_documents({Cache.UPDATED_AT: at}) == result.counts["cache_written"]


def test_a_second_cleanup_finds_nothing_and_writes_nothing(store):
    simulate(store, SMALL)
    run_cleanup(store, POLICY, "run-1")
    before = documents(store)
    report = run_cleanup(store, POLICY, "run-2")
    assert report.counts["finalized"] == 0
    assert documents(store) == before


@pytest.mark.parametrize("generation", ["2023-01", "2023-04", "2024-07"])
def test_documents_keep_only_the_fields_their_generation_declares(store, generation):
    simulate(
        store,
        workload(
            finished=100,
            crashed=6,
            never_heartbeated=0,
            overdue=0,
            running=10,
            waiting=0,
            seed=2,
            cache_generation=generation,
        ),
    )
    report = run_cleanup(store, POLICY, "run-1")
    assert report.counts[f"cache_generation:{generation}"] == 1
    assert report.counts["cache_written"] == 6
    allowed = CACHE_GENERATIONS[generation].fields | {ID}
    for entry in store.cache.find():
        assert set(entry) <= allowed, set(entry) - allowed
    for job in store.jobs.find():
        assert set(job) <= JOB_FIELDS | {ID}


def test_an_early_2023_cache_keeps_failed_runs_and_duration_in_details(store):
    job = crashed_job()
    store.jobs.insert_one(job)
    store.cache.insert_one(cache_document(job, ago(86_400), generation="2023-01"))
    run_cleanup(store, POLICY, "run-1")
    entry = store.cache.find_one()
    assert Cache.FAILED_RUNS not in entry and Cache.DURATION not in entry
    assert entry[Cache.DETAILS][Cache.FAILED_RUNS] == 1
    assert entry[Cache.DETAILS][Cache.DURATION] == pytest.approx(900, abs=5)
    assert entry[Cache.WORKER_VERSION] == "2.0.0"  # the worker's, kept


def test_the_cache_error_tells_users_why_and_keeps_what_the_worker_knew(store):
    crashed = crashed_job("user/crashed")
    overdue = job_document(dataset="user/overdue", started_at=ago(5000), last_heartbeat=ago(10))
    store.jobs.insert_many([crashed, overdue])
    store.cache.insert_one(cache_document(crashed, ago(86_400), http_status=500, error_code="X", failed_runs=1))
    run_cleanup(store, ZombiePolicy(claim_lease_seconds=0, http_status=501), "run-9")

    entry = store.cache.find_one({Cache.DATASET: "user/crashed"})
    assert entry[Cache.HTTP_STATUS] == 501
    assert entry[Cache.ERROR_CODE] == ErrorCode.CRASHED
    assert entry[Cache.FAILED_RUNS] == 2
    assert entry[Cache.JOB_RUNNER_VERSION] == 2 and entry[Cache.DATASET_GIT_REVISION] == "abc123"
    assert entry[Cache.DETAILS]["reason"] == Reason.MISSING_HEARTBEAT
    assert entry[Cache.DETAILS]["run_id"] == "run-9"
    assert entry[Cache.DETAILS]["threshold_seconds"] == 300
    assert entry[Cache.DETAILS]["last_heartbeat"] is not None
    assert entry[Cache.CONTENT]["error"] == entry[Cache.DETAILS]["error"]
    assert entry[Cache.DURATION] == pytest.approx(900, abs=5)

    new_entry = store.cache.find_one({Cache.DATASET: "user/overdue"})
    assert new_entry[Cache.ERROR_CODE] == ErrorCode.EXCEEDED_MAX_DURATION
    assert Cache.JOB_RUNNER_VERSION not in new_entry  # no entry to take it from: never invented
    assert Cache.DATASET_GIT_REVISION not in new_entry
    assert new_entry[Cache.FAILED_RUNS] == 1


# --- races with live workers ------------------------------------------------------


def test_a_job_that_heartbeats_between_detection_and_finalization_is_not_finalized(store):
    job = crashed_job()
    store.jobs.insert_one(job)
    detection = detect(store.jobs, POLICY, utc_now())
    store.jobs.update_one({ID: job[ID]}, {"$set": {Job.LAST_HEARTBEAT: utc_now()}})  # the worker is alive

    finalizer = finalizer_for(store, POLICY, "run-1")
    claims = finalizer.claim(detection.candidates, utc_now())
    result = finalizer.finalize(fresh=claims.ids)

    assert result.counts["lost_to_live_worker"] == 1 and result.counts["finalized"] == 0
    assert store.jobs.find_one({ID: job[ID]})[Job.STATUS] == Status.STARTED
    assert store.events.count_documents({}) == 0  # the claim is released: judged afresh later
    assert store.cache.count_documents({}) == 0


def test_a_job_that_finishes_between_detection_and_finalization_keeps_its_result(store):
    job = crashed_job()
    store.jobs.insert_one(job)
    detection = detect(store.jobs, POLICY, utc_now())
    finished_at = utc_now()
    store.jobs.update_one({ID: job[ID]}, {"$set": {Job.STATUS: Status.SUCCESS, Job.FINISHED_AT: finished_at}})
    store.cache.insert_one(cache_document(job, finished_at))
    entry_before = store.cache.find_one()

    finalizer = finalizer_for(store, POLICY, "run-1")
    claims = finalizer.claim(detection.candidates, utc_now())
    finalizer.finalize(fresh=claims.ids)

    assert store.jobs.find_one({ID: job[ID]})[Job.STATUS] == Status.SUCCESS
    assert store.cache.find_one() == entry_before


def test_a_fresher_cache_entry_is_kept_and_counted(store):
    job = crashed_job()
    store.jobs.insert_one(job)
    store.cache.insert_one(cache_document(job, ago(60)))  # written by another job after the zombie started
    entry_before = store.cache.find_one()

    report = run_cleanup(store, POLICY, "run-1")

    assert report.counts["finalized"] == 1
    assert report.counts["cache_skipped_fresher"] == 1
    assert store.cache.find_one() == entry_before
    event = store.events.find_one()
    assert event[Event.CACHE_OUTCOME] == CacheOutcome.SKIPPED_FRESHER
    assert event[Event.RETRY_OUTCOME] == RetryOutcome.NOT_RETRIED  # a newer result exists


def test_two_cleanups_in_threads_finalize_each_zombie_once(store):
    simulation = simulate(store, SMALL)
    policy = ZombiePolicy(batch_size=3, claim_lease_seconds=300)
    reports = {}

    def run(run_id):
        reports[run_id] = run_cleanup(store, policy, run_id)

    threads = [threading.Thread(target=run, args=(f"run-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    zombies = len(simulation.zombie_ids)
    assert sum(report.counts["finalized"] for report in reports.values()) == zombies
    assert store.events.count_documents({}) == zombies
    assert store.events.count_documents({Event.STATE: EventState.DONE}) == zombies
    _assert_failed_runs_incremented_once(store, simulation.zombie_ids)


def test_two_cleanups_in_separate_processes_finalize_each_zombie_once(store, mongo_url):
    simulation = simulate(store, SMALL)
    script = (
        "import sys; from zombie_pipeline.queue.connections import client_for; from zombie_pipeline.queue.store import Store;"
        "from zombie_pipeline.policy import ZombiePolicy; from zombie_pipeline.cleanup.run import run_cleanup;"
        "c = client_for(sys.argv[1]); s = Store.of(c[sys.argv[2]], c[sys.argv[3]]);"
        "r = run_cleanup(s, ZombiePolicy(batch_size=4, claim_lease_seconds=300), sys.argv[4]);"
        "print(r.counts['finalized'])"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, mongo_url, store.jobs.database.name, store.cache.database.name, f"proc-{i}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    finalized = [int(process.communicate(timeout=120)[0].strip()) for process in processes]
    assert all(process.returncode == 0 for process in processes)
    assert sum(finalized) == len(simulation.zombie_ids)
    assert store.events.count_documents({Event.STATE: EventState.DONE}) == len(simulation.zombie_ids)
    _assert_failed_runs_incremented_once(store, simulation.zombie_ids)


def _assert_failed_runs_incremented_once(store: Store, zombie_ids) -> None:
    for job in store.jobs.find({ID: {"$in": zombie_ids}}):
        entry = found(
            store.cache.find_one({name: job.get(name if name != Cache.KIND else Job.TYPE) for name in CACHE_KEY})
        )
        assert entry[Cache.ERROR_CODE] in (ErrorCode.CRASHED, ErrorCode.EXCEEDED_MAX_DURATION)
        # the simulator's older entries were successes (0 failed runs), so one zombie = 1
        assert entry[Cache.FAILED_RUNS] == 1


# --- crashes -------------------------------------------------------------------------


def crash_after(store: Store, writes: int) -> None:
    """A cleanup that claims the zombies, then dies after ``writes`` writes of its pass (jobs, cache, retries, events)."""
    detection = detect(store.jobs, POLICY, utc_now())
    claims = finalizer_for(store, POLICY, "crashed-run").claim(detection.candidates, utc_now())
    with pytest.raises(Crash):
        finalizer_for(crashing(store, writes), POLICY, "crashed-run").finalize(fresh=claims.ids)
    assert store.events.count_documents({Event.STATE: EventState.CLAIMED}) == 20  # no event was completed


def test_a_crash_between_job_updates_and_cache_writes_is_completed_by_the_next_run(store):
    simulation = simulate(store, SMALL)
    crash_after(store, 1)
    assert store.jobs.count_documents({ID: {"$in": simulation.zombie_ids}, Job.STATUS: Status.ERROR}) == 20

    report = run_cleanup(store, POLICY, "next-run")

    assert report.reconciled.counts["taken_over"] == 20
    assert report.reconciled.counts["finalized"] == 20 and report.reconciled.counts["cache_written"] == 20
    assert report.counts["finalized"] == 0  # nothing new: the zombies were the crashed run's
    assert store.events.count_documents({Event.STATE: EventState.DONE}) == 20
    _assert_failed_runs_incremented_once(store, simulation.zombie_ids)


def test_a_crash_after_the_cache_writes_does_not_count_a_failed_run_twice(store):
    simulation = simulate(store, SMALL)
    crash_after(store, 2)

    report = run_cleanup(store, POLICY, "next-run")

    assert report.reconciled.counts["cache_written"] == 20  # recognized as ours, not written again
    _assert_failed_runs_incremented_once(store, simulation.zombie_ids)
    retries = store.jobs.count_documents({Job.STATUS: Status.WAITING, Job.UNICITY_ID: {"$regex": "live-"}})
    assert retries == report.reconciled.counts["retry_enqueued"]


def test_a_crash_after_the_retries_were_enqueued_enqueues_none_twice(store):
    simulate(store, SMALL)
    crash_after(store, 3)
    waiting_before = store.jobs.count_documents({Job.STATUS: Status.WAITING})

    report = run_cleanup(store, POLICY, "next-run")

    assert store.jobs.count_documents({Job.STATUS: Status.WAITING}) == waiting_before
    assert report.reconciled.counts["retry_enqueued"] > 0  # recognized, with the outcome they had


def test_a_running_cleanup_keeps_its_events_until_its_lease_expires(store):
    store.jobs.insert_one(crashed_job())
    detection = detect(store.jobs, POLICY, utc_now())
    leased = ZombiePolicy(claim_lease_seconds=600)
    finalizer_for(store, leased, "slow-run").claim(detection.candidates, utc_now())
    report = run_cleanup(store, leased, "other-run")
    assert report.reconciled.counts["taken_over"] == 0
    assert report.counts["claimed_by_another_cleanup"] == 1
    assert store.jobs.find_one()[Job.STATUS] == Status.STARTED  # still the slow run's to finish


# --- dry run and brake --------------------------------------------------------------------


def test_a_dry_run_lists_the_evidence_and_writes_nothing(store):
    simulate(store, SMALL)
    before = documents(store)
    report = run_cleanup(store, POLICY, "dry", dry_run=True)
    rows = report.candidate_rows()
    assert len(rows) == 20
    assert set(rows[0]) >= {
        "job_id",
        "type",
        "dataset",
        "config",
        "split",
        "reason",
        "age_seconds",
        "last_heartbeat",
        "threshold_seconds",
    }
    assert documents(store) == before


def test_the_brake_stops_a_mass_death_before_any_write_and_the_override_proceeds(store):
    store.jobs.insert_many(
        [crashed_job(f"user/dead-{i}") for i in range(15)]
        + [job_document(dataset=f"user/alive-{i}", started_at=ago(100), last_heartbeat=ago(10)) for i in range(10)]
    )
    before = documents(store)
    with pytest.raises(BrakeEngaged, match="15 of 25"):
        run_cleanup(store, POLICY, "braked")
    assert documents(store) == before

    report = run_cleanup(store, POLICY, "override", override_brake=True)
    assert report.counts["finalized"] == 15


# --- retries ------------------------------------------------------------------------------


def test_a_crashed_job_is_retried_until_its_limit(store):
    jobs = {previous: crashed_job(f"user/failed-{previous}-times") for previous in (0, 2, 3)}
    store.jobs.insert_many(list(jobs.values()))
    store.cache.insert_many(
        [
            cache_document(job, ago(86_400), http_status=500, error_code="X", failed_runs=n)
            for n, job in jobs.items()
            if n
        ]
    )
    run_cleanup(store, ZombiePolicy(crashed_retry_limit=3, claim_lease_seconds=0), "run-1")

    outcomes = {event[Event.JOB][Job.DATASET]: event[Event.RETRY_OUTCOME] for event in store.events.find()}
    assert outcomes == {
        "user/failed-0-times": RetryOutcome.ENQUEUED,
        "user/failed-2-times": RetryOutcome.ENQUEUED,  # third failure: within 3 retries
        "user/failed-3-times": RetryOutcome.LIMIT_REACHED,  # fourth failure: stop looping
    }


def test_a_job_past_its_maximum_duration_is_not_retried_with_the_deployments_limit_of_zero(store):
    store.jobs.insert_one(job_document(dataset="user/slow", started_at=ago(5000), last_heartbeat=ago(5)))
    run_cleanup(store, POLICY.model_copy(update={"exceeded_retry_limit": 0}), "run-1")
    assert store.events.find_one()[Event.RETRY_OUTCOME] == RetryOutcome.LIMIT_REACHED
    assert store.jobs.count_documents({Job.STATUS: Status.WAITING}) == 0


def test_a_retry_is_a_waiting_copy_with_exactly_the_jobs_own_fields(store):
    job = crashed_job(config="default", split="train", priority="low")
    store.jobs.insert_one(job)
    run_cleanup(store, POLICY, "run-1")
    retry = store.jobs.find_one({Job.STATUS: Status.WAITING})
    assert retry[ID] == store.events.find_one()[Event.RETRY_JOB_ID]
    same: Final = (Job.TYPE, Job.DATASET, Job.CONFIG, Job.SPLIT, Job.UNICITY_ID, Job.NAMESPACE, Job.PRIORITY, Job.FORCE)
    assert {name: retry[name] for name in same} == {name: job[name] for name in same}
    assert set(retry) == set(same) | {ID, Job.STATUS, Job.CREATED_AT}


def test_no_retry_when_the_same_unicity_id_is_already_waiting(store):
    job = crashed_job()
    store.jobs.insert_one(job)
    store.jobs.insert_one(job_document(dataset=job[Job.DATASET], status=Status.WAITING, created_at=ago(10)))
    run_cleanup(store, POLICY, "run-1")
    assert store.events.find_one()[Event.RETRY_OUTCOME] == RetryOutcome.ALREADY_QUEUED
    assert store.jobs.count_documents({Job.STATUS: Status.WAITING}) == 1


# --- cost -----------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [25, 120])
def test_database_commands_grow_with_zombies_over_batch_size(store, mongo_url, batch_size):
    """Bound: 20 fixed commands + 12 per batch of zombies, whatever their job types (32 for one batch, measured).

    Fixed: telling the queue's generation 5 (two samples of jobs, the statuses, the indexes, the
    collections) and the cache's 1, the indexes our queries need 6 (one listing per collection: the jobs, the cache,
    the events, the retries, the quarantine, the heartbeat gap log), the
    take-over 1, the delayed retries due 1, detection 4 or 5, the deaths finalized in the last hour (a wave's
    earlier part) 1, the last empty read 1, the compensations still to run 1, the late results' read of earlier
    runs' events 1 (none here), the client's goodbye. Per batch: the claim 1, then one pass: the batch's events 1,
    the jobs 2 (compare-and-set, read-back), the quarantines of its (dataset, job type) pairs 1 and, where it has
    crashes, their earlier crashes 1, the cache 3 (one read of the batch's entries, the writes, read-back), the
    retries 2, the events' completion 1. (These 120 workers stopped together: a deploy wave, re-enqueued.)
    """
    zombies = 120
    store.jobs.insert_many([crashed_job(f"user/z-{i}") for i in range(zombies)])
    with logged_store(mongo_url, store) as (counted, log):
        report = run_cleanup(
            counted, ZombiePolicy(batch_size=batch_size, claim_lease_seconds=0), "counted", override_brake=True
        )
    assert report.counts["finalized"] == zombies
    batches = math.ceil(zombies / batch_size)
    assert len(log.names) <= 20 + 12 * batches, " ".join(log.names)
    assert len(log.names) < zombies  # never one command per zombie


def test_a_zombie_costs_its_claim_its_job_its_cache_entry_one_completion_and_its_retry(store, mongo_url):
    simulate(store, SMALL)
    with logged_store(mongo_url, store) as (counted, log):
        report = run_cleanup(counted, POLICY, "counted")
    zombies, retries = report.counts["finalized"], report.counts["retry_enqueued"]

    assert zombies == 20 and retries > 0
    assert log.written == {
        store.events.name: 2 * zombies,  # the claim, then one completion with every outcome
        store.jobs.name: zombies + retries,  # each job finished once, each retry inserted once
        store.cache.name: zombies,
    }


def test_a_long_step_renews_its_leases_so_no_reconcile_takes_its_work_over(store):
    store.jobs.insert_many([crashed_job(f"user/z-{i}") for i in range(6)])
    policy = ZombiePolicy(batch_size=2, claim_lease_seconds=3)
    detection = detect(store.jobs, policy, utc_now())
    finalizer_for(store, policy, "slow-run").claim(detection.candidates, utc_now())
    before = {event[ID]: event[Event.LEASE_UNTIL] for event in store.events.find()}
    batches = EventLog(store.events, "slow-run", policy).drain({Event.STATE: EventState.CLAIMED})
    next(batches)
    time.sleep(1.2)  # a slow batch: more than a third of the 3 s lease
    next(batches)  # the leases are renewed before the next batch is read
    after = {event[ID]: event[Event.LEASE_UNTIL] for event in store.events.find()}
    assert all(after[event_id] > lease for event_id, lease in before.items())
    assert EventLog(store.events, "other-run", policy).take_over_expired(utc_now()) == 0


def test_an_entry_a_worker_writes_after_our_read_is_kept(store, monkeypatch):
    job = crashed_job()
    store.jobs.insert_one(job)
    read_entries = cache_entries.entries_of_jobs  # the function cache_errors imports, before it is patched there
    written: list[InsertOneResult] = []

    def a_worker_writes_right_after_the_read(*args, **kwargs):
        found = read_entries(*args, **kwargs)
        if not written:  # once: a transaction that meets the worker's entry reads again
            written.append(store.cache.insert_one(cache_document(job, ago(1))))
        return found

    monkeypatch.setattr(cache_errors, "entries_of_jobs", a_worker_writes_right_after_the_read)
    report = run_cleanup(store, POLICY, "run-1")

    assert report.counts["finalized"] == 1
    assert report.counts["cache_skipped_fresher"] == 1
    assert report.counts["cache_written"] == 0
    assert [entry[Cache.HTTP_STATUS] for entry in store.cache.find()] == [
        cache_document(job, ago(1))[Cache.HTTP_STATUS]
    ]
    assert store.events.find_one()[Event.RETRY_OUTCOME] == RetryOutcome.NOT_RETRIED
