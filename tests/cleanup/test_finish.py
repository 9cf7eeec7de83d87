"""Finishing zombies as each generation of the queue finishes a job (``cleanup/strategies.py``, ``cleanup/effects.py``).

Every test runs on a queue simulated exactly as that generation's deployment
stores it (``simulate``), with and without transactions: a finished zombie is
kept with status ``error`` before 2023-12 and deleted after, nothing the
generation does not declare is ever written, the deployment's counters equal a
recount of the documents, locks are free, the re-run can start, a worker that
moves meanwhile always wins, a second cleanup changes nothing, and a cleanup
killed between any two writes is completed by the next one.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from tests.helpers import Crash, crashing, found, raw
from zombie_pipeline.cleanup import counters, run
from zombie_pipeline.cleanup.plan import CleanupPlan
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.cleanup.strategies import STRATEGIES
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Effect, Event, RetryOutcome
from zombie_pipeline.queue.blockages import Blockage
from zombie_pipeline.queue.cache import Cache, CacheMetric, ErrorCode
from zombie_pipeline.queue.cache_entries import stored_failed_runs
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, QUEUE_GENERATIONS, FinishStyle
from zombie_pipeline.queue.job_metrics import JobMetric
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.locks import Lock
from zombie_pipeline.queue.past_jobs import PAST_JOB_MIN_SECONDS, PAST_JOBS_COLLECTION, PastJob
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.queue.worker_type_counts import WorkerSizeMetric
from zombie_pipeline.simulation.marks import SIMULATIONS_COLLECTION
from zombie_pipeline.simulation.shapes import cache_document, job_document
from zombie_pipeline.simulation.simulator import Simulation, simulate
from zombie_pipeline.simulation.workload import Workload

GENERATIONS = list(QUEUE_GENERATIONS)
MODES = [pytest.param(True, id="transactions"), pytest.param(False, id="one-write-after-another")]
#: Every generation with transactions; without, one that keeps finished jobs and one that deletes them.
EVERY_GENERATION_BOTH_WAYS = pytest.mark.parametrize(
    "generation, transactions",
    [pytest.param(name, True, id=f"{name}-transactions") for name in GENERATIONS]
    + [pytest.param(name, False, id=f"{name}-one-write-after-another") for name in ("2023-07", "2026-05")],
)
#: The fields of the deployment's collections beside the queue, as its models declare them.
SIDE_FIELDS = {
    "job_metrics": {
        ID,
        JobMetric.JOB_TYPE,
        JobMetric.STATUS,
        JobMetric.DATASET_STATUS,
        JobMetric.TOTAL,
        JobMetric.CREATED_AT,
    },
    "worker_size_metrics": {ID, WorkerSizeMetric.WORKER_SIZE, WorkerSizeMetric.JOBS_COUNT, WorkerSizeMetric.CREATED_AT},
    "past_jobs": {ID, PastJob.DATASET, PastJob.DURATION, PastJob.FINISHED_AT},
    "blockages": {ID, Blockage.DATASET, Blockage.BLOCKED_AT},
    "cache_metrics": {
        ID,
        CacheMetric.KIND,
        CacheMetric.HTTP_STATUS,
        CacheMetric.ERROR_CODE,
        CacheMetric.TOTAL,
        CacheMetric.CREATED_AT,
    },
}


def small_queue(store: Store, generation: str, **counts: Any) -> Simulation:
    fields = {
        "finished": 20,
        "crashed": 4,
        "never_heartbeated": 2,
        "terminated": 2,
        "overdue": 2,
        "running": 8,
        "waiting": 6,
    }
    return simulate(store, Workload(**{**fields, **counts}, generation=generation, seed=7))


def policy_for(generation: str, transactions: bool, **fields: Any) -> ZombiePolicy:
    return ZombiePolicy(queue_generation=generation, transactions=transactions, min_started_for_brake=1_000, **fields)


def state(store: Store) -> dict[str, Any]:
    """Everything a cleanup may change, without the stamps that differ from run to run."""
    return {
        "jobs": sorted((str(job[ID]), job[Job.STATUS], Job.FINISHED_AT in job) for job in store.jobs.find()),
        "cache": sorted(
            (
                entry[Cache.KIND],
                entry[Cache.DATASET],
                entry.get(Cache.CONFIG),
                entry.get(Cache.SPLIT),
                entry[Cache.HTTP_STATUS],
                entry.get(Cache.ERROR_CODE),
                entry.get(Cache.FAILED_RUNS),
            )
            for entry in store.cache.find()
        ),
        "counters": {
            name: sorted(values.items(), key=str)
            for name, values in counters.stored(store, QUEUE_GENERATIONS[_generation(store)]).items()
        },
        "past_jobs": sorted((str(document[ID]), document[PastJob.DURATION]) for document in store.past_jobs.find()),
        "blockages": sorted(document[Blockage.DATASET] for document in store.blockages.find()),
        "locks": sorted((str(lock[ID]), lock.get(Lock.OWNER), lock.get(Lock.JOB_ID)) for lock in store.locks.find()),
        "events": sorted(
            (
                str(event[ID]),
                event[Event.STATE],
                event.get(Event.CACHE_OUTCOME),
                event.get(Event.FAILED_RUNS),
                event.get(Event.RETRY_OUTCOME),
            )
            for event in store.events.find()
        ),
    }


def _generation(store: Store) -> str:
    return found(raw(store.jobs).database[SIMULATIONS_COLLECTION].find_one())["generation"]


# --- finished as the generation finishes a job ----------------------------------------------------------------


@EVERY_GENERATION_BOTH_WAYS
def test_every_zombie_is_finished_as_its_generation_finishes_a_job_and_nothing_else(
    store: Store, generation: str, transactions: bool
):
    simulation = small_queue(store, generation)
    kept = QUEUE_GENERATIONS[generation].finish is FinishStyle.KEPT_AS_ERROR

    report = run_cleanup(store, policy_for(generation, transactions), run_id="run")

    assert found(report.generations.queue).name == generation
    assert report.counts["finalized"] == len(simulation.zombie_ids)
    for job_id in simulation.zombie_ids:
        job = store.jobs.find_one({ID: job_id})
        if kept:
            assert found(job)[Job.STATUS] == Status.ERROR and found(job)[Job.FINISHED_AT] is not None
        else:
            assert job is None
    assert store.jobs.count_documents({ID: {"$in": simulation.running_ids}, Job.STATUS: Status.STARTED}) == len(
        simulation.running_ids
    )
    if QUEUE_GENERATIONS[generation].declares(Job.TERMINATED_AT):
        assert report.counts[f"reason:{Reason.TERMINATED}"] == len(simulation.terminated_ids) > 0


@pytest.mark.parametrize("generation", GENERATIONS)
def test_no_field_or_status_the_generation_does_not_declare_is_ever_written(store: Store, generation: str):
    small_queue(store, generation)
    queue = QUEUE_GENERATIONS[generation]
    policy = policy_for(generation, True, enqueue_retries=True)  # the retries too, in every generation

    report = run_cleanup(store, policy, run_id="run")

    assert report.counts["retry_enqueued"] > 0
    for job in store.jobs.find():
        assert set(job) - {ID} <= queue.job_fields, job
        assert job[Job.STATUS] in queue.statuses
    cache = CACHE_GENERATIONS[queue.cache_generation]
    for entry in store.cache.find():
        assert set(entry) - {ID} <= cache.fields, entry
    for lock in store.locks.find():
        assert set(lock) - {ID} <= queue.lock_fields, lock
    for name, fields in SIDE_FIELDS.items():
        for document in getattr(store, name).find():
            assert set(document) <= fields, (name, document)
    present = (
        set(store.jobs.database.list_collection_names())
        - {collection.name for collection in store.ours}
        - {SIMULATIONS_COLLECTION}
    )
    assert present <= {store.jobs.name} | queue.side_collections


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_dead_job_past_its_maximum_duration_is_finalized_as_a_crash_counted_and_retried_as_one(
    store: Store, generation: str
):
    """The deployment's precedence: a worker that died is a crash whatever the job's age (never an 'exceeded', never retried)."""
    simulation = small_queue(store, generation, crashed=0, never_heartbeated=0, terminated=0, overdue=1)
    queue = QUEUE_GENERATIONS[generation]
    policy = policy_for(generation, True)
    now = utc_now()
    t2 = policy.max_duration_seconds
    dead = job_document(
        "/splits",
        "user/dead-for-long",
        generation=queue,
        started_at=now - dt.timedelta(seconds=3 * t2),
        last_heartbeat=now - dt.timedelta(seconds=2 * t2),
    )
    store.jobs.insert_one(dead)
    earlier = cache_document(
        dead,
        now - dt.timedelta(days=1),
        http_status=500,
        error_code="UnexpectedError",
        generation=queue.cache_generation,
        failed_runs=1,
    )
    store.cache.insert_one(earlier)

    report = run_cleanup(store, policy, run_id="run")

    event = found(store.events.find_one({ID: dead[ID]}))
    assert (event[Event.REASON], event[Event.ERROR_CODE], event[Event.PAST_MAX_DURATION]) == (
        Reason.MISSING_HEARTBEAT,
        ErrorCode.CRASHED,
        True,
    )
    assert event[Event.FAILED_RUNS] == 2  # the crash counts, as the deployment counts it
    entry = found(store.cache.find_one(_key_of(dead)))
    assert entry[Cache.ERROR_CODE] == ErrorCode.CRASHED and stored_failed_runs(entry) == 2
    # a crash is retried below its limit where the generation re-enqueues (before 2023-12); after, the backfill does
    expected_retry = RetryOutcome.ENQUEUED if STRATEGIES[queue.finish].retries_by_default else RetryOutcome.NOT_RETRIED
    assert event[Event.RETRY_OUTCOME] == expected_retry
    overdue = found(store.events.find_one({ID: simulation.overdue_ids[0]}))  # the live one past T2 stays a timeout
    assert (overdue[Event.REASON], overdue[Event.ERROR_CODE]) == (
        Reason.EXCEEDED_MAX_DURATION,
        ErrorCode.EXCEEDED_MAX_DURATION,
    )
    assert report.counts[f"reason:{Reason.EXCEEDED_MAX_DURATION}"] == 1


@EVERY_GENERATION_BOTH_WAYS
def test_after_a_cleanup_every_counter_equals_a_recount_of_the_documents(
    store: Store, generation: str, transactions: bool
):
    small_queue(store, generation)
    queue = QUEUE_GENERATIONS[generation]
    assert counters.stored(store, queue) == counters.recount(store, queue)  # the simulator writes them in step

    run_cleanup(store, policy_for(generation, transactions, enqueue_retries=True), run_id="run")

    assert counters.stored(store, queue) == counters.recount(store, queue)


@pytest.mark.parametrize("generation", [name for name, queue in QUEUE_GENERATIONS.items() if queue.lock_fields])
def test_the_lock_of_each_zombie_is_free_and_its_re_run_can_take_it(store: Store, generation: str):
    simulation = small_queue(store, generation)
    zombies = list(store.jobs.find({ID: {"$in": simulation.zombie_ids}}))
    held = [job[Job.UNICITY_ID] for job in zombies]
    owner = Lock.OWNER if Lock.OWNER in QUEUE_GENERATIONS[generation].lock_fields else Lock.JOB_ID
    for key in held:  # each start lock left taken: a worker died while starting the job
        store.locks.update_one(
            {ID: key}, {"$set": {owner: "a-dead-starter"}, "$setOnInsert": {Lock.UPDATED_AT: utc_now()}}, upsert=True
        )

    run_cleanup(store, policy_for(generation, True), run_id="run")

    assert store.locks.count_documents({ID: {"$in": held}, owner: {"$ne": None}}) == 0
    # a re-run takes the start lock as the deployment does: only a free lock can be taken
    taken = store.locks.update_many({ID: {"$in": held}, owner: None}, {"$set": {owner: "the-re-run"}})
    assert taken.matched_count == store.locks.count_documents({ID: {"$in": held}})


@pytest.mark.parametrize(
    "generation", [name for name, queue in QUEUE_GENERATIONS.items() if queue.keeps(PAST_JOBS_COLLECTION)]
)
def test_runs_of_30_seconds_or_more_leave_a_past_job_and_a_dataset_over_its_hourly_limit_is_blocked(
    store: Store, generation: str
):
    simulation = small_queue(store, generation)
    crashed = found(store.jobs.find_one({ID: simulation.crashed_ids[0]}))
    store.past_jobs.insert_one(
        {PastJob.DATASET: crashed[Job.DATASET], PastJob.DURATION: 7_100, PastJob.FINISHED_AT: utc_now()}
    )
    waiting = job_document("/sizes", crashed[Job.DATASET], status=Status.WAITING, generation=generation, difficulty=20)
    store.jobs.insert_one(waiting)

    run_cleanup(store, policy_for(generation, True), run_id="run")

    recorded = {document[ID]: document for document in store.past_jobs.find({ID: {"$in": simulation.zombie_ids}})}
    assert set(recorded) == set(simulation.zombie_ids)  # every zombie of the simulation ran for minutes
    assert all(document[PastJob.DURATION] >= PAST_JOB_MIN_SECONDS for document in recorded.values())
    assert store.blockages.distinct(Blockage.DATASET) == [crashed[Job.DATASET]]
    assert found(store.jobs.find_one({ID: waiting[ID]}))[Job.STATUS] == Status.WAITING


@EVERY_GENERATION_BOTH_WAYS
def test_a_second_cleanup_changes_nothing(store: Store, generation: str, transactions: bool):
    small_queue(store, generation)
    policy = policy_for(generation, transactions)
    run_cleanup(store, policy, run_id="first")
    before = state(store)

    report = run_cleanup(store, policy, run_id="second")

    assert report.detection.candidates == []
    assert state(store) == before


# --- a worker that moves meanwhile wins ----------------------------------------------------------------------


def detected(store: Store, policy: ZombiePolicy) -> tuple[CleanupPlan, list]:
    """A run's plan and the candidates its find step returns (the brake is not in the way: see ``policy_for``)."""
    plan = run.prepare(store, policy, "run").plan
    return plan, run.find(store, plan).candidates


