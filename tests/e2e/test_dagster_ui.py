"""End to end: ``dagster dev`` on simulated data, driven through its GraphQL API as the UI drives it.

One ``dagster dev`` (temporary DAGSTER_HOME, free port) serves the module; the
queue and cache are fresh databases on the session's server. Each test adds
the zombies it needs, so each stands alone. Every process started here is
stopped by PID when the module ends, and the test checks none is left.
"""

import uuid

import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from tests.e2e import harness
from tests.helpers import ago, job_document, workload
from tests.servers import fresh_databases, on_real_mongodb
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    HOME_ENV,
    KILL_CRON_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
    WEBHOOK_URL_ENV,
)
from zombie_pipeline.defs.tags import CLEANUP_RUN_TAG, TRIGGER_TAG
from zombie_pipeline.queue.cache import Cache, ErrorCode, cache_key_of_job
from zombie_pipeline.queue.connections import client_for
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.simulator import simulate

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def simulated(mongo_url):
    with fresh_databases(client_for(mongo_url), drop=on_real_mongodb()) as make:
        store = Store.of(make("e2e_queue"), make("e2e_cache"))
        store.ensure_indexes()
        simulation = simulate(
            store, workload(finished=150, crashed=4, never_heartbeated=2, overdue=2, running=20, waiting=10, seed=11)
        )
        yield store, simulation


@pytest.fixture(scope="module")
def store(simulated):
    return simulated[0]


@pytest.fixture(scope="module")
def dev(store, mongo_url, tmp_path_factory):
    base = tmp_path_factory.mktemp("dagster_dev")
    env = {
        QUEUE_URL_ENV: mongo_url,
        CACHE_URL_ENV: mongo_url,
        QUEUE_DATABASE_ENV: store.jobs.database.name,
        CACHE_DATABASE_ENV: store.cache.database.name,
        HOME_ENV: str(base / "zombie_pipeline_home"),
        KILL_CRON_ENV: "",
        WEBHOOK_URL_ENV: "",
        **harness.watcher_off(base),  # the cleanups launched here find their zombies (tests/e2e/test_watch_dev.py: on)
    }
    dev = harness.DagsterDev(base / "dagster_home", free_port(), env)
    try:
        yield dev.start()
    except Exception:
        print(dev.log_tail())
        raise
    finally:
        pids = dev.stop()
        assert dev.alive(pids) == [], "processes of dagster dev survived the stop"


@pytest.fixture(scope="module")
def client(dev):
    return DagsterGraphQLClient("127.0.0.1", port_number=dev.port, timeout=60)


def add_zombies(store: Store, job_type: str, count: int) -> list:
    jobs = [
        job_document(
            job_type=job_type, dataset=f"e2e/{uuid.uuid4().hex[:8]}", started_at=ago(1_000), last_heartbeat=ago(900)
        )
        for _ in range(count)
    ]
    store.jobs.insert_many(jobs)
    return [job[ID] for job in jobs]


def workers_beat(store: Store, simulation) -> None:
    """The simulated healthy workers are alive: without a beat they would turn stale (and trip the brake) mid-module."""
    store.jobs.update_many(
        {ID: {"$in": simulation.running_ids}, Job.STATUS: Status.STARTED}, {"$set": {Job.LAST_HEARTBEAT: utc_now()}}
    )


def status_of(store: Store, ids: list) -> set:
    return {job[Job.STATUS] for job in store.jobs.find({ID: {"$in": ids}}, {Job.STATUS: 1})}


def wait_for_client_run(client: DagsterGraphQLClient, run_id: str, timeout: float = 150) -> str:
    def finished():
        try:
            status = client.get_run_status(run_id).value
        except DagsterGraphQLClientError:
            return None
        return status if status in harness.FINISHED else None

    return harness.wait_for(f"run {run_id}", finished, timeout)


def checks_of_latest_health(dev) -> dict:
    data = dev.graphql(
        'query { assetNodes(assetKeys: [{path: ["queue_health"]}]) { assetChecksOrError { ... on AssetChecks '
        "{ checks { name executionForLatestMaterialization { runId status } } } } } }"
    )
    checks = data["assetNodes"][0]["assetChecksOrError"]["checks"]
    return {check["name"]: check["executionForLatestMaterialization"] for check in checks}


