"""The workload simulator produces what it promises, in few round trips, in the deployment's shapes."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict
from typing import Any

import pytest
from pymongo import MongoClient

from tests.helpers import CommandLog, workload
from tests.servers import fresh_databases, on_real_mongodb
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.detection import detect
from zombie_pipeline.observability.monitoring import audit_cache_errors
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState
from zombie_pipeline.queue.cache import Cache
from zombie_pipeline.queue.generations import (
    CACHE_GENERATIONS,
    NEWEST_QUEUE_GENERATION,
    QUEUE_GENERATIONS,
    cache_generation_of,
)
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.past_jobs import PastJob
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.history import OFFENDER
from zombie_pipeline.simulation.simulator import HEARTBEAT_INTERVAL_SECONDS, simulate
from zombie_pipeline.simulation.workload import JOB_TYPES, Workload, healthy_beside
from zombie_pipeline.statistics.offenders import find_offenders

NOW = dt.datetime(2024, 7, 1, 12, 0, 0, tzinfo=dt.UTC)


# --- one realistic queue of 12k jobs, written once for the module ----------------------

BIG = workload(finished=11_800, crashed=60, never_heartbeated=20, overdue=20, running=60, waiting=40, seed=7)
JOB_FIELDS = QUEUE_GENERATIONS[BIG.generation].job_fields


@pytest.fixture(scope="module")
def big(mongo_url):
    """The 12k-job workload written once for the module, through a client that logs its commands."""
    log = CommandLog()
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_url, tz_aware=True, tzinfo=dt.UTC, event_listeners=[log])
    try:
        with fresh_databases(client, drop=on_real_mongodb()) as make:
            store = Store.of(make("big_queue"), make("big_cache"))
            result = simulate(store, BIG, now=NOW)
            commands = Counter(log.names)
            jobs = list(store.jobs.find())
            entries = list(store.cache.find())
            yield {"result": result, "commands": commands, "jobs": jobs, "entries": entries, "store": store}
    finally:
        client.close()


def test_counts_per_status_match_the_workload(big):
    result, jobs = big["result"], big["jobs"]
    in_database = Counter(job[Job.STATUS] for job in jobs)

    assert len(jobs) == BIG.total == 12_000
    assert in_database == result.jobs_by_status
    assert in_database[Status.STARTED] == BIG.crashed + BIG.never_heartbeated + BIG.overdue + BIG.running
    assert in_database[Status.WAITING] == BIG.waiting
    assert in_database[Status.SUCCESS] + in_database[Status.ERROR] == BIG.finished
    assert in_database[Status.ERROR] > 0 and in_database[Status.SUCCESS] > in_database[Status.ERROR]
    assert set(in_database) == {Status.STARTED, Status.WAITING, Status.SUCCESS, Status.ERROR}


def test_counts_per_type_match_and_cover_at_least_eight_types(big):
    result, jobs = big["result"], big["jobs"]
    in_database = Counter(job[Job.TYPE] for job in jobs)

    assert in_database == result.jobs_by_type
    assert len(in_database) >= 8
    assert set(in_database) == {job_type.name for job_type in JOB_TYPES}
    assert min(in_database.values()) > BIG.total / len(JOB_TYPES) / 2  # no type starved


def test_the_started_jobs_of_each_kind_are_the_ones_announced(big):
    result, jobs = big["result"], big["jobs"]
    started_ids = {job[ID] for job in jobs if job[Job.STATUS] == Status.STARTED}

    kinds = {
        "crashed": (result.crashed_ids, BIG.crashed),
        "never_heartbeated": (result.never_heartbeated_ids, BIG.never_heartbeated),
        "overdue": (result.overdue_ids, BIG.overdue),
        "running": (result.running_ids, BIG.running),
    }
    for kind, (ids, expected) in kinds.items():
        assert len(set(ids)) == expected, kind
    assert set().union(*(set(ids) for ids, _ in kinds.values())) == started_ids


def test_default_detection_classifies_every_zombie_kind_and_spares_healthy_jobs(big):
    result = big["result"]

    detection = detect(big["store"].jobs, ZombiePolicy(), now=result.now)

    reasons = {candidate.id: candidate.reason for candidate in detection.candidates}
    assert detection.malformed == []
    assert {reasons[i] for i in result.crashed_ids} == {Reason.MISSING_HEARTBEAT}
    assert {reasons[i] for i in result.never_heartbeated_ids} == {Reason.NEVER_HEARTBEATED}
    assert {reasons[i] for i in result.overdue_ids} == {Reason.EXCEEDED_MAX_DURATION}
    assert not set(result.running_ids) & set(reasons)
    assert set(reasons) == set(result.zombie_ids)


def test_every_kind_of_started_job_looks_the_part(big):
    result, jobs = big["result"], {job[ID]: job for job in big["jobs"]}
    now, timeout, limit = result.now, BIG.policy.heartbeat_timeout_seconds, BIG.policy.max_duration_seconds

    def age(moment):
        return (now - moment).total_seconds()

    for i in result.running_ids:
        job = jobs[i]
        assert age(job[Job.STARTED_AT]) < limit
        if job.get(Job.LAST_HEARTBEAT) is not None:
            assert age(job[Job.LAST_HEARTBEAT]) <= HEARTBEAT_INTERVAL_SECONDS
    for i in result.crashed_ids:
        assert age(jobs[i][Job.LAST_HEARTBEAT]) > timeout
        assert age(jobs[i][Job.STARTED_AT]) < limit
    for i in result.never_heartbeated_ids:
        assert jobs[i].get(Job.LAST_HEARTBEAT) is None
    never = [jobs[i] for i in result.never_heartbeated_ids]
    assert all(Job.LAST_HEARTBEAT not in job for job in never)  # key missing, as mongoengine writes a new job
    for i in result.overdue_ids:
        assert age(jobs[i][Job.STARTED_AT]) > limit
        assert age(jobs[i][Job.LAST_HEARTBEAT]) <= HEARTBEAT_INTERVAL_SECONDS  # alive, just too long


def test_a_newer_queue_holds_never_heartbeated_jobs_with_the_key_missing_or_null(store):
    """From December 2023 a job's heartbeat may have been set to None by an update: an explicit null."""
    result = simulate(
        store, Workload(finished=0, crashed=0, never_heartbeated=20, overdue=0, running=0, waiting=0, seed=7), now=NOW
    )

    never = list(store.jobs.find({ID: {"$in": result.never_heartbeated_ids}}))
    assert len(never) == 20
    assert any(Job.LAST_HEARTBEAT not in job for job in never)
    assert any(Job.LAST_HEARTBEAT in job and job[Job.LAST_HEARTBEAT] is None for job in never)


