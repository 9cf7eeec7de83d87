"""The demo on the embedded default, with a living queue: it still works long after the first simulation.

Time is shortened, not faked: a heartbeat timeout of 4 s and workers beating every second, so the
workers run past the timeout in seconds. Without their heartbeats every healthy job would look dead by
then, and the brake would stop the cleanup.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import run_kill_zombies, step_failure_messages
from tests.servers import kill_recorded_server
from zombie_pipeline.app.demo import run_demo
from zombie_pipeline.config import (
    CACHE_URL_ENV,
    DAGSTER_HOME_ENV,
    HOME_ENV,
    QUEUE_URL_ENV,
)
from zombie_pipeline.orchestration.resources import (
    ZombiePolicyResource,
    resources_from_env,
    store_of,
)
from zombie_pipeline.queue.documents import ID, Event, EventState, Job, Status
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.simulation.simulator import Workload, simulate
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates

TIMEOUT = 4
RATES = WorkerRates(heartbeat_seconds=1, crash_rate=0.0, speed=1.0)  # jobs of seconds to minutes, beating every second


@pytest.fixture
def embedded_home(tmp_path, monkeypatch):
    """No URL: every command, run and worker uses the embedded server of a project home of the test's own."""
    home = tmp_path / "home"
    for variable in (QUEUE_URL_ENV, CACHE_URL_ENV, DAGSTER_HOME_ENV):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(HOME_ENV, str(home))
    try:
        yield home
    finally:
        kill_recorded_server(home)


def test_the_demo_and_a_cleanup_from_the_ui_succeed_after_the_workers_ran_past_the_heartbeat_timeout(
    embedded_home, capsys
):
    resources = {**resources_from_env(), "zombie_policy": ZombiePolicyResource(heartbeat_timeout_seconds=TIMEOUT)}
    policy = resources["zombie_policy"].policy()
    store = store_of(resources["queue_db"], resources["cache_db"])  # starts the embedded server
    # zombie-pipeline simulate: 40 healthy jobs and 5 zombies
    simulation = simulate(
        store,
        Workload(
            finished=100, crashed=2, never_heartbeated=1, terminated=1, overdue=1, running=40, waiting=10, policy=policy
        ),
    )
    # zombie-pipeline workers, beside the UI
    pool = WorkerPool(store, QUEUE_GENERATIONS[NEWEST_QUEUE_GENERATION], policy, RATES, seed=1)
    assert pool.adopt_running() == 40
    stopping = threading.Event()
    workers = threading.Thread(target=pool.run, args=(600, stopping.is_set, 0.25), daemon=True)
    workers.start()
    try:
        time.sleep(TIMEOUT + 1.5)
        started = store.jobs.count_documents({Job.STATUS: Status.STARTED})
        assert started >= policy.min_started_for_brake  # the brake is in play: without heartbeats it would stop the run

        launched = run_kill_zombies(resources)  # as the UI launches it: no run config
    finally:
        stopping.set()
        workers.join(timeout=60)

    assert launched.success, step_failure_messages(launched)
    finalized = {event[ID] for event in store.events.find({}, {ID: 1})}
    assert finalized == set(simulation.zombie_ids)  # the simulated zombies, and not one of the jobs kept alive
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 0  # stopped workers finish what they hold

    assert run_demo(finished=100, resources=resources, rates=RATES) == 0
    printed = capsys.readouterr().out
    assert "kill_zombies_job: succeeded" in printed
    assert "zombies left: 0" in printed
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 0
    assert store.events.count_documents({Event.STATE: {"$ne": EventState.DONE}}) == 0