def test_kill_zombies_job_launched_through_graphql_finalizes_every_zombie_then_the_checks_pass(dev, client, simulated):
    store, simulation = simulated
    workers_beat(store, simulation)
    zombies = add_zombies(store, "/splits", 2) + simulation.zombie_ids
    healthy = simulation.running_ids
    run_id = client.submit_job_execution(
        "kill_zombies_job", repository_location_name=harness.LOCATION, repository_name=harness.REPOSITORY, run_config={}
    )
    assert wait_for_client_run(client, run_id) == "SUCCESS"

    assert status_of(store, zombies) == {Status.ERROR}
    assert status_of(store, healthy) == {Status.STARTED}
    for job in store.jobs.find({ID: {"$in": zombies}}):
        expected = ErrorCode.EXCEEDED_MAX_DURATION if job[ID] in simulation.overdue_ids else ErrorCode.CRASHED
        assert store.cache.find_one(cache_key_of_job(job))[Cache.ERROR_CODE] == expected

    # cleanup_checks_sensor (running by default) runs queue_health and its checks for this cleanup
    [health_run] = harness.wait_for(
        "the checks run after the cleanup",
        lambda: harness.runs(dev, "queue_health_job", {CLEANUP_RUN_TAG: run_id}),
        timeout=120,
        interval=2,
    )
    assert harness.wait_for_run(dev, health_run["runId"]) == "SUCCESS"
    checks = harness.wait_for(
        "check results",
        lambda: (
            (c := checks_of_latest_health(dev)) and all(e and e["status"] != "IN_PROGRESS" for e in c.values()) and c
        ),
        timeout=30,
    )
    assert {name: e["status"] for name, e in checks.items()} == {
        "no_zombies_left": "SUCCEEDED",
        "zombies_have_cache_errors": "SUCCEEDED",
        "cleanups_are_recent": "SUCCEEDED",  # the cleanup it follows has just succeeded
        "compensations_succeed": "SUCCEEDED",
    }


def test_a_backfill_over_two_job_types_cleans_only_those_types(dev, simulated):
    store, simulation = simulated
    workers_beat(store, simulation)
    splits, first_rows, parquet = (
        add_zombies(store, job_type, 2) for job_type in ("/splits", "/first-rows", "/parquet")
    )
    # job_types_sensor (running by default) registered the types of the simulated queue as partitions
    partitions = harness.wait_for(
        "job_types partitions", lambda: set(partition_names(dev)) >= {"/splits", "/first-rows"}, 90
    )
    assert partitions
    result = dev.graphql(
        "mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) { __typename "
        "... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }",
        {
            "params": {
                "selector": {
                    "partitionSetName": "kill_zombies_job_partition_set",
                    "repositorySelector": harness.repository_selector(),
                },
                "partitionNames": ["/splits", "/first-rows"],
                "runConfigData": {},  # as the UI sends it; the backfill daemon submits the runs
            }
        },
    )["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    backfill = harness.wait_for(
        "the backfill to complete",
        lambda: (b := backfill_state(dev, result["backfillId"]))["status"].startswith("COMPLETED") and b,
        180,
        2,
    )
    assert backfill["status"] == "COMPLETED_SUCCESS"
    assert {p["partitionName"]: p["runStatus"] for p in backfill["partitionStatuses"]["results"]} == {
        "/splits": "SUCCESS",
        "/first-rows": "SUCCESS",
    }
    assert status_of(store, splits + first_rows) == {Status.ERROR}
    assert status_of(store, parquet) == {Status.STARTED}  # not in the backfill


def test_the_stale_jobs_sensor_once_started_launches_a_cleanup(dev, simulated):
    store, simulation = simulated
    workers_beat(store, simulation)
    zombies = add_zombies(store, "/sizes", 3)
    selector = {**harness.repository_selector(), "sensorName": "stale_jobs_sensor"}
    started = dev.graphql(
        "mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename ... on Sensor { sensorState { status } } } }",
        {"s": selector},
    )["startSensor"]
    assert started["sensorState"]["status"] == "RUNNING"
    try:
        [run] = harness.wait_for(
            "a run launched by stale_jobs_sensor",
            lambda: harness.runs(dev, "kill_zombies_job", {TRIGGER_TAG: "stale_jobs_sensor"}),
            timeout=90,
            interval=2,
        )
    finally:
        # back to its default (stopped): no further cleanup while the module ends
        dev.graphql("mutation($s: SensorSelector!) { resetSensor(sensorSelector: $s) { __typename } }", {"s": selector})
    assert {"key": "dagster/sensor_name", "value": "stale_jobs_sensor"} in run["tags"]
    assert harness.wait_for_run(dev, run["runId"], timeout=180) == "SUCCESS"
    assert status_of(store, zombies) == {Status.ERROR}
    # leave no run behind: the checks run that follows this cleanup finishes too
    harness.wait_for(
        "every run to finish", lambda: all(r["status"] in harness.FINISHED for r in harness.runs(dev)), 150, 2
    )


def partition_names(dev) -> list[str]:
    data = dev.graphql(
        'query($r: RepositorySelector!) { partitionSetsOrError(repositorySelector: $r, pipelineName: "kill_zombies_job") '
        "{ ... on PartitionSets { results { name partitionsOrError { ... on Partitions { results { name } } } } } } }",
        {"r": harness.repository_selector()},
    )
    [partition_set] = data["partitionSetsOrError"]["results"]
    return [p["name"] for p in partition_set["partitionsOrError"]["results"]]


def backfill_state(dev, backfill_id: str) -> dict:
    state = dev.graphql(
        "query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename ... on PartitionBackfill { status "
        "partitionStatuses { results { partitionName runStatus } } } ... on PythonError { message } } }",
        {"id": backfill_id},
    )["partitionBackfillOrError"]
    if state["__typename"] != "PartitionBackfill":
        raise RuntimeError(f"backfill {backfill_id}: {state}")
    return state