def test_finished_history_is_spread_over_the_days_with_minute_heartbeats(big):
    finished = [job for job in big["jobs"] if job[Job.STATUS] in (Status.SUCCESS, Status.ERROR)]
    oldest = min(job[Job.STARTED_AT] for job in finished)
    newest = max(job[Job.FINISHED_AT] for job in finished)

    assert (newest - oldest) > dt.timedelta(days=BIG.days - 0.5)
    assert newest <= NOW
    beats = [job for job in finished if job.get(Job.LAST_HEARTBEAT) is not None]
    assert beats
    for job in beats:
        since_start = (job[Job.LAST_HEARTBEAT] - job[Job.STARTED_AT]).total_seconds()
        assert since_start > 0 and since_start % HEARTBEAT_INTERVAL_SECONDS == 0
        assert job[Job.LAST_HEARTBEAT] <= job[Job.FINISHED_AT]


def test_successful_durations_are_heavy_tailed_for_every_type(big):
    durations: dict[str, list[float]] = defaultdict(list)
    for job in big["jobs"]:
        if job[Job.STATUS] == Status.SUCCESS:
            durations[job[Job.TYPE]].append((job[Job.FINISHED_AT] - job[Job.STARTED_AT]).total_seconds())

    ratios = {}
    for job_type, values in durations.items():
        values.sort()
        p50 = values[len(values) // 2]
        p99 = values[math.ceil(0.99 * len(values)) - 1]
        ratios[job_type] = p99 / p50
    assert len(ratios) == len(JOB_TYPES)
    assert {job_type: ratio for job_type, ratio in ratios.items() if ratio <= 3} == {}
    medians = sorted(sorted(values)[len(values) // 2] for values in durations.values())
    assert medians[-1] > 20 * medians[0]  # type-specific: the slowest step is far slower than the fastest


def test_inserts_are_bulk_and_counted(big):
    result, commands = big["result"], big["commands"]

    assert commands["insert"] == result.insert_commands
    # 12k jobs and about as many cache entries, 5k documents per insert, and the simulation's own marker
    assert result.insert_commands <= 7
    # beside the inserts: whose the databases are (their collections, an earlier simulation's marker)
    assert sum(commands.values()) <= 14
    assert result.cache_entries == len(big["entries"])


def test_written_documents_carry_only_declared_fields_newest_generation(big):
    generation = CACHE_GENERATIONS["2024-07"]
    for job in big["jobs"]:
        assert set(job) - {ID} <= JOB_FIELDS, job
    seen: set[str] = set()
    for entry in big["entries"]:
        assert set(entry) - {ID} <= generation.fields, entry
        seen |= set(entry)
    assert cache_generation_of(seen) == generation


def test_one_cache_entry_per_key(big):
    keys = Counter(
        tuple(entry.get(name) for name in (Cache.KIND, Cache.DATASET, Cache.CONFIG, Cache.SPLIT))
        for entry in big["entries"]
    )
    assert keys and max(keys.values()) == 1


# --- small workloads ---------------------------------------------------------------------

SMALL = workload(finished=300, crashed=6, never_heartbeated=4, overdue=4, running=6, waiting=5, seed=3)


def written(fresh_database, workload: Workload):
    store = Store.of(fresh_database("sim_queue"), fresh_database("sim_cache"))
    result = simulate(store, workload, now=NOW)
    jobs = list(store.jobs.find().sort(ID, 1))
    entries = sorted(
        ({key: value for key, value in entry.items() if key != ID} for entry in store.cache.find()),
        key=lambda entry: tuple(
            str(entry.get(name)) for name in (Cache.KIND, Cache.DATASET, Cache.CONFIG, Cache.SPLIT)
        ),
    )
    return result, jobs, entries


def test_the_oldest_generation_writes_only_its_own_fields(fresh_database):
    _, jobs, entries = written(fresh_database, Workload(**{**SMALL.__dict__, "cache_generation": "2023-01"}))

    generation = CACHE_GENERATIONS["2023-01"]
    assert entries
    for entry in entries:
        assert set(entry) <= generation.fields, entry
        assert Cache.WORKER_VERSION in entry and Cache.JOB_RUNNER_VERSION not in entry
    assert cache_generation_of(set().union(*entries)) == generation
    for job in jobs:
        assert set(job) - {ID} <= JOB_FIELDS


def test_an_unknown_generation_is_refused(store):
    with pytest.raises(ValueError, match="cache_generation"):
        simulate(store, workload(finished=1, cache_generation="1999-12"), now=NOW)
    assert store.jobs.count_documents({}) == 0


def test_the_same_seed_writes_the_same_queue_and_cache(fresh_database):
    first = written(fresh_database, SMALL)
    second = written(fresh_database, SMALL)

    assert first[1] == second[1]  # job documents, _ids included
    assert first[2] == second[2]  # cache entries, all but their _ids
    assert first[0].crashed_ids == second[0].crashed_ids


def test_another_seed_writes_another_queue(fresh_database):
    _, jobs, entries = written(fresh_database, SMALL)
    _, other_jobs, other_entries = written(fresh_database, Workload(**{**SMALL.__dict__, "seed": 4}))

    assert len(jobs) == len(other_jobs)
    assert jobs != other_jobs
    assert {job[ID] for job in jobs}.isdisjoint({job[ID] for job in other_jobs})
    assert entries != other_entries


def test_per_type_maximum_durations_are_respected_by_the_simulator_and_detection(store):
    slow = "/parquet-and-dataset-info"
    policy = ZombiePolicy(max_duration_seconds_by_type={slow: 3_600})
    slow_types = Workload(**{**SMALL.__dict__, "policy": policy, "overdue": 12, "crashed": 12, "seed": 11})
    result = simulate(store, slow_types, now=NOW)

    detection = detect(store.jobs, policy, now=NOW)

    reasons = {candidate.id: candidate.reason for candidate in detection.candidates}
    assert set(reasons) == set(result.zombie_ids)
    assert {reasons[i] for i in result.overdue_ids} == {Reason.EXCEEDED_MAX_DURATION}
    assert {reasons[i] for i in result.crashed_ids} == {Reason.MISSING_HEARTBEAT}
    for candidate in detection.candidates:
        if candidate.reason == Reason.EXCEEDED_MAX_DURATION:
            assert candidate.threshold_seconds == policy.max_duration_of(candidate.job_type)
            assert candidate.age_seconds > candidate.threshold_seconds


def test_fractions_make_a_workload_of_the_requested_size():
    workload = Workload.from_fractions(100_000, crashed_fraction=0.01, seed=5, generation=BIG.generation)
    assert workload.total == 100_000
    assert workload.crashed == 1_000
    assert workload.never_heartbeated > 0 and workload.overdue > 0 and workload.running > 0
    with pytest.raises(ValueError):
        Workload.from_fractions(10, crashed_fraction=0.9, running_fraction=0.5, generation=BIG.generation)


# --- the days before today, cleaned daily -------------------------------------------------------------------------


@pytest.mark.parametrize("generation", ["2023-01", "2024-06", NEWEST_QUEUE_GENERATION])
def test_the_past_days_are_left_as_their_daily_cleanups_left_them_with_a_repeat_offender(store, generation):
    now = utc_now()
    result = simulate(
        store,
        Workload(finished=200, running=30, past_cleanups=7, generation=generation, cache_generation=None, seed=3),
        now=now,
    )
    queue_generation = QUEUE_GENERATIONS[generation]
    events = list(store.events.find())
    midnight = dt.datetime.combine(now.date(), dt.time(), tzinfo=dt.UTC)

    assert result.past is not None and result.past.finalized == len(events) >= 7 * 3
    assert {event[Event.STATE] for event in events} == {EventState.DONE}
    days = sorted({event[Event.FINALIZED_AT].date() for event in events})
    assert days == [(midnight - dt.timedelta(days=n)).date() for n in range(7, 0, -1)]  # one cleanup a day, none today
    for event in events:  # stamped at that day's moment, as its cleanup would have been
        assert event[Event.COMPLETED_AT] == event[Event.FINALIZED_AT] < midnight
        assert event[Event.DETECTED_AT] <= event[Event.FINALIZED_AT]
    assert {event[Event.REASON] for event in events} >= {Reason.MISSING_HEARTBEAT, Reason.EXCEEDED_MAX_DURATION}
    # every finalized job finished as its generation finishes one; today's queue holds none of them as started
    assert store.jobs.count_documents({ID: {"$in": [event[ID] for event in events]}, Job.STATUS: Status.STARTED}) == 0
    # the error users read is there, at the finalization's time, for the last finalization of each artifact
    audit = audit_cache_errors(store, midnight - dt.timedelta(days=8))
    assert audit.passed, audit
    # one dataset crashed its worker every day: a repeat offender of the week
    found = find_offenders(store, midnight - dt.timedelta(days=7), midnight, threshold=3)
    assert [(offender.dataset, offender.finalizations) for offender in found.offenders] == [(OFFENDER[1], 7)]
    assert result.past.offender_finalized == 7
    # the deployment's counters in step; nothing of the past left in its rate limiter
    assert counters.stored(store, queue_generation) == counters.recount(store, queue_generation)
    if queue_generation.keeps(store.past_jobs.name):
        assert store.past_jobs.count_documents({PastJob.FINISHED_AT: {"$lt": now - dt.timedelta(hours=1)}}) == 0
    if queue_generation.keeps(store.blockages.name):
        assert store.blockages.count_documents({}) == 0


def test_the_healthy_jobs_beside_the_zombies_keep_them_at_half_the_brakes_threshold():
    policy = ZombiePolicy()
    for dead in (0, 1, 6, 33, 500):
        healthy = healthy_beside(dead, policy)
        assert healthy >= policy.min_started_for_brake
        assert dead <= 0.5 * policy.max_stale_fraction * (dead + healthy)  # a quarter of the started jobs at most
        fewer = healthy - 1  # and no more than that needs, above the brake's minimum
        assert healthy == policy.min_started_for_brake or dead > 0.5 * policy.max_stale_fraction * (dead + fewer)
    assert healthy_beside(33, policy) == 99
    assert healthy_beside(33, ZombiePolicy(max_stale_fraction=0.2)) == 297
