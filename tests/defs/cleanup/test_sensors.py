"""The cleanup's sensors, evaluated as the daemon would, against the real server and a real Dagster instance."""

import dagster as dg
import pytest

from tests.defs.ticks import tick
from tests.helpers import (
    crashed_job,
    databases_from_env,
    healthy_job,
    job_document,
    recorded_cleanup_run,
)
from zombie_pipeline.config import QUEUE_URL_ENV
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.cleanup.sensors import job_types_sensor, stale_jobs_sensor
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.defs.tags import JOB_TYPE_PARTITIONS, STALE_COUNT_TAG
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import Job, Status

# --- stale_jobs_sensor -----------------------------------------------------------------


def test_stale_sensor_skips_when_every_started_job_is_alive(store, instance, resources):
    store.jobs.insert_many([healthy_job(), job_document(status=Status.WAITING)])
    result = tick(stale_jobs_sensor, instance, resources)
    assert result.run_requests == []
    assert "no started job" in result.skip_message


def test_stale_sensor_requests_one_unpartitioned_cleanup_keyed_by_the_stale_state(store, instance, resources):
    store.jobs.insert_many([crashed_job("user/a"), crashed_job("user/b"), healthy_job()])
    first = tick(stale_jobs_sensor, instance, resources)
    again = tick(stale_jobs_sensor, instance, resources)
    [request] = first.run_requests
    assert request.job_name in (None, kill_zombies_job.name)
    assert request.partition_key is None  # every type
    assert request.tags[STALE_COUNT_TAG] == "2"
    assert [r.run_key for r in again.run_requests] == [request.run_key]  # same state, same key: launched once

    store.jobs.insert_one(crashed_job("user/c"))
    [changed] = tick(stale_jobs_sensor, instance, resources).run_requests
    assert changed.run_key != request.run_key


def test_stale_sensor_judges_with_the_policy_resource(store, instance, resources):
    store.jobs.insert_one(crashed_job())
    patient = ZombiePolicyResource(heartbeat_timeout_seconds=3_600, max_duration_seconds=7_200)
    result = tick(stale_jobs_sensor, instance, {**resources, "zombie_policy": patient})
    assert result.run_requests == []


@pytest.mark.parametrize(
    "status", [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTED], ids=lambda status: status.value
)
def test_stale_sensor_waits_while_a_cleanup_of_its_queue_is_queued_or_running(store, instance, resources, status):
    store.jobs.insert_one(crashed_job())
    run = recorded_cleanup_run(instance, status)
    result = tick(stale_jobs_sensor, instance, resources)
    assert result.run_requests == []
    assert run.run_id in result.skip_message and "1 stale jobs" in result.skip_message


def test_stale_sensor_is_not_held_by_a_cleanup_of_another_queue(store, instance, resources):
    store.jobs.insert_one(crashed_job())
    recorded_cleanup_run(instance, dg.DagsterRunStatus.STARTED, queue_database="another_queue")
    [request] = tick(stale_jobs_sensor, instance, resources).run_requests
    assert request.tags[STALE_COUNT_TAG] == "1"


def test_stale_sensor_fails_the_tick_with_a_clean_message_when_the_queue_is_unreachable(
    instance, resources, monkeypatch
):
    monkeypatch.setenv(QUEUE_URL_ENV, f"mongodb://user:s3cret@127.0.0.1:{free_port()}/?directConnection=true")
    broken = {**resources, "databases": databases_from_env("q", "c", timeout_ms=300)}
    with pytest.raises(Exception) as raised:
        tick(stale_jobs_sensor, instance, broken)
    assert "cannot reach MongoDB" in str(raised.value)
    assert "s3cret" not in str(raised.value)


# --- job_types_sensor ------------------------------------------------------------------


def test_job_types_sensor_registers_each_type_once(store, instance, resources):
    store.jobs.insert_many(
        [
            healthy_job(job_type="/splits"),
            crashed_job(job_type="/first-rows"),
            job_document(job_type="/splits", status=Status.SUCCESS),
        ]
    )
    first = tick(job_types_sensor, instance, resources)
    [request] = first.dynamic_partitions_requests
    assert request.partitions_def_name == JOB_TYPE_PARTITIONS.name
    assert sorted(request.partition_keys) == ["/first-rows", "/splits"]

    instance.add_dynamic_partitions(JOB_TYPE_PARTITIONS.name, list(request.partition_keys))  # what the daemon does
    assert tick(job_types_sensor, instance, resources).dynamic_partitions_requests == []

    store.jobs.insert_one(job_document(job_type="/parquet", status=Status.WAITING))
    [added] = tick(job_types_sensor, instance, resources).dynamic_partitions_requests
    assert list(added.partition_keys) == ["/parquet"]


def test_job_types_sensor_skips_types_that_cannot_be_partition_keys(store, instance, resources):
    store.jobs.insert_many(
        [job_document(job_type=name) for name in ("/splits", "a.b", "$where", "tab\there", "")]
        + [{Job.TYPE: 7, Job.STATUS: Status.WAITING}]
    )
    [request] = tick(job_types_sensor, instance, resources).dynamic_partitions_requests
    assert list(request.partition_keys) == ["/splits"]
