"""The production path: Dagster's own engine on PostgreSQL, fired by ticks, with the production run queue.

One deployment for the module, as deploy/ describes it and nothing in its place: a private PostgreSQL
cluster holds the instance (deploy/dagster.yaml, copied unchanged into a fresh DAGSTER_HOME, its variables
pointing at that cluster); the code location is served by the Dockerfile's command (``dagster code-server
start``) and found through deploy/workspace.yaml; ``dagster-daemon run`` fires schedules and sensors, keeps
the run queue and monitors the runs; runs are launched by the code server, as in a deployment without
Kubernetes. The queue is simulated on the session's MongoDB-wire server, today's generation (finished jobs
deleted), with zombies of every kind. kill_zombies_schedule is turned on with its cron overridden to every
minute (ZOMBIE_KILL_CRON), and stale_jobs_sensor too. cleanup_checks_sensor is turned off to save a run
after every cleanup (its checks are the end-to-end test's business). Every process is stopped by PID when
the module ends, and the test checks none is left.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import subprocess
import sys
import uuid
from typing import Iterator

import dagster as dg
import pytest

from tests.deploy import processes
from tests.deploy.instance import Operator, operator
from tests.deploy.postgres import PrivateCluster, private_cluster
from tests.deploy.processes import REPO_ROOT
from tests.e2e.harness import wait_for
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    HOME_ENV,
    KILL_CRON_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
    WEBHOOK_URL_ENV,
)
from zombie_pipeline.orchestration.tags import QUEUE_DATABASE_TAG
from zombie_pipeline.queue.connections import client_for
from zombie_pipeline.queue.documents import (
    ID,
    Cache,
    ErrorCode,
    Event,
    Job,
    Status,
    cache_key_of_job,
)
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.embedded import free_port
from zombie_pipeline.simulation.simulator import Simulation, Workload, simulate

pytestmark = pytest.mark.slow

DEPLOY = REPO_ROOT / "deploy"
CLEANUP = "kill_zombies_job"
SCHEDULE = "kill_zombies_schedule"
SENSOR = "stale_jobs_sensor"
EVERY_MINUTE = "* * * * *"
IN_FLIGHT = {dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED}
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}
RUN_TIMEOUT = 150  # a run takes seconds; the margin is for a machine busy with the rest of the suite


class Deployment:
    def __init__(self, store: Store, simulation: Simulation, zombies: list[dict], cluster: PrivateCluster,
                 instance: dg.DagsterInstance, ops: Operator, env: dict[str, str],
                 server: processes.ProcessTree, daemon: processes.ProcessTree) -> None:  # fmt: skip
        self.store = store
        self.simulation = simulation
        self.zombies = zombies  # the zombie jobs as they were: finalized ones are deleted
        self.cluster = cluster
        self.instance = instance
        self.ops = ops
        self.env = env
        self.server = server
        self.daemon = daemon

    def wait(self, what: str, probe, timeout: float, interval: float = 0.5):
        """``wait_for``, and on a timeout the daemon's and the code server's last words."""
        try:
            return wait_for(what, probe, timeout, interval)
        except TimeoutError as error:
            logs = f"--- daemon ---\n{self.daemon.log_tail()}\n--- code server ---\n{self.server.log_tail()}"
            raise TimeoutError(f"{error}\n{logs}") from None

    def wait_for_run(self, run_id: str, timeout: float = RUN_TIMEOUT) -> dg.DagsterRunStatus:
        def finished():
            run = self.instance.get_run_by_id(run_id)
            return run.status if run is not None and run.is_finished else None

        return self.wait(f"run {run_id} to finish", finished, timeout)

    def cleanup_records(self) -> list[dg.RunRecord]:
        return list(self.instance.get_run_records(dg.RunsFilter(job_name=CLEANUP)))


@pytest.fixture(scope="module")
def deployment(mongo_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    base = tmp_path_factory.mktemp("production")
    home = base / "dagster_home"
    home.mkdir()
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    client = client_for(mongo_url)
    suffix = uuid.uuid4().hex[:12]
    store = Store.of(client[f"test_prod_queue_{suffix}"], client[f"test_prod_cache_{suffix}"])
    with private_cluster() as cluster, dropped_after(store):
        store.ensure_indexes()
        # today's generation (the simulator's default): a finalized zombie is deleted, its error left in the cache
        simulation = simulate(store, Workload(finished=80, crashed=4, never_heartbeated=2, terminated=2, overdue=2,
                                              running=20, waiting=5, days=1.0, seed=14))  # fmt: skip
        zombies = list(store.jobs.find({ID: {"$in": simulation.zombie_ids}}))
        cluster.create_database("dagster")
        port = free_port()
        instance_env = {
            **cluster.env("dagster"),
            "DAGSTER_HOME": str(home),
            "DAGSTER_MAX_CONCURRENT_RUNS": "10",
            "DAGSTER_DEQUEUE_INTERVAL_SECONDS": "1",
            "ZOMBIE_CODE_SERVER_HOST": "127.0.0.1",
            "ZOMBIE_CODE_SERVER_PORT": str(port),
        }
        # what the code server (and the run workers it launches) reads; the instance's variables too, since
        # every process that opens the instance resolves dagster.yaml's {env: ...} in its own environment
        pipeline_env = {
            QUEUE_URL_ENV: mongo_url,
            CACHE_URL_ENV: mongo_url,
            QUEUE_DATABASE_ENV: store.jobs.database.name,
            CACHE_DATABASE_ENV: store.cache.database.name,
            KILL_CRON_ENV: EVERY_MINUTE,
            WEBHOOK_URL_ENV: "",
            HOME_ENV: str(base / "zombie_pipeline_home"),
        }
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, **instance_env, "PYTHONPATH": python_path}  # this checkout's code, however installed
        server = processes.code_server(port, {**env, **pipeline_env}, base / "code-server.log")
        daemon = processes.daemon(DEPLOY / "workspace.yaml", env, base / "daemon.log")
        try:
            server.start()
            with pytest.MonkeyPatch.context() as patch:
                for name, value in instance_env.items():
                    patch.setenv(name, value)
                processes.wait_until_serving(port, env, server)
                with dg.DagsterInstance.from_config(str(home)) as instance, operator(instance, DEPLOY / "workspace.yaml") as ops:
                    # turned on before the daemon starts, as an operator does after a first deploy; the schedule
                    # only once the sensor has fired, so that its tick cannot put a cleanup in flight first (the
                    # sensor asks for none while one is)
                    ops.stop_sensor("cleanup_checks_sensor")
                    ops.start_sensor(SENSOR)
                    daemon.start()
                    yield Deployment(store, simulation, zombies, cluster, instance, ops, env, server, daemon)
        except Exception:
            print(f"--- code server log ---\n{server.log_tail()}\n--- daemon log ---\n{daemon.log_tail()}")
            raise
        finally:
            pids = daemon.stop() + server.stop()
            assert [pid for pid in pids if processes.pid_alive(pid)] == [], "processes of the deployment survived the stop"


@contextlib.contextmanager
def dropped_after(store: Store) -> Iterator[None]:
    """A real MongoDB (ZOMBIE_TEST_MONGO_URL) is cleaned up; a server the tests started goes with its storage."""
    try:
        yield
    finally:
        if os.environ.get("ZOMBIE_TEST_MONGO_URL"):
            for database in (store.jobs.database, store.cache.database):
                database.client.drop_database(database.name)


@pytest.fixture(scope="module")
def sensor_run(deployment: Deployment) -> dg.DagsterRun:
    """The run the sensor's first tick asked for; the schedule is turned on as soon as it exists."""
    ops = deployment.ops

    def requested():
        return [tick for tick in ops.sensor_ticks(SENSOR) if tick.run_ids]

    [tick] = deployment.wait("a stale_jobs_sensor tick that requests a run", requested, RUN_TIMEOUT)
    ops.start_schedule(SCHEDULE)
    [run_id] = tick.run_ids
    return deployment.instance.get_run_by_id(run_id)


