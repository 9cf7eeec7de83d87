"""kill_zombies_job through Dagster: the ops, their metadata, dry run, brake, bad policy, partitions."""

import dagster as dg
import pytest

from zombie_pipeline.documents import ID, Event, EventState, Job, Status
from zombie_pipeline.orchestration.jobs import kill_zombies_job
from zombie_pipeline.orchestration.partitions import JOB_TYPE_PARTITIONS
from zombie_pipeline.orchestration.resources import CacheDatabase, QueueDatabase, ZombiePolicyResource
from zombie_pipeline.simulate import Workload, job_document, simulate, utc_now

WORKLOAD = Workload(finished=150, crashed=8, never_heartbeated=3, overdue=3, running=20, waiting=5, seed=11)
URL_ENV = "ZOMBIE_TEST_JOBS_URL"


@pytest.fixture
def resources(store, mongo_url, monkeypatch):
    monkeypatch.setenv(URL_ENV, mongo_url)
    return {
        "queue_db": QueueDatabase(url_env_var=URL_ENV, database=store.jobs.database.name),
        "cache_db": CacheDatabase(url_env_var=URL_ENV, database=store.cache.database.name),
        "zombie_policy": ZombiePolicyResource(),
    }


def run(resources, instance=None, partition_key=None, **config):
    run_config = {"ops": {"reconcile": {"config": config}}} if config else None
    with dg.instance_for_test() as test_instance:
        instance = instance or test_instance
        if partition_key:
            instance.add_dynamic_partitions(JOB_TYPE_PARTITIONS.name, [partition_key])
        return kill_zombies_job.execute_in_process(
            run_config=run_config, resources=resources, instance=instance, partition_key=partition_key, raise_on_error=False
        )


def metadata_of(result, step: str) -> dict:
    [event] = [e for e in result.events_for_node(step) if e.event_type_value == "STEP_OUTPUT"]
    return {key: value.value for key, value in event.step_output_data.metadata.items()}


def test_the_job_finalizes_the_zombies_and_reports_them_in_its_metadata(store, resources):
    simulation = simulate(store.jobs.database, store.cache.database, WORKLOAD)
    result = run(resources)
    assert result.success
    summary = metadata_of(result, "summarize")
    assert summary["finalized"] == 14
    assert summary["reason/missing_heartbeat"] == 8
    assert summary["reason/never_heartbeated"] == 3
    assert summary["reason/exceeded_max_duration"] == 3
    assert summary["lost_to_live_worker"] == 0
    assert summary["cache_written"] == 14
    assert len(summary["finalized_jobs"].records) == 14
    assert "finalized 14 zombies" in summary["summary"]
    assert metadata_of(result, "reconcile")["policy"]["heartbeat_timeout_seconds"] == 300
    assert store.jobs.count_documents({ID: {"$in": simulation.zombie_ids}, Job.STATUS: Status.ERROR}) == 14


def test_a_dry_run_shows_the_evidence_table_and_writes_nothing(store, resources):
    simulate(store.jobs.database, store.cache.database, WORKLOAD)
    jobs_before = list(store.jobs.find())
    result = run(resources, dry_run=True)
    assert result.success
    evidence = metadata_of(result, "find_zombies")["evidence"]
    assert len(evidence.records) == 14
    assert {"reason", "age_seconds", "last_heartbeat", "threshold_seconds"} <= set(evidence.records[0].data)
    assert list(store.jobs.find()) == jobs_before
    assert store.events.count_documents({}) == 0


def test_the_brake_fails_the_run_with_its_reason_and_the_override_proceeds(store, resources):
    now = utc_now()
    store.jobs.insert_many(
        [job_document(dataset=f"u/dead-{i}", started_at=now.replace(year=now.year - 1)) for i in range(25)]
    )
    braked = run(resources)
    assert not braked.success
    failure = next(e for e in braked.all_events if e.is_step_failure)
    assert "brake engaged: 25 of 25" in failure.step_failure_data.error.message
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 25

    assert run(resources, override_brake=True).success
    assert store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 0


def test_a_bad_policy_fails_the_run_before_anything_is_read_or_written(store, resources):
    simulate(store.jobs.database, store.cache.database, WORKLOAD)
    jobs_before = list(store.jobs.find())
    resources["zombie_policy"] = ZombiePolicyResource(heartbeat_timeout_seconds=600, max_duration_seconds=300)
    result = run(resources)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "RESOURCE_INIT_FAILURE"]
    assert "max_duration_seconds (300 s) is shorter than heartbeat_timeout_seconds" in failure.event_specific_data.error.message
    assert list(store.jobs.find()) == jobs_before
    assert store.events.count_documents({}) == 0


def test_a_partitioned_run_cleans_only_its_job_type(store, resources):
    old = utc_now().replace(year=2020)
    store.jobs.insert_many(
        [job_document("/first-rows", f"u/a{i}", started_at=old) for i in range(3)]
        + [job_document("/splits", f"u/b{i}", started_at=old) for i in range(3)]
        + [job_document("/splits", f"u/live{i}", started_at=utc_now(), last_heartbeat=utc_now()) for i in range(20)]
    )
    result = run(resources, partition_key="/first-rows")
    assert result.success
    finalized_types = {event[Event.JOB][Job.TYPE] for event in store.events.find({Event.STATE: EventState.DONE})}
    assert finalized_types == {"/first-rows"}
    assert store.jobs.count_documents({Job.TYPE: "/splits", Job.STATUS: Status.STARTED}) == 23