@EVERY_GENERATION_BOTH_WAYS
def test_a_worker_that_heartbeats_after_detection_keeps_its_job_and_its_cache_entry(
    store: Store, generation: str, transactions: bool
):
    simulation = small_queue(store, generation, crashed=1, never_heartbeated=0, terminated=0, overdue=0)
    policy = policy_for(generation, transactions)
    plan, candidates = detected(store, policy)
    [zombie_id] = simulation.crashed_ids
    entry_before = store.cache.find_one(_key_of(found(store.jobs.find_one({ID: zombie_id}))))
    store.jobs.update_one({ID: zombie_id}, {"$set": {Job.LAST_HEARTBEAT: utc_now()}})  # alive after all

    result = run.claim_and_finalize(store, plan, candidates)

    assert result.counts["lost_to_live_worker"] == 1 and result.counts["finalized"] == 0
    assert found(store.jobs.find_one({ID: zombie_id}))[Job.STATUS] == Status.STARTED
    assert store.cache.find_one(_key_of(found(store.jobs.find_one({ID: zombie_id})))) == entry_before
    assert store.events.count_documents({}) == 0  # the claim is forgotten: the job may be judged again


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_worker_that_finishes_after_detection_keeps_its_result(store: Store, generation: str):
    simulation = small_queue(store, generation, crashed=1, never_heartbeated=0, terminated=0, overdue=0)
    policy = policy_for(generation, True)
    plan, candidates = detected(store, policy)
    [zombie_id] = simulation.crashed_ids
    job = found(store.jobs.find_one({ID: zombie_id}))
    result = {Cache.HTTP_STATUS: 200, Cache.ERROR_CODE: None, Cache.UPDATED_AT: utc_now()}
    store.cache.update_one(_key_of(job), {"$set": result}, upsert=True)  # the worker's result first, then its finish
    kept = plan.generations.required_queue().keeps_finished_jobs
    if kept:
        store.jobs.update_one({ID: zombie_id}, {"$set": {Job.STATUS: Status.SUCCESS, Job.FINISHED_AT: utc_now()}})
    else:
        store.jobs.delete_one({ID: zombie_id})

    outcome = run.claim_and_finalize(store, plan, candidates)

    assert outcome.counts["finalized"] == 0
    assert found(store.cache.find_one(_key_of(job)))[Cache.HTTP_STATUS] == 200
    if kept:
        assert found(store.jobs.find_one({ID: zombie_id}))[Job.STATUS] == Status.SUCCESS


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_result_a_worker_writes_after_detection_is_never_overwritten(store: Store, generation: str):
    simulation = small_queue(store, generation, crashed=1, never_heartbeated=0, terminated=0, overdue=0)
    policy = policy_for(generation, True)
    plan, candidates = detected(store, policy)
    job = found(store.jobs.find_one({ID: simulation.crashed_ids[0]}))
    store.cache.update_one(
        _key_of(job),
        {"$set": {Cache.HTTP_STATUS: 200, Cache.ERROR_CODE: None, Cache.UPDATED_AT: utc_now()}},
        upsert=True,
    )

    outcome = run.claim_and_finalize(store, plan, candidates)

    assert outcome.counts["cache_skipped_fresher"] == 1
    assert found(store.cache.find_one(_key_of(job)))[Cache.HTTP_STATUS] == 200


