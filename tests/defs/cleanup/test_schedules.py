"""Schedules: what they request and when (and when not), and a bad cron refused when the code location loads."""

import datetime as dt
import os
import subprocess
import sys
import time

import dagster as dg
import pytest

from tests.helpers import crashed_job, documents, found, opcounters, recorded_cleanup_run
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    KILL_CRON_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
    SettingError,
)
from zombie_pipeline.definitions import defs
from zombie_pipeline.defs.cleanup.jobs import (
    IN_FLIGHT_STATUSES,
    cleanup_in_flight,
    in_flight_reason,
    kill_zombies_job,
)
from zombie_pipeline.defs.cleanup.schedules import (
    DEFAULT_KILL_CRON,
    build_kill_zombies_schedule,
    kill_zombies_cron,
)
from zombie_pipeline.defs.tags import QUEUE_DATABASE_TAG, TRIGGER_TAG

UTC = dt.UTC
BAD_CRONS = ["*/10 * * *", "61 * * * *", "every ten minutes", "every 10 minutes", "* * * * * * *", "*/0 * * * *"]


def test_the_cleanup_runs_every_ten_minutes_by_default():
    assert kill_zombies_cron({}) == DEFAULT_KILL_CRON == "*/10 * * * *"
    assert kill_zombies_cron({KILL_CRON_ENV: "  "}) == DEFAULT_KILL_CRON
    schedule = defs.resolve_schedule_def("kill_zombies_schedule")
    assert schedule.cron_schedule == DEFAULT_KILL_CRON
    assert schedule.execution_timezone == "UTC"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED


@pytest.mark.parametrize("cron", ["*/2 * * * *", "*/5 * * * *"])
def test_the_cleanup_cron_comes_from_the_environment(cron):
    assert kill_zombies_cron({KILL_CRON_ENV: cron}) == cron
    assert build_kill_zombies_schedule(cron).cron_schedule == cron


@pytest.mark.parametrize("cron", BAD_CRONS)
def test_an_invalid_cron_is_refused_with_the_variable_named(cron):
    with pytest.raises(SettingError) as raised:
        build_kill_zombies_schedule(cron)
    message = str(raised.value)
    assert KILL_CRON_ENV in message and repr(cron) in message and "five fields" in message


def test_an_invalid_cron_stops_the_code_location_from_loading_and_touches_no_database(store, mongo_url):
    store.jobs.insert_many([crashed_job("u/z1")])
    before = documents(store)
    client = store.jobs.database.client
    counters = opcounters(client)
    env = {
        **os.environ,
        KILL_CRON_ENV: "every 10 minutes",
        QUEUE_URL_ENV: mongo_url,
        CACHE_URL_ENV: mongo_url,
        QUEUE_DATABASE_ENV: store.jobs.database.name,
        CACHE_DATABASE_ENV: store.cache.database.name,
    }
    result = subprocess.run(
        [sys.executable, "-c", "import zombie_pipeline.definitions"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert f"{KILL_CRON_ENV}='every 10 minutes' is not a valid cron schedule" in result.stderr
    assert opcounters(client) == counters
    assert documents(store) == before


@pytest.fixture
def instance():
    """Persistent, as the daemon's is: a schedule's context opens the instance from its reference."""
    with dg.instance_for_test() as instance:
        yield instance


def cleanup_tick(instance: dg.DagsterInstance):
    schedule = defs.resolve_schedule_def("kill_zombies_schedule")
    context = dg.build_schedule_context(
        instance=instance, scheduled_execution_time=dt.datetime(2024, 3, 5, 10, 20, tzinfo=UTC)
    )
    return schedule.evaluate_tick(context)


def test_a_cleanup_tick_requests_one_run_over_every_job_type(instance):
    schedule = defs.resolve_schedule_def("kill_zombies_schedule")
    [request] = cleanup_tick(instance).run_requests
    assert request.partition_key is None
    assert request.tags[TRIGGER_TAG] == "kill_zombies_schedule"
    assert schedule.job_name == kill_zombies_job.name


def test_the_statistics_run_daily_for_the_day_that_just_ended():
    schedule = defs.resolve_schedule_def("duration_stats_schedule")
    assert schedule.cron_schedule == "30 0 * * *"
    assert schedule.job_name == "duration_statistics_job"
    context = dg.build_schedule_context(
        scheduled_execution_time=dt.datetime(2024, 3, 5, 0, 30, tzinfo=UTC), repository_def=defs.get_repository_def()
    )
    [request] = found(schedule.evaluate_tick(context).run_requests)
    assert request.partition_key == "2024-03-04"


@pytest.mark.parametrize("status", IN_FLIGHT_STATUSES, ids=lambda status: status.value)
def test_a_cleanup_tick_skips_naming_the_cleanup_of_its_queue_that_is_queued_or_running(instance, status):
    run = recorded_cleanup_run(instance, status)
    result = cleanup_tick(instance)
    assert result.run_requests == []
    assert run.run_id in result.skip_message and status.value.lower() in result.skip_message
    assert repr(kill_zombies_job.tags[QUEUE_DATABASE_TAG]) in result.skip_message


def test_a_cleanup_tick_is_not_held_by_finished_cleanups_nor_by_a_cleanup_of_another_queue(instance):
    for status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
        recorded_cleanup_run(instance, status)
    recorded_cleanup_run(instance, dg.DagsterRunStatus.STARTED, queue_database="another_queue")
    [request] = cleanup_tick(instance).run_requests
    assert request.tags[TRIGGER_TAG] == "kill_zombies_schedule"


def entered(instance: dg.DagsterInstance, run: dg.DagsterRun, status: dg.DagsterRunStatus) -> None:
    """What the run queue records when a run enters ``status``: its enqueueing, or its launch."""
    if status == dg.DagsterRunStatus.QUEUED:
        instance.report_dagster_event(dg.DagsterEvent.job_enqueue(run), run.run_id)
    elif status == dg.DagsterRunStatus.STARTING:
        event = dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_STARTING.value, job_name=run.job_name)
        instance.report_dagster_event(event, run.run_id)


WAITING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING]


