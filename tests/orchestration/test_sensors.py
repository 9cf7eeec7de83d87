"""Sensors: evaluated as the daemon would, against the real server and a real Dagster instance."""

import datetime as dt
import json

import dagster as dg
import pytest

from tests.helpers import (
    METRICS_OFF,
    crashed_job,
    databases_from_env,
    found,
    healthy_job,
    job_document,
    recorded_cleanup_run,
    run_kill_zombies,
)
from tests.servers import QuietHandler, http_server
from zombie_pipeline.config import CACHE_URL_ENV, CLEANUP_OVERDUE_MINUTES_ENV, QUEUE_URL_ENV
from zombie_pipeline.orchestration import recency
from zombie_pipeline.orchestration.cleanup import kill_zombies_job
from zombie_pipeline.orchestration.health import queue_health
from zombie_pipeline.orchestration.resources import FailureWebhook, ZombiePolicyResource, url_from_env
from zombie_pipeline.orchestration.sensors import (
    cleanup_checks_sensor,
    cleanup_overdue_sensor,
    job_types_sensor,
    pipeline_failure_sensor,
    stale_jobs_sensor,
)
from zombie_pipeline.orchestration.tags import CLEANUP_RUN_TAG, JOB_TYPE_PARTITIONS, QUEUE_DATABASE_TAG, STALE_COUNT_TAG
from zombie_pipeline.queue.documents import ID, Failure, Job, Status, utc_now
from zombie_pipeline.simulation.embedded import free_port

WEBHOOK_ENV = "ZOMBIE_TEST_FAILURE_WEBHOOK_URL"


def webhook_from_env() -> FailureWebhook:
    """The failure webhook as the deployment builds it: its URL from the environment, if set."""
    return FailureWebhook(url=url_from_env(WEBHOOK_ENV), timeout_seconds=2)


@pytest.fixture
def resources(mongo_url, queue_db, cache_db, monkeypatch):
    monkeypatch.setenv(QUEUE_URL_ENV, mongo_url)
    monkeypatch.setenv(CACHE_URL_ENV, mongo_url)
    monkeypatch.delenv(WEBHOOK_ENV, raising=False)
    return {
        "databases": databases_from_env(queue_db.name, cache_db.name),
        "zombie_policy": ZombiePolicyResource(),
        "failure_webhook": webhook_from_env(),
        **METRICS_OFF,
    }


@pytest.fixture
def instance():
    """In memory: runs, event logs and dynamic partitions as the daemon's instance keeps them."""
    return dg.DagsterInstance.ephemeral()


def tick(sensor, instance, resources):
    return sensor.evaluate_tick(
        dg.build_sensor_context(instance=instance, resources=resources, sensor_name=sensor.name)
    )


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


# --- cleanup_checks_sensor -------------------------------------------------------------


def _finished_cleanup(instance, resources, dry_run=False):
    result = kill_zombies_job.execute_in_process(
        instance=instance,
        resources={name: resources[name] for name in ("databases", "zombie_policy", "metrics_gateway")},
        run_config={"ops": {"reconcile": {"config": {"dry_run": dry_run}}}},
    )
    assert result.success
    return result.run_id


def _status_context(instance, run_id, event_type, sensor_name, resources=None):
    [record] = instance.get_records_for_run(run_id, of_type=event_type).records
    return dg.build_run_status_sensor_context(
        sensor_name=sensor_name,
        dagster_event=record.event_log_entry.dagster_event,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run_id),
        resources=resources,
    )


def test_checks_run_after_each_successful_cleanup_tagged_with_its_run(store, instance, resources):
    store.jobs.insert_one(crashed_job())
    run_id = _finished_cleanup(instance, resources)
    context = _status_context(instance, run_id, dg.DagsterEventType.RUN_SUCCESS, cleanup_checks_sensor.name)
    request = cleanup_checks_sensor(context)
    assert isinstance(request, dg.RunRequest)
    assert request.tags[CLEANUP_RUN_TAG] == run_id
    assert run_id in found(request.run_key)


def test_checks_are_not_run_after_a_dry_run(store, instance, resources):
    store.jobs.insert_one(crashed_job())
    run_id = _finished_cleanup(instance, resources, dry_run=True)
    context = _status_context(instance, run_id, dg.DagsterEventType.RUN_SUCCESS, cleanup_checks_sensor.name)
    assert isinstance(cleanup_checks_sensor(context), dg.SkipReason)


# --- pipeline_failure_sensor ---------------------------------------------------------------