def _key_of(job: Mapping[str, Any]) -> dict[str, Any]:
    return {
        Cache.KIND: job[Job.TYPE],
        Cache.DATASET: job[Job.DATASET],
        Cache.CONFIG: job.get(Job.CONFIG),
        Cache.SPLIT: job.get(Job.SPLIT),
    }


# --- killed between any two writes -----------------------------------------------------------------------------


def outcome(store: Store) -> dict[str, Any]:
    """What a cleanup leaves, comparable between two databases simulated alike (retry ids and stamps differ).

    The events with what each records as done around its finish (``effects``).
    """
    snapshot = state(store)
    snapshot["jobs"] = sorted(
        Counter((job[Job.UNICITY_ID], job[Job.STATUS], Job.FINISHED_AT in job) for job in store.jobs.find()).items()
    )
    snapshot["past_jobs"] = sorted(str(document[ID]) for document in store.past_jobs.find())
    snapshot["effects"] = sorted((str(event[ID]), event.get(Event.EFFECTS)) for event in store.events.find())
    return snapshot


@pytest.mark.parametrize("transactions", MODES)
@pytest.mark.parametrize("generation", ["2023-07", "2026-05"])
def test_a_cleanup_killed_between_any_two_writes_is_completed_by_the_next_run_with_nothing_done_twice(
    fresh_database, generation: str, transactions: bool
):
    """The state after a crash and the next run equals an uninterrupted run's (every fifth write a crash point).

    Counters included, with or without transactions: without, the run that takes over sets the counters the
    dead pass may or may not have moved from a recount of their keys; and the events record what was done
    around each finish, also where the pass that died did it.
    """
    workload = Workload(
        finished=10,
        crashed=3,
        never_heartbeated=1,
        terminated=1,
        overdue=1,
        running=3,
        waiting=2,
        generation=generation,
        seed=3,
    )
    now = utc_now()
    policy = policy_for(generation, transactions, enqueue_retries=True, claim_lease_seconds=0, batch_size=2)

    def queue() -> Store:
        fresh = Store.of(fresh_database("queue"), fresh_database("cache"))
        simulate(fresh, workload, now=now)
        return fresh

    reference = queue()
    run_cleanup(reference, policy, run_id="uninterrupted")
    expected = outcome(reference)
    crashes = 0
    for writes in range(0, 1_000, 5):
        attempt = queue()
        try:
            run_cleanup(crashing(attempt, writes), policy, run_id="killed")
        except Crash:
            crashes += 1
            run_cleanup(attempt, policy, run_id="next")
            after = outcome(attempt)
            assert after == expected, f"killed after {writes} writes"
            generation_of = QUEUE_GENERATIONS[generation]
            assert counters.stored(attempt, generation_of) == counters.recount(attempt, generation_of)
        else:
            break  # enough writes for the whole run: no crash point left
    assert crashes >= 5


