"""The failure sensor, evaluated as the daemon would, against the real server and a real Dagster instance."""

import dagster as dg

from tests.defs.ticks import WEBHOOK_ENV, status_context, webhook_from_env
from tests.helpers import (
    crashed_job,
)
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.failures.sensors import pipeline_failure_sensor
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.queue.audit_documents import Failure
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import ID

# --- pipeline_failure_sensor ---------------------------------------------------------------


def _braked_cleanup(store, instance, resources):
    """Every started job looks dead: the brake stops the run in find_zombies."""
    store.jobs.insert_many([crashed_job(f"user/{i}") for i in range(3)])
    braked = {**resources, "zombie_policy": ZombiePolicyResource(min_started_for_brake=1)}
    result = kill_zombies_job.execute_in_process(
        instance=instance,
        resources={name: braked[name] for name in ("databases", "zombie_policy", "metrics_gateway")},
        raise_on_error=False,
    )
    assert not result.success
    return result.run_id


def _failure_context(instance, run_id, resources):
    context = status_context(instance, run_id, dg.DagsterEventType.RUN_FAILURE, pipeline_failure_sensor.name, resources)
    return context.for_run_failure()


def test_a_failed_run_is_recorded_and_posted_to_the_webhook(store, instance, resources, webhook, monkeypatch):
    url, received = webhook
    monkeypatch.setenv(WEBHOOK_ENV, url)
    resources["failure_webhook"] = webhook_from_env()
    run_id = _braked_cleanup(store, instance, resources)
    pipeline_failure_sensor(_failure_context(instance, run_id, resources))

    record = store.failures.find_one({ID: run_id})
    assert record[Failure.JOB_NAME] == kill_zombies_job.name
    assert record[Failure.FAILED_STEPS] == ["find_zombies"]
    assert "brake engaged" in record[Failure.MESSAGE]
    assert record[Failure.WEBHOOK_OUTCOME] == "sent (HTTP 204)"
    [(path, content_type, body)] = received
    assert (path, content_type) == ("/hooks/t0ken", "application/json")
    assert body["run_id"] == run_id and body[Failure.FAILED_STEPS] == ["find_zombies"]
    assert "brake engaged" in body["text"] and kill_zombies_job.name in body["text"]


def test_evaluating_the_same_failure_twice_leaves_one_record(store, instance, resources):
    run_id = _braked_cleanup(store, instance, resources)
    for _ in range(2):
        pipeline_failure_sensor(_failure_context(instance, run_id, resources))
    assert store.failures.count_documents({}) == 1
    assert store.failures.find_one({ID: run_id})[Failure.WEBHOOK_OUTCOME] == "not configured"


def test_an_unreachable_webhook_is_recorded_not_raised_and_its_token_not_shown(store, instance, resources, monkeypatch):
    monkeypatch.setenv(WEBHOOK_ENV, f"http://127.0.0.1:{free_port()}/hooks/s3cret-t0ken")
    resources["failure_webhook"] = webhook_from_env()
    run_id = _braked_cleanup(store, instance, resources)
    pipeline_failure_sensor(_failure_context(instance, run_id, resources))
    outcome = store.failures.find_one({ID: run_id})[Failure.WEBHOOK_OUTCOME]
    assert outcome.startswith("failed:")
    assert "s3cret-t0ken" not in outcome
