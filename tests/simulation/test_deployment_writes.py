"""The simulated deployment's own bookkeeping (``simulation/deployment_writes.py``), checked twice: against a recount
of the documents after simulated workers moved a queue for a while, and against the cleanup's bookkeeping
(``cleanup/effects.py``) finishing the same jobs, written apart from it, so that a mistake in either shows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import ObjectId

from tests.helpers import workload
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.effects import DeploymentEffects, Finished
from zombie_pipeline.cleanup.side_collections import SideCollections
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.blockages import BLOCKAGES_COLLECTION
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.locks import LOCKS_COLLECTION, Lock
from zombie_pipeline.queue.past_jobs import PAST_JOBS_COLLECTION, PastJob
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms, utc_now
from zombie_pipeline.queue.worker_type_counts import WORKER_SIZE_METRICS_COLLECTION
from zombie_pipeline.simulation.deployment_writes import HOURLY_LIMIT_SECONDS, DeploymentWrites
from zombie_pipeline.simulation.shapes import job_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates

#: Jobs of tens of seconds to minutes (their type's duration times 0.2), a crash now and then: runs long enough to
#: leave ``pastJobs`` records, and dead jobs that stay started.
POLICY = ZombiePolicy(heartbeat_timeout_seconds=60, max_duration_seconds=600)
RATES = WorkerRates(workers=4, crashes_per_worker_hour=3, speed=0.2, heartbeat_seconds=10, waiting_target=10)
TICK_SECONDS = 5.0
TICKS = 720  # an hour of virtual time


class VirtualClock:
    def __init__(self) -> None:
        self.start, self.seconds = truncate_ms(utc_now()), 0.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> dt.datetime:
        return self.start + dt.timedelta(seconds=self.seconds)


@pytest.mark.slow  # 720 ticks of real writes: 35 s at 2023-01, 100-200 s at 2026-05 on 2 cores; .ci/run runs it apart
@pytest.mark.parametrize("generation", ["2023-01", "2026-05"])
def test_an_hour_of_simulated_workers_leaves_every_counter_equal_to_its_recount_and_every_start_lock_free(
    store: Store, generation: str
):
    clock = VirtualClock()
    simulate(
        store,
        workload(
            finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=4, waiting=10,
            generation=generation, cache_generation=None, policy=POLICY, seed=7,
        ),
        now=clock.now(),
    )  # fmt: skip
    queue = QUEUE_GENERATIONS[generation]
    pool = WorkerPool(store, queue, POLICY, RATES, seed=11, clock=clock.monotonic, now=clock.now)
    pool.adopt_running()
    for _ in range(TICKS):
        pool.tick()
        clock.seconds += TICK_SECONDS
    pool.stop()

    assert pool.counts["started"] > 50 and pool.counts["died"] > 0 and pool.counts["enqueued"] > 50
    assert counters.stored(store, queue) == counters.recount(store, queue)
    started = {job[ID] for job in store.jobs.find({Job.STATUS: Status.STARTED})}
    assert started == set(pool.died)  # the dead workers' jobs only: every other one was finished
    if queue.keeps_finished_jobs:
        finished = store.jobs.count_documents({Job.STATUS: {"$in": [Status.SUCCESS, Status.ERROR]}})
        assert finished == pool.counts["finished_success"] + pool.counts["finished_error"]
        assert store.locks.count_documents({}) == 0  # no locks before 2023-06
    else:
        assert store.jobs.count_documents({Job.STATUS: {"$nin": [Status.WAITING, Status.STARTED]}}) == 0
        locks = list(store.locks.find())
        assert locks and all(lock[Lock.OWNER] is None for lock in locks)  # each start's lock, freed
        runs = list(store.past_jobs.find())
        assert runs and all(run[PastJob.DURATION] >= 30 for run in runs)
        assert len(runs) <= pool.counts["finished_success"] + pool.counts["finished_error"]


# --- the same finish, booked by the model and by the cleanup's bookkeeping ------------------------------------------


def queue_with_a_dataset_at_its_limit(store: Store, generation: str, now: dt.datetime) -> list[JobDocument]:
    """A simulated queue (a crashed job holding a git branch lock among its started jobs); where runs are recorded,
    one started job's dataset an hour of runs away from its limit, with a waiting job of its own. Its started jobs."""
    simulate(
        store,
        workload(
            finished=0, crashed=1, never_heartbeated=0, terminated=0, overdue=0, running=6, waiting=6,
            generation=generation, cache_generation=None, seed=3,
        ),
        now=now,
    )  # fmt: skip
    started = list(store.jobs.find({Job.STATUS: Status.STARTED}).sort(ID, 1))
    queue = QUEUE_GENERATIONS[generation]
    if queue.keeps(PAST_JOBS_COLLECTION):
        dataset = started[0][Job.DATASET]
        store.past_jobs.insert_one(
            {PastJob.DATASET: dataset, PastJob.DURATION: HOURLY_LIMIT_SECONDS, PastJob.FINISHED_AT: now}
        )
        waiting = job_document(
            "/split-names", dataset, status=Status.WAITING, generation=queue, difficulty=80, created_at=now
        )
        waiting[ID] = ObjectId(b"waiting-job1")  # the same in both queues compared
        store.jobs.insert_one(waiting)
        DeploymentWrites(store, queue).insert([waiting])
    return started


