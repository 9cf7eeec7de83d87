"""The living queue an hour long: ``zombie-pipeline simulate`` then ``zombie-pipeline workers``, on a bad day.

An hour of the simulated workers (crashes and overruns at ten times their default rates, replacements, arrivals,
jobs of their real durations) driven by a virtual clock in about a minute: the dates the workers write and the ones the cleanups
judge by come from the same clock. The hour is one that ended when the test began; then the clock is set to the
present, the workers beat once, and a last cleanup is launched through Dagster. Cache entries flow in every
5-minute window, and a cleanup every 10 minutes succeeds with the default policy.

About a minute of database commands (20 workers, some 1,500 jobs): marker ``load``, run by ``.ci/run``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest

from tests.figures import report_figures
from tests.helpers import METRICS_OFF, database_resources, run_kill_zombies
from tests.simulation.test_workers import VirtualClock, silent_since
from zombie_pipeline.cleanup.detection import count_stale, started_filter
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.defs.failures.causes import result_cause
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.cache import Cache
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates
from zombie_pipeline.simulation.workload import Workload, healthy_beside

POLICY = ZombiePolicy()
HOUR = 3_600
TICK_SECONDS = 5.0
CLEANUP_EVERY = 600
WINDOW = 300
URL_ENV = "ZOMBIE_TEST_LIVING_URL"
#: A small deployment's zombies: beside them, the 20 healthy jobs the brake needs at least.
ZOMBIES: dict[str, Any] = {"crashed": 3, "never_heartbeated": 1, "terminated": 1, "overdue": 1}

#: A bad day: ten times the default crashes and overruns (some every 10 minutes, beside 20 workers).
RATES = WorkerRates(crashes_per_worker_hour=0.5, overruns_per_worker_hour=0.25)

pytestmark = pytest.mark.load


def test_an_hour_of_the_living_queue_writes_cache_entries_in_every_window_and_every_cleanup_succeeds(
    store: Store, mongo_url, monkeypatch
):
    clock = VirtualClock(start=utc_now() - dt.timedelta(seconds=HOUR + TICK_SECONDS))
    zombies = Workload(finished=0, **ZOMBIES).zombies
    simulation = simulate(  # zombie-pipeline simulate --crashed 3 ..., the healthy jobs sized as it sizes them
        store,
        Workload(finished=300, **ZOMBIES, running=healthy_beside(zombies, POLICY), policy=POLICY),
        now=clock.now(),
    )
    pool = WorkerPool(
        store, QUEUE_GENERATIONS[NEWEST_QUEUE_GENERATION], POLICY, RATES, clock=clock.monotonic, now=clock.now
    )
    assert pool.adopt_running() == len(simulation.running_ids)  # zombie-pipeline workers: a worker per healthy job

    cleanups: list[tuple[int, int, int]] = []
    while clock.seconds < HOUR:
        pool.tick()
        clock.advance(TICK_SECONDS)
        if clock.seconds % CLEANUP_EVERY < TICK_SECONDS:  # a cleanup launched from the UI every 10 minutes
            now = clock.now()
            dead, started = count_stale(store.jobs, POLICY, now), store.jobs.count_documents(started_filter())
            report = run_cleanup(store, POLICY, f"living-{len(cleanups)}", now=now)  # raises BrakeEngaged if braked
            cleanups.append((dead, started, report.counts["finalized"]))

    clock.start = utc_now() - dt.timedelta(seconds=clock.seconds + RATES.heartbeat_seconds)  # the hour ended just now
    clock.advance(RATES.heartbeat_seconds)
    pool.tick()  # every worker beats, at the present
    monkeypatch.setenv(URL_ENV, mongo_url)
    resources = {
        **database_resources(store, URL_ENV),
        "zombie_policy": ZombiePolicyResource(),
        **METRICS_OFF,
    }
    launched = run_kill_zombies(resources)  # the hour is over: now, through Dagster, as the Launchpad launches it
    pool.stop()

    assert launched.success, result_cause(launched)
    assert len(cleanups) == HOUR // CLEANUP_EVERY
    for dead, started, finalized in cleanups:
        assert finalized == dead  # each found its zombies and finalized them all
        assert dead < POLICY.max_stale_fraction * started  # below the brake
    assert cleanups[0][2] >= zombies  # the simulated zombies, and whatever died in the first 10 minutes
    finalized_ids = set(store.events.distinct(ID))
    assert set(simulation.zombie_ids) <= finalized_ids
    for job_id in set(pool.died) - finalized_ids:  # a worker that died within the timeout: not a zombie yet
        job = store.jobs.find_one({ID: job_id})
        assert job is not None and utc_now() - silent_since(job) < dt.timedelta(
            seconds=POLICY.heartbeat_timeout_seconds
        )
    written = Counter(
        int((entry[Cache.UPDATED_AT] - clock.start).total_seconds() // WINDOW)
        for entry in store.cache.find({Cache.UPDATED_AT: {"$gte": clock.start}}, {Cache.UPDATED_AT: 1})
    )
    per_window = [written.get(window, 0) for window in range(HOUR // WINDOW)]
    assert min(per_window) > 0, per_window
    assert pool.counts["finished_success"] > 500
    assert pool.counts["died"] > 0 and sum(finalized for _, _, finalized in cleanups[1:]) > 0
    report_figures(
        "living_queue_hour",
        {
            "cache_entries_per_5_minutes": per_window,
            "cleanups_dead_started_finalized": cleanups,
            "workers": pool.workers,
            "counts": dict(pool.counts),
        },
    )
    assert store.jobs.count_documents({Job.STATUS: Status.WAITING}) > 0
