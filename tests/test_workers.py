"""Simulated workers, in every queue generation: a queue that moves as the deployment's does, and dies as it does.

A virtual clock drives each pool through two minutes of work in a moment: the dates the workers write
and the ones detection judges by come from the same clock, so heartbeats, timeouts and maximum durations
are real for every party.
"""

from __future__ import annotations

import datetime as dt

import pytest

from tests.helpers import workload
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.detection import detect
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.documents import (
    ID,
    LOCKS_COLLECTION,
    Job,
    Reason,
    Status,
    utc_now,
)
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, QUEUE_GENERATIONS
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.simulator import WorkloadError, simulate
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates

#: Jobs of a few seconds (their type's duration times 0.02), dead after 10 s of silence, overdue after 30 s.
POLICY = ZombiePolicy(heartbeat_timeout_seconds=10, max_duration_seconds=30)
RATES = WorkerRates(workers=3, crash_rate=0.2, overrun_rate=0.3, speed=0.02, heartbeat_seconds=4, waiting_target=6)
TICK_SECONDS = 2.0
TICKS = 40  # 80 s: crashes older than the timeout, overruns past their maximum duration


class VirtualClock:
    """Seconds for the pool's schedule and the dates it writes, moved by the test only."""

    def __init__(self) -> None:
        self.start = utc_now()
        self.seconds = 0.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> dt.datetime:
        return self.start + dt.timedelta(seconds=self.seconds)

    def advance(self, seconds: float) -> dt.datetime:
        self.seconds += seconds
        return self.now()


def in_flight(pool: WorkerPool) -> tuple[set, set]:
    """The jobs the pool's workers hold: (alive, crashed)."""
    runs = [run for run in pool.runs if run is not None]
    return {run.job[ID] for run in runs if not run.crashed}, {run.job[ID] for run in runs if run.crashed}


def declared_fields_only(store: Store, generation_name: str) -> None:
    generation = QUEUE_GENERATIONS[generation_name]
    cache_generation = CACHE_GENERATIONS[generation.cache_generation]
    for job in store.jobs.find():
        assert set(job) - {ID} <= generation.job_fields, job
        assert job[Job.STATUS] in generation.statuses, job
    for entry in store.cache.find():
        assert set(entry) - {ID} <= cache_generation.fields, entry
    locks = list(store.locks.find())
    assert not locks or generation.keeps(LOCKS_COLLECTION)
    for lock in locks:
        assert set(lock) - {ID} <= generation.lock_fields, lock


@pytest.mark.parametrize("generation", list(QUEUE_GENERATIONS))
def test_workers_move_the_queue_as_the_generation_does_and_their_crashes_and_overruns_become_zombies(
    store: Store, generation: str
):
    clock = VirtualClock()
    simulate(
        store,
        workload(
            finished=0,
            crashed=0,
            never_heartbeated=0,
            terminated=0,
            overdue=0,
            running=6,
            waiting=8,
            generation=generation,
            cache_generation=None,
            policy=POLICY,
            seed=5,
        ),
        now=clock.now(),
    )
    pool = WorkerPool(store, QUEUE_GENERATIONS[generation], POLICY, RATES, seed=3, clock=clock.monotonic, now=clock.now)
    assert pool.adopt_running() == 6  # the simulated healthy jobs are the pool's to beat and finish

    crashed: set = set()
    for _ in range(TICKS):
        pool.tick()
        crashed |= in_flight(pool)[1]
        clock.advance(TICK_SECONDS)
    alive, _ = in_flight(pool)

    assert counters.stored(store, QUEUE_GENERATIONS[generation]) == counters.recount(
        store, QUEUE_GENERATIONS[generation]
    )
    declared_fields_only(store, generation)
    assert pool.counts["finished_success"] > 5 and pool.counts["crashed"] == len(crashed) > 0
    # Judged now: a crash silent for longer than the timeout is a zombie; a live job running past its maximum duration too;
    # every other live job beats and is spared.
    now = clock.now()
    reasons = {candidate.id: candidate.reason for candidate in detect(store.jobs, POLICY, now).candidates}
    started_at = {job[ID]: job[Job.STARTED_AT] for job in store.jobs.find({ID: {"$in": list(alive | crashed)}})}
    overdue = {job_id for job_id in alive if (now - started_at[job_id]).total_seconds() > POLICY.max_duration_seconds}
    dead = {
        job_id for job_id in crashed if (now - started_at[job_id]).total_seconds() > POLICY.heartbeat_timeout_seconds
    }
    assert overdue and dead
    assert set(reasons) == overdue | dead
    assert {reasons[job_id] for job_id in overdue} == {Reason.EXCEEDED_MAX_DURATION}
    assert {reasons[job_id] for job_id in dead} <= {
        Reason.NEVER_HEARTBEATED,
        Reason.EXCEEDED_MAX_DURATION,
    }  # it never beat

    report = run_cleanup(store, POLICY, "cleanup-amid-workers", now=now)
    assert report.counts["finalized"] == len(overdue | dead)
    for _ in range(15):  # 30 s: the workers holding the overruns the cleanup finished find them gone
        pool.tick()
        crashed |= in_flight(pool)[1]
        clock.advance(TICK_SECONDS)
    pool.stop()

    assert pool.counts["finished_by_someone_else"] >= len(overdue)
    left = {job[ID] for job in store.jobs.find({Job.STATUS: Status.STARTED}, {ID: 1})}
    assert left == crashed - dead  # the crashed jobs the cleanup did not take yet stay zombies; nobody else is started
    assert counters.stored(store, QUEUE_GENERATIONS[generation]) == counters.recount(
        store, QUEUE_GENERATIONS[generation]
    )
    declared_fields_only(store, generation)


@pytest.mark.parametrize(
    ("rates", "named"),
    [
        ({"workers": 0}, "workers"),
        ({"crash_rate": 1.5}, "crash_rate"),
        ({"overrun_rate": -0.1}, "overrun_rate"),
        ({"speed": 0}, "speed"),
        ({"heartbeat_seconds": -1}, "heartbeat_seconds"),
    ],
)
def test_a_bad_rate_is_refused_naming_it(rates: dict, named: str):
    with pytest.raises(WorkloadError, match=named):
        WorkerRates(**rates)
