"""The production path: Dagster's own engine on PostgreSQL, fired by ticks, with the production run queue.

One deployment for the module, as deploy/ describes it and nothing in its place (tests/deploy/stack.py): the
instance is deploy/dagster.yaml unchanged, on a private PostgreSQL cluster; the code server runs the
Dockerfile's command; ``dagster-daemon run`` fires schedules and sensors. The queue is simulated, today's
generation (finished jobs deleted), with zombies of every kind. kill_zombies_schedule is turned on with its cron
overridden to every minute (ZOMBIE_KILL_CRON), and stale_jobs_sensor too. cleanup_checks_sensor is turned off
to save a run after every cleanup (its checks are the end-to-end test's business). The location's policy comes from a
policy file (ZOMBIE_POLICY_FILE) that changes two settings: the sensor judges the queue by it and every run applies it.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import dagster as dg
import pytest
from bson import ObjectId

from tests.deploy import processes
from tests.deploy.stack import (
    CLEANUP,
    DEPLOY,
    EVERY_MINUTE,
    RUN_TIMEOUT,
    Deployment,
    assert_never_two_cleanups_at_once,
    deployment_stack,
)
from tests.helpers import found
from zombie_pipeline.config import POLICY_FILE_ENV
from zombie_pipeline.defs.tags import QUEUE_DATABASE_TAG, STALE_COUNT_TAG
from zombie_pipeline.queue.audit_documents import Event
from zombie_pipeline.queue.cache import Cache, ErrorCode, cache_key_of_job
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import job_document
from zombie_pipeline.simulation.workload import Workload

pytestmark = pytest.mark.slow
PROBE_TYPE = "/policy-probe"
PROBE_ID = ObjectId()

SCHEDULE = "kill_zombies_schedule"
SENSOR = "stale_jobs_sensor"
IN_FLIGHT = {dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED}
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


#: The location's policy file: a T2 of 330 s for the probe's type (the default, 1200 s, would not find it overdue), and
#: the error entries' http_status.
POLICY_FILE = f"http_status: 500\nmax_duration_seconds_by_type:\n  {PROBE_TYPE!r}: 330\n"


def plant_probe(store: Store) -> None:
    """A job alive (it beat 5 s ago) that started 400 s ago: overdue under the policy file, healthy under the defaults."""
    now = utc_now()
    probe = job_document(
        PROBE_TYPE,
        "probe/dataset",
        started_at=now - dt.timedelta(seconds=400),
        last_heartbeat=now - dt.timedelta(seconds=5),
    )
    store.jobs.insert_one({**probe, ID: PROBE_ID})


@pytest.fixture(scope="module")
def deployment(mongo_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    # today's generation (the simulator's default): a finalized zombie is deleted, its error left in the cache
    workload = Workload(
        finished=80, crashed=4, never_heartbeated=2, terminated=2, overdue=2, running=20, waiting=5, days=1.0, seed=14
    )

    def turn_on(ops):
        # as an operator does after a first deploy; the schedule only once the sensor has fired, so that its tick
        # cannot put a cleanup in flight first (the sensor asks for none while one is)
        ops.stop_sensor("cleanup_checks_sensor")
        ops.start_sensor(SENSOR)

    base = tmp_path_factory.mktemp("production")
    policy_file = base / "policy.yaml"
    policy_file.write_text(POLICY_FILE)
    with deployment_stack(
        mongo_url,
        base,
        workload,
        pipeline_env={POLICY_FILE_ENV: str(policy_file)},
        before_daemon=turn_on,
        prepare_queue=plant_probe,
    ) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def sensor_run(deployment: Deployment) -> dg.DagsterRun:
    """The run the sensor's first tick asked for; the schedule is turned on as soon as it exists."""
    ops = deployment.ops

    def requested():
        return [tick for tick in ops.sensor_ticks(SENSOR) if tick.run_ids]

    [tick] = deployment.wait("a stale_jobs_sensor tick that requests a run", requested, RUN_TIMEOUT)
    ops.start_schedule(SCHEDULE)
    [run_id] = tick.run_ids
    return found(deployment.instance.get_run_by_id(run_id))


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
    assert {job[Job.STATUS] for job in store.jobs.find({ID: {"$in": deployment.simulation.running_ids}})} == {
        Status.STARTED
    }
    for job in deployment.zombies:
        expected = (
            ErrorCode.EXCEEDED_MAX_DURATION if job[ID] in deployment.simulation.overdue_ids else ErrorCode.CRASHED
        )
        assert store.cache.find_one(cache_key_of_job(job))[Cache.ERROR_CODE] == expected
    assert {event[Event.RUN_ID] for event in store.events.find({ID: {"$in": zombie_ids}})} == {sensor_run.run_id}