class _Webhook(QuietHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Webhook.received.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(204)
        self.end_headers()


@pytest.fixture
def webhook():
    _Webhook.received = []
    with http_server(_Webhook) as port:
        yield f"http://127.0.0.1:{port}/hooks/t0ken", _Webhook.received


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
    context = _status_context(
        instance, run_id, dg.DagsterEventType.RUN_FAILURE, pipeline_failure_sensor.name, resources
    )
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


# --- cleanup_overdue_sensor ------------------------------------------------------------------


def overdue_tick(instance, resources, cursor=None):
    context = dg.build_sensor_context(
        instance=instance, resources={"failure_webhook": resources["failure_webhook"]}, cursor=cursor,
        sensor_name=cleanup_overdue_sensor.name,
    )  # fmt: skip
    return cleanup_overdue_sensor.evaluate_tick(context)


def cursor_watching_since(minutes_ago: float, reported: str) -> str:
    since = utc_now() - dt.timedelta(minutes=minutes_ago)
    return json.dumps({"watching_since": since.isoformat(), "reported": reported})


def reported_check(result) -> dg.AssetCheckEvaluation:
    [evaluation] = result.asset_events
    assert (evaluation.asset_key, evaluation.check_name) == (queue_health.key, "cleanups_are_recent")
    return evaluation


def successful_cleanup(instance, resources) -> str:
    result = run_kill_zombies({name: resources[name] for name in ("databases", "zombie_policy")}, instance=instance)
    assert result.success
    return result.run_id


def test_a_queue_never_cleaned_is_given_the_limit_from_the_sensors_first_tick(instance, resources):
    first = overdue_tick(instance, resources)
    evaluation = reported_check(first)
    assert evaluation.passed
    assert "no successful cleanup" in found(evaluation.description) and "limit 30 min" in found(evaluation.description)
    again = overdue_tick(instance, resources, first.cursor)
    assert (
        again.asset_events == []
        and json.loads(again.cursor)["watching_since"] == json.loads(first.cursor)["watching_since"]
    )


def test_no_successful_cleanup_within_the_limit_fails_the_check_and_posts_the_webhook_once(
    instance, resources, webhook, monkeypatch
):
    url, received = webhook
    monkeypatch.setenv(WEBHOOK_ENV, url)
    resources["failure_webhook"] = webhook_from_env()
    overdue = overdue_tick(instance, resources, cursor_watching_since(31, reported="recent"))
    evaluation = reported_check(overdue)
    assert not evaluation.passed and evaluation.metadata["limit_minutes"].value == 30
    [(_, _, body)] = received
    assert body["alert"] == "cleanup_overdue" and body["queue_database"] == kill_zombies_job.tags[QUEUE_DATABASE_TAG]
    assert "no successful cleanup" in body["text"]

    still = overdue_tick(instance, resources, overdue.cursor)
    assert still.asset_events == [] and "no successful cleanup" in still.skip_message
    assert len(received) == 1  # told once per episode


def test_a_successful_cleanup_passes_the_check_again_and_its_age_is_judged_against_the_limit(
    store, instance, resources
):
    store.jobs.insert_one(crashed_job())
    run_id = successful_cleanup(instance, resources)
    recovered = reported_check(overdue_tick(instance, resources, cursor_watching_since(90, reported="overdue")))
    assert recovered.passed and recovered.metadata["last_successful_cleanup_run"].value == run_id

    later = recency.cleanup_recency(instance, utc_now() + dt.timedelta(minutes=31), limit_minutes=30)
    assert later.overdue and later.last_success_run_id == run_id and "OVERDUE" in later.message()
    assert not recency.cleanup_recency(instance, utc_now() + dt.timedelta(minutes=29), limit_minutes=30).overdue
    # a success of another queue database's cleanup says nothing about this one
    assert recency.cleanup_recency(instance, utc_now(), 30, queue_database="another_queue").last_success_run_id is None


def test_the_limit_comes_from_the_environment_and_a_bad_one_names_the_variable(instance, resources, monkeypatch):
    monkeypatch.setenv(CLEANUP_OVERDUE_MINUTES_ENV, "5")
    overdue = reported_check(overdue_tick(instance, resources, cursor_watching_since(6, reported="recent")))
    assert not overdue.passed and "limit 5 min" in found(overdue.description)
    monkeypatch.setenv(CLEANUP_OVERDUE_MINUTES_ENV, "half an hour")
    with pytest.raises(
        Exception, match=f"{CLEANUP_OVERDUE_MINUTES_ENV}='half an hour' is not a positive number of minutes"
    ):
        overdue_tick(instance, resources)