def test_the_instance_is_postgresql_with_the_production_queue_and_the_cron_comes_from_the_environment(deployment):
    instance = deployment.instance
    assert type(instance.run_storage).__module__.startswith("dagster_postgres")
    assert type(instance.event_log_storage).__module__.startswith("dagster_postgres")
    assert type(instance.schedule_storage).__module__.startswith("dagster_postgres")
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    assert instance.run_monitoring_enabled and instance.run_retries_enabled
    assert deployment.ops.repository.get_schedule(SCHEDULE).cron_schedule == EVERY_MINUTE
    connection = deployment.cluster.connect("dagster")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
            tables = {row[0] for row in cursor.fetchall()}
    finally:
        connection.close()
    assert {"runs", "event_logs", "instigators", "job_ticks"} <= tables, tables


def test_a_sensor_tick_launches_a_cleanup_that_finalizes_every_zombie(deployment, sensor_run):
    assert sensor_run.tags["dagster/sensor_name"] == SENSOR
    assert sensor_run.tags[QUEUE_DATABASE_TAG] == deployment.store.jobs.database.name
    assert deployment.wait_for_run(sensor_run.run_id) == dg.DagsterRunStatus.SUCCESS

    store = deployment.store
    zombie_ids = [job[ID] for job in deployment.zombies]
    assert store.jobs.count_documents({ID: {"$in": zombie_ids}}) == 0  # today's generation deletes them
    assert {job[Job.STATUS] for job in store.jobs.find({ID: {"$in": deployment.simulation.running_ids}})} == {Status.STARTED}
    for job in deployment.zombies:
        expected = ErrorCode.EXCEEDED_MAX_DURATION if job[ID] in deployment.simulation.overdue_ids else ErrorCode.CRASHED
        assert store.cache.find_one(cache_key_of_job(job))[Cache.ERROR_CODE] == expected
    assert {event[Event.RUN_ID] for event in store.events.find({ID: {"$in": zombie_ids}})} == {sensor_run.run_id}