def test_the_sensor_judges_the_queue_and_its_cleanup_works_by_the_locations_policy_file(deployment, sensor_run):
    """The probe is overdue only by the file's T2, and is found by the sensor's first tick, long before its heartbeat
    could go stale (300 s): the sensor counted it; the run it launched finalized it as exceeded, and wrote every error
    with the file's http_status."""
    assert deployment.wait_for_run(sensor_run.run_id) == dg.DagsterRunStatus.SUCCESS
    assert int(sensor_run.tags[STALE_COUNT_TAG]) == len(deployment.zombies) + 1
    probe = deployment.store.events.find_one({ID: PROBE_ID})
    assert (probe[Event.RUN_ID], probe[Event.REASON]) == (sensor_run.run_id, Reason.EXCEEDED_MAX_DURATION)
    entries = [deployment.store.cache.find_one(cache_key_of_job(job)) for job in deployment.zombies]
    assert {entry[Cache.HTTP_STATUS] for entry in entries} == {500}
    assert reconcile_metadata(deployment, sensor_run.run_id)["policy/http_status"] == 500


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

    ticks = deployment.wait(
        "a kill_zombies_schedule tick that launches a run", run_of_a_tick, 75 + RUN_TIMEOUT, interval=1
    )
    run = deployment.instance.get_run_by_id(ticks[-1].run_ids[0])
    assert run.job_name == CLEANUP and run.tags["dagster/schedule_name"] == SCHEDULE
    assert deployment.wait_for_run(run.run_id) == dg.DagsterRunStatus.SUCCESS
    # every zombie was finalized by a run that a tick launched, and it succeeded
    tick_runs = {run.run_id for run in deployment.instance.get_runs(dg.RunsFilter(job_name=CLEANUP)) if
                 {"dagster/schedule_name", "dagster/sensor_name"} & set(run.tags)}  # fmt: skip
    finalizers = {
        event[Event.RUN_ID] for event in deployment.store.events.find({ID: {"$in": deployment.simulation.zombie_ids}})
    }
    assert finalizers <= tick_runs
    assert all(deployment.instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS for run_id in finalizers)
    assert deployment.store.failures.count_documents({}) == 0  # pipeline_failure_sensor recorded no failed run
    assert reconcile_metadata(deployment, run.run_id)["policy/http_status"] == 500  # the location's policy file
    assert_never_two_cleanups_at_once(deployment)


def reconcile_metadata(deployment: Deployment, run_id: str) -> dict:
    """The output metadata of a cleanup run's first step, as the instance recorded it."""
    records = deployment.instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_OUTPUT).records
    [event] = [
        record.event_log_entry.dagster_event
        for record in records
        if record.event_log_entry.step_key == "plan_and_recover"
    ]
    return {key: value.value for key, value in found(event).step_output_data.metadata.items()}


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


def test_the_webserver_serves_the_deployment_with_the_compose_files_command(deployment, sensor_run, tmp_path):
    """deploy/docker-compose.yaml's webserver command, on 127.0.0.1: the code location loaded, the runs in PostgreSQL."""
    port = free_port()
    server = processes.webserver(DEPLOY / "workspace.yaml", port, deployment.env, tmp_path / "webserver.log").start()
    query = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } runsOrError { ... on Runs { count } } }"
    try:

        def answer():
            server.check_running()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                             headers={"Content-Type": "application/json"})  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return json.loads(response.read())["data"]
            except (urllib.error.URLError, ConnectionError):
                return None

        data = deployment.wait("the webserver to answer GraphQL", answer, RUN_TIMEOUT)
        assert {(entry["name"], entry["loadStatus"]) for entry in data["workspaceOrError"]["locationEntries"]} == {
            ("zombie_pipeline", "LOADED")
        }
        assert data["runsOrError"]["count"] == deployment.instance.get_runs_count()  # the same PostgreSQL
    finally:
        pids = server.stop()
        assert [pid for pid in pids if processes.pid_alive(pid)] == []