def test_a_cleanup_killed_around_a_blockage_is_completed_with_its_worker_size_counters_and_its_event_exact(
    fresh_database,
):
    """A zombie's run tips its dataset over the hourly limit: the blockage, the worker sizes its pending jobs leave,
    and the event that records ``blocked_dataset`` end as an uninterrupted run's, wherever the first run died."""
    generation = "2026-05"
    now = utc_now()
    policy = policy_for(generation, False, claim_lease_seconds=0, batch_size=2)

    def queue() -> Store:
        fresh = Store.of(fresh_database("queue"), fresh_database("cache"))
        workload = Workload(
            finished=0,
            crashed=3,
            never_heartbeated=0,
            terminated=0,
            overdue=0,
            running=1,
            waiting=1,
            generation=generation,
        )
        simulation = simulate(fresh, workload, now=now)
        crashed = found(fresh.jobs.find_one({ID: simulation.crashed_ids[0]}))
        fresh.past_jobs.insert_one(
            {
                ID: "earlier-run",
                PastJob.DATASET: crashed[Job.DATASET],
                PastJob.DURATION: 7_100,
                PastJob.FINISHED_AT: now,
            }
        )
        pending = job_document("/sizes", crashed[Job.DATASET], status=Status.WAITING, generation=generation)
        raw(fresh.jobs).insert_one({**pending, ID: "pending-job"})
        counters.write_recount(fresh, QUEUE_GENERATIONS[generation])
        return fresh

    reference = queue()
    run_cleanup(reference, policy, run_id="uninterrupted")
    expected = outcome(reference)
    assert expected["blockages"] and any(Effect.BLOCKED_DATASET in effects for _, effects in expected["effects"])
    crashes = 0
    for writes in range(0, 1_000):
        attempt = queue()
        try:
            run_cleanup(crashing(attempt, writes), policy, run_id="killed")
        except Crash:
            crashes += 1
            run_cleanup(attempt, policy, run_id="next")
            assert outcome(attempt) == expected, f"killed after {writes} writes"
            assert counters.stored(attempt, QUEUE_GENERATIONS[generation]) == counters.recount(
                attempt, QUEUE_GENERATIONS[generation]
            ), f"killed after {writes} writes"
        else:
            break
    assert crashes >= 15