def test_two_cleanups_of_one_queue_run_one_at_a_time_the_second_waiting_in_the_queue(deployment, sensor_run):
    first, second = deployment.ops.launch(CLEANUP), deployment.ops.launch(CLEANUP)
    seen: list[tuple] = []

    def both_finished():
        statuses = tuple(deployment.instance.get_run_by_id(run.run_id).status for run in (first, second))
        seen.append(statuses)
        return all(status in FINISHED for status in statuses)

    deployment.wait("both cleanups to finish", both_finished, 2 * RUN_TIMEOUT, interval=0.2)
    assert seen[-1] == (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.SUCCESS)
    # the first one was launched while the second stayed queued: the coordinator held it back
    assert any(one in IN_FLIGHT and other == dg.DagsterRunStatus.QUEUED for one, other in seen), seen
    assert not any(one in IN_FLIGHT and other in IN_FLIGHT for one, other in seen), seen
    records = {record.dagster_run.run_id: record for record in deployment.cleanup_records()}
    assert records[first.run_id].end_time <= records[second.run_id].start_time
    assert_never_two_cleanups_at_once(deployment)


def test_a_schedule_tick_launches_a_cleanup_that_succeeds(deployment, sensor_run):
    def run_of_a_tick():
        return [tick for tick in deployment.ops.schedule_ticks(SCHEDULE) if tick.run_ids]

    ticks = deployment.wait("a kill_zombies_schedule tick that launches a run", run_of_a_tick, 75 + RUN_TIMEOUT, interval=1)
    run = deployment.instance.get_run_by_id(ticks[-1].run_ids[0])
    assert run.job_name == CLEANUP and run.tags["dagster/schedule_name"] == SCHEDULE
    assert deployment.wait_for_run(run.run_id) == dg.DagsterRunStatus.SUCCESS
    # every zombie was finalized by a run that a tick launched, and it succeeded
    tick_runs = {run.run_id for run in deployment.instance.get_runs(dg.RunsFilter(job_name=CLEANUP)) if
                 {"dagster/schedule_name", "dagster/sensor_name"} & set(run.tags)}  # fmt: skip
    finalizers = {event[Event.RUN_ID] for event in deployment.store.events.find({ID: {"$in": deployment.simulation.zombie_ids}})}
    assert finalizers <= tick_runs
    assert all(deployment.instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS for run_id in finalizers)
    assert deployment.store.failures.count_documents({}) == 0  # pipeline_failure_sensor recorded no failed run
    assert_never_two_cleanups_at_once(deployment)


def test_old_finished_runs_are_purged_with_their_event_logs(deployment, sensor_run):
    finished = [record.dagster_run.run_id for record in deployment.cleanup_records() if record.dagster_run.is_finished]
    assert finished
    assert deployment.instance.all_logs(finished[0])
    purged = subprocess.run(
        [sys.executable, str(DEPLOY / "purge_runs.py"), "--older-than-days", "0", "--job", CLEANUP],
        env=deployment.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert purged.returncode == 0, purged.stderr[-3000:]
    assert f"{CLEANUP}: deleted" in purged.stdout
    for run_id in finished:
        assert deployment.instance.get_run_by_id(run_id) is None
        assert deployment.instance.all_logs(run_id) == []


def assert_never_two_cleanups_at_once(deployment: Deployment) -> None:
    """The limit of one cleanup per queue database, over every cleanup the instance ever ran."""
    spans = sorted(
        (record.start_time, record.end_time or dt.datetime.now(dt.timezone.utc).timestamp())
        for record in deployment.cleanup_records()
        if record.start_time is not None
    )
    for (_, end), (next_start, _) in zip(spans, spans[1:]):
        assert end <= next_start, spans