@pytest.mark.parametrize("status", WAITING, ids=lambda status: status.value)
def test_a_cleanup_that_has_not_started_holds_the_ticks_back_for_the_instances_start_timeout_only(status):
    """Counted from when it entered its state, as run monitoring counts it; 180 s, Dagster's default, unless the
    instance sets run_monitoring.start_timeout_seconds."""
    with dg.instance_for_test(
        overrides={"run_monitoring": {"enabled": True, "start_timeout_seconds": 240}}
    ) as instance:
        run = recorded_cleanup_run(instance, dg.DagsterRunStatus.NOT_STARTED)
        entered(instance, run, status)
        since = found(instance.get_run_record_by_id(run.run_id)).create_timestamp.timestamp()
        assert found(instance.get_run_by_id(run.run_id)).status == status

        assert found(cleanup_in_flight(instance, now=since + 230)).dagster_run.run_id == run.run_id
        assert cleanup_in_flight(instance, now=since + 250) is None
        reason = in_flight_reason(found(cleanup_in_flight(instance)), instance)
        assert run.run_id in reason and "240 s at most" in reason
    with dg.instance_for_test() as instance:
        run = recorded_cleanup_run(instance, dg.DagsterRunStatus.NOT_STARTED)
        entered(instance, run, status)
        since = found(instance.get_run_record_by_id(run.run_id)).create_timestamp.timestamp()
        assert cleanup_in_flight(instance, now=since + 170) is not None
        assert cleanup_in_flight(instance, now=since + 190) is None


def test_a_running_cleanup_holds_the_ticks_back_past_the_start_timeout_until_run_monitoring_ends_it(instance):
    run = recorded_cleanup_run(instance, dg.DagsterRunStatus.STARTED)
    since = found(instance.get_run_record_by_id(run.run_id)).create_timestamp.timestamp()
    assert found(cleanup_in_flight(instance, now=since + 3600)).dagster_run.run_id == run.run_id


def test_a_tick_after_the_start_timeout_asks_for_a_cleanup_though_one_is_still_starting():
    """The schedule as the daemon evaluates it, a second after a launch that never started a cleanup."""
    with dg.instance_for_test(overrides={"run_monitoring": {"enabled": True, "start_timeout_seconds": 1}}) as instance:
        stuck = recorded_cleanup_run(instance, dg.DagsterRunStatus.NOT_STARTED)
        entered(instance, stuck, dg.DagsterRunStatus.STARTING)
        time.sleep(1.5)
        assert found(instance.get_run_by_id(stuck.run_id)).status == dg.DagsterRunStatus.STARTING
        [request] = cleanup_tick(instance).run_requests
        assert request.tags[TRIGGER_TAG] == "kill_zombies_schedule"
