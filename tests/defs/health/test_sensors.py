"""The health sensors, evaluated as the daemon would: the checks after each cleanup, and cleanups overdue."""

import datetime as dt
import json

import dagster as dg
import pytest

from tests.defs.ticks import WEBHOOK_ENV, status_context, webhook_from_env
from tests.helpers import (
    crashed_job,
    found,
    run_kill_zombies,
)
from zombie_pipeline.config import CLEANUP_OVERDUE_MINUTES_ENV
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.health import recency
from zombie_pipeline.defs.health.assets import queue_health
from zombie_pipeline.defs.health.sensors import cleanup_checks_sensor, cleanup_overdue_sensor
from zombie_pipeline.defs.tags import CLEANUP_RUN_TAG, QUEUE_DATABASE_TAG
from zombie_pipeline.queue.times import utc_now

# --- cleanup_checks_sensor -------------------------------------------------------------


def _finished_cleanup(instance, resources, dry_run=False):
    result = kill_zombies_job.execute_in_process(
        instance=instance,
        resources={name: resources[name] for name in ("databases", "zombie_policy", "metrics_gateway")},
        run_config={"ops": {"plan_and_recover": {"config": {"dry_run": dry_run}}}},
    )
    assert result.success
    return result.run_id


def test_checks_run_after_each_successful_cleanup_tagged_with_its_run(store, instance, resources):
    store.jobs.insert_one(crashed_job())
    run_id = _finished_cleanup(instance, resources)
    context = status_context(instance, run_id, dg.DagsterEventType.RUN_SUCCESS, cleanup_checks_sensor.name)
    request = cleanup_checks_sensor(context)
    assert isinstance(request, dg.RunRequest)
    assert request.tags[CLEANUP_RUN_TAG] == run_id
    assert run_id in found(request.run_key)


def test_checks_are_not_run_after_a_dry_run(store, instance, resources):
    store.jobs.insert_one(crashed_job())
    run_id = _finished_cleanup(instance, resources, dry_run=True)
    context = status_context(instance, run_id, dg.DagsterEventType.RUN_SUCCESS, cleanup_checks_sensor.name)
    assert isinstance(cleanup_checks_sensor(context), dg.SkipReason)


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
