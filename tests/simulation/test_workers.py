"""Simulated workers, in every queue generation: a queue that moves as the deployment's does, and dies as it does.

A virtual clock drives each pool through two minutes of work in a moment: the dates the workers write
and the ones detection judges by come from the same clock, so heartbeats, timeouts and maximum durations
are real for every party.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

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
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates
from zombie_pipeline.simulation.workload import WorkloadError

#: Jobs of a few seconds (their type's duration times 0.02), dead after 10 s of silence, overdue after 30 s.
POLICY = ZombiePolicy(heartbeat_timeout_seconds=10, max_duration_seconds=30)
#: Crashes and overruns every few seconds of a worker's work: the whole life of a queue within two minutes.
RATES = WorkerRates(
    workers=3,
    crashes_per_worker_hour=60,
    overruns_per_worker_hour=900,
    max_overrunning_share=1.0,
    restart_seconds=4,
    speed=0.02,
    heartbeat_seconds=4,
    waiting_target=6,
)
TICK_SECONDS = 2.0
MAX_TICKS = 300  # 10 minutes at most; both kinds of zombie usually show within two


class VirtualClock:
    """Seconds for the pool's schedule and the dates it writes, moved by the test only."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.start = start or utc_now()
        self.seconds = 0.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> dt.datetime:
        return self.start + dt.timedelta(seconds=self.seconds)

    def advance(self, seconds: float) -> dt.datetime:
        self.seconds += seconds
        return self.now()


def alive(pool: WorkerPool) -> set:
    """The jobs the pool's living workers hold (a worker that died holds nothing: its job is in ``pool.died``)."""
    return {run.job[ID] for run in pool.runs if run is not None}


def both_kinds_of_zombie(store: Store, pool: WorkerPool, now: dt.datetime) -> bool:
    """A live job past its maximum duration, and a dead worker's job silent for longer than the timeout."""
    limit, timeout = (dt.timedelta(seconds=s) for s in (POLICY.max_duration_seconds, POLICY.heartbeat_timeout_seconds))
    started = {job[ID]: job for job in store.jobs.find({Job.STATUS: Status.STARTED})}
    overdue = any(now - started[i][Job.STARTED_AT] > limit for i in alive(pool) if i in started)
    dead = any(now - silent_since(started[i]) > timeout for i in pool.died if i in started)
    return overdue and dead


def silent_since(job: Mapping[str, Any]) -> dt.datetime:
    """Since when a dead worker's job has said nothing: its SIGTERM, else its last heartbeat, else its start."""
    return job.get(Job.TERMINATED_AT) or job.get(Job.LAST_HEARTBEAT) or job[Job.STARTED_AT]


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

    for _ in range(MAX_TICKS):  # until both kinds of zombie are there to judge (an overrun is one for a while only)
        pool.tick()
        clock.advance(TICK_SECONDS)
        if both_kinds_of_zombie(store, pool, clock.now()):
            break
    generation_ = QUEUE_GENERATIONS[generation]

    assert counters.stored(store, generation_) == counters.recount(store, generation_)
    declared_fields_only(store, generation)
    assert pool.counts["finished_success"] > 5 and pool.counts["died"] == len(pool.died) > 0
    # Judged now: a dead worker's job silent for longer than the timeout is a zombie (a crash, whatever its age); a
    # live job running past its maximum duration is one too; every other live job beats and is spared.
    now = clock.now()
    reasons = {candidate.id: candidate.reason for candidate in detect(store.jobs, POLICY, now).candidates}
    jobs = {job[ID]: job for job in store.jobs.find({ID: {"$in": list(alive(pool) | set(pool.died))}})}
    overdue = {i for i in alive(pool) if (now - jobs[i][Job.STARTED_AT]).total_seconds() > POLICY.max_duration_seconds}
    dead = {i for i in pool.died if (now - silent_since(jobs[i])).total_seconds() > POLICY.heartbeat_timeout_seconds}
    assert overdue and dead
    assert set(reasons) == overdue | dead
    assert {reasons[i] for i in overdue} == {Reason.EXCEEDED_MAX_DURATION}
    assert {reasons[i] for i in dead} <= {Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.TERMINATED}
    if generation_.declares(Job.TERMINATED_AT):
        assert pool.counts["terminated"] > 0
        assert Reason.TERMINATED in {reasons[i] for i in dead}

    report = run_cleanup(store, POLICY, "cleanup-amid-workers", now=now)
    assert report.counts["finalized"] == len(overdue | dead)
    for _ in range(15):  # 30 s: the workers holding the overruns the cleanup finished see it at their next beat
        pool.tick()
        clock.advance(TICK_SECONDS)
    pool.stop()

    assert pool.counts["finished_by_someone_else"] >= len(overdue)
    left = {job[ID] for job in store.jobs.find({Job.STATUS: Status.STARTED}, {ID: 1})}
    assert left == set(pool.died) - dead  # the dead the cleanup did not judge yet stay zombies; nobody else is started
    assert counters.stored(store, generation_) == counters.recount(store, generation_)
    declared_fields_only(store, generation)


@pytest.mark.parametrize(
    ("rates", "named"),
    [
        ({"workers": 0}, "workers"),
        ({"crashes_per_worker_hour": -1}, "crashes_per_worker_hour"),
        ({"overruns_per_worker_hour": -0.1}, "overruns_per_worker_hour"),
        ({"max_overrunning_share": 1.5}, "max_overrunning_share"),
        ({"restart_seconds": -1}, "restart_seconds"),
        ({"speed": 0}, "speed"),
        ({"heartbeat_seconds": -1}, "heartbeat_seconds"),
        ({"waiting_target": -1}, "waiting_target"),
    ],
)
def test_a_bad_rate_is_refused_naming_it(rates: dict, named: str):
    with pytest.raises(WorkloadError, match=named):
        WorkerRates(**rates)