#: The deployment's documents a finish may touch, and whether their ``_id`` is MongoDB's own (a new ObjectId).
TOUCHED = {
    "jobs": False,
    "locks": False,
    "job_metrics": True,
    "worker_size_metrics": True,
    "past_jobs": True,
    "blockages": True,
}


def documents(store: Store) -> dict[str, list[Any]]:
    """Each collection a finish touches, its documents in a comparable order, without the ``_id`` MongoDB chose."""
    found = {}
    for name, generated_id in TOUCHED.items():
        rows = [
            {key: value for key, value in row.items() if not (generated_id and key == ID)}
            for row in getattr(store, name).find()
        ]
        found[name] = sorted(rows, key=repr)
    return found


@pytest.mark.parametrize("generation", list(QUEUE_GENERATIONS))
def test_the_model_and_the_cleanups_bookkeeping_leave_the_same_documents_after_the_same_finishes(
    fresh_database, generation: str
):
    now = truncate_ms(utc_now())
    queue = QUEUE_GENERATIONS[generation]
    modelled, cleaned = (Store.of(fresh_database("queue"), fresh_database("cache")) for _ in range(2))
    jobs = queue_with_a_dataset_at_its_limit(modelled, generation, now)
    assert [job[ID] for job in queue_with_a_dataset_at_its_limit(cleaned, generation, now)] == [job[ID] for job in jobs]
    finished = [(job, Status.SUCCESS if index % 2 else Status.ERROR) for index, job in enumerate(jobs)]
    before = documents(modelled)
    assert before == documents(cleaned)

    DeploymentWrites(modelled, queue).finish(finished, now)
    if queue.keeps_finished_jobs:
        for job, status in finished:
            cleaned.jobs.update_one({ID: job[ID]}, {"$set": {Job.STATUS: status, Job.FINISHED_AT: now}})
    else:
        cleaned.jobs.delete_many({ID: {"$in": [job[ID] for job in jobs]}})
    side = SideCollections.of(cleaned, queue)
    DeploymentEffects(cleaned, side).after_finish([Finished(job, now, status) for job, status in finished], now)

    after, expected = documents(modelled), documents(cleaned)
    assert after != before  # the finishes wrote something: the comparison below is not of two untouched queues
    if queue.frees_owned_locks:
        # The one difference, by design (docs/generations.md): the cleanup frees the start lock by its key too,
        # which this era's finish of a live worker's job did not (it freed the locks the job owned only).
        keys = {job[Job.UNICITY_ID] for job in jobs}
        assert {lock[ID] for lock in after["locks"] if lock not in expected["locks"]} == keys & {
            lock[ID] for lock in before["locks"]
        }
        after["locks"] = [lock for lock in after["locks"] if lock[ID] not in keys]
        expected["locks"] = [lock for lock in expected["locks"] if lock[ID] not in keys]
    assert after == expected
    if queue.keeps(BLOCKAGES_COLLECTION):
        assert len(after["blockages"]) == 1  # the dataset at its limit: blocked, its waiting job's size uncounted
        assert queue.keeps(WORKER_SIZE_METRICS_COLLECTION)
    if queue.keeps(LOCKS_COLLECTION) and Lock.OWNER in queue.lock_fields:
        held = [lock for lock in after["locks"] if lock[Lock.OWNER] is not None]
        # the crashed job's git branch lock: freed with it where the finish frees owned locks, else left to its TTL
        assert len(held) == (0 if queue.frees_owned_locks else 1)
