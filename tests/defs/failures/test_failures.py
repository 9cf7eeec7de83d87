"""A failed run says why, once: the cause in one line in the run, the failure record and the webhook; a refusal
(the brake, a bad policy) is never retried, a database out of reach for a moment is.

Runs execute in process on an instance with run retries on (as deploy/dagster.yaml turns them on): whether a
failed run will be retried is Dagster's own decision (``auto_reexecution_should_retry_run``), recorded on the run
as its ``dagster/will_retry`` tag, which the daemon reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.errors import DagsterUserCodeUnreachableError
from dagster._core.events import EngineEventData
from dagster._core.launcher import DefaultRunLauncher
from dagster._daemon.monitoring.run_monitoring import monitor_starting_run
from dagster._grpc.client import DagsterGrpcClient
from dagster._utils.error import serializable_error_info_from_exc_info
from pymongo.uri_parser import parse_uri

from benchmarks.proxy import DelayProxy
from tests.helpers import (
    METRICS_OFF,
    QUIET_LOGGERS,
    crashed_job,
    databases_from_env,
    found,
    healthy_job,
    recorded_cleanup_run,
)
from tests.servers import QuietHandler, http_server
from zombie_pipeline.cleanup.brake import Brake
from zombie_pipeline.config import CACHE_URL_ENV, QUEUE_URL_ENV
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.failures.causes import result_cause
from zombie_pipeline.defs.failures.sensors import failure_record, pipeline_failure_sensor
from zombie_pipeline.defs.resources import FailureWebhook, ZombiePolicyResource, url_from_env
from zombie_pipeline.defs.tags import RETRY_ON_STEP_FAILURE_TAG, WILL_RETRY_TAG
from zombie_pipeline.queue.audit_documents import Event, Failure
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.secrets import redact_url
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload

WEBHOOK_ENV = "ZOMBIE_TEST_FAILURE_WEBHOOK_URL"
#: As the production instance has them (deploy/dagster.yaml): retries on, none unless a job asks.
RUN_RETRIES = {"run_retries": {"enabled": True, "max_retries": 0}}


@pytest.fixture
def instance():
    with dg.instance_for_test(overrides=RUN_RETRIES) as instance:
        yield instance


@pytest.fixture
def resources(mongo_url, queue_db, cache_db, monkeypatch):
    monkeypatch.setenv(QUEUE_URL_ENV, mongo_url)
    monkeypatch.setenv(CACHE_URL_ENV, mongo_url)
    monkeypatch.delenv(WEBHOOK_ENV, raising=False)
    return {
        "databases": databases_from_env(queue_db.name, cache_db.name, timeout_ms=2_000),
        "zombie_policy": ZombiePolicyResource(),
        **METRICS_OFF,
    }


def cleanup(instance, resources, run_config: dict | None = None) -> dg.ExecuteInProcessResult:
    """kill_zombies_job as the Launchpad launches it, with its own tags (the retries it asks for)."""
    return kill_zombies_job.execute_in_process(
        instance=instance,
        resources=resources,
        run_config={"loggers": QUIET_LOGGERS, **(run_config or {})},
        raise_on_error=False,
    )


def attempts(result: dg.ExecuteInProcessResult, step: str) -> int:
    """How many times ``step`` started: once, plus once per retry of its retry policy."""
    return sum(1 for event in result.events_for_node(step) if event.event_type == dg.DagsterEventType.STEP_START) + sum(
        1 for event in result.events_for_node(step) if event.event_type == dg.DagsterEventType.STEP_RESTARTED
    )


def retried_run(instance, result) -> str | None:
    """Dagster's decision, on the failed run, whether run retries start it again."""
    return instance.get_run_by_id(result.run_id).tags.get(WILL_RETRY_TAG)


def failure_seen_by_the_sensor(instance, run_id: str, resources) -> dg.RunFailureSensorContext:
    """The failure sensor's context on the run's failure, as the daemon builds it."""
    [record] = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    return dg.build_run_status_sensor_context(
        sensor_name=pipeline_failure_sensor.name,
        dagster_event=record.event_log_entry.dagster_event,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run_id),
        resources={**resources, "failure_webhook": FailureWebhook(url=url_from_env(WEBHOOK_ENV), timeout_seconds=2)},
    ).for_run_failure()


def databases(resources, timeout_ms: int) -> dict:
    """``resources`` with database clients that give up on a server after ``timeout_ms``."""
    return {
        **resources,
        "databases": databases_from_env(
            resources["databases"].queue_database, resources["databases"].cache_database, timeout_ms=timeout_ms
        ),
    }


def test_a_brake_stop_fails_once_with_its_numbers_as_the_cause_everywhere_and_is_not_retried(
    store, instance, resources, monkeypatch
):
    store.jobs.insert_many([crashed_job(f"user/{i}") for i in range(15)] + [healthy_job(f"u/{i}") for i in range(10)])
    expected = Brake(stale=15, started=25, max_stale_fraction=0.5, min_started=20).message()

    result = cleanup(instance, resources)

    assert not result.success
    assert result_cause(result) == expected
    assert attempts(result, "find_zombies") == 1  # no step retry: the same queue would stop it again
    assert kill_zombies_job.tags[RETRY_ON_STEP_FAILURE_TAG] == "false" and kill_zombies_job.tags["dagster/max_retries"]
    assert retried_run(instance, result) == "false"  # and no run retry, though the job asks for 2 when a run is lost
    assert store.events.count_documents({}) == 0 and store.jobs.count_documents({Job.STATUS: Status.STARTED}) == 25

    received: list = []
    with webhook_server(received) as url:
        monkeypatch.setenv(WEBHOOK_ENV, url)
        context = failure_seen_by_the_sensor(instance, result.run_id, resources)
        record = failure_record(context, [])
        pipeline_failure_sensor(context)

    assert record.message == expected
    stored = store.failures.find_one({ID: result.run_id})
    assert stored[Failure.MESSAGE] == expected and stored[Failure.FAILED_STEPS] == ["find_zombies"]
    [body] = received
    assert body[Failure.MESSAGE] == expected
    assert body["text"].endswith(": " + expected) and "\n" not in body["text"]


def test_the_brake_on_a_simulated_queue_says_what_it_says_on_any_queue(store, instance, resources):
    """Healthy simulated jobs that nobody heartbeats look dead after the timeout, as a deployment's would whose
    heartbeats stopped arriving: the brake asks to check the heartbeats, and knows nothing of the simulator."""
    policy = ZombiePolicyResource(heartbeat_timeout_seconds=2).policy()
    simulate(
        store,
        Workload(
            finished=0, crashed=5, never_heartbeated=0, terminated=0, overdue=0, running=20, waiting=0, policy=policy
        ),
    )
    time.sleep(2.5)  # no worker beats: every healthy job is stale now

    result = cleanup(instance, {**resources, "zombie_policy": ZombiePolicyResource(heartbeat_timeout_seconds=2)})

    cause = result_cause(result)
    assert cause.startswith("brake engaged: 25 of 25 started jobs (100%) look dead")
    assert "check that the running workers' heartbeats arrive" in cause and "override_brake: true" in cause
    assert "simulat" not in cause


def test_a_bad_policy_in_the_launchpad_fails_the_first_step_in_one_line_naming_field_and_value_never_retried(
    store, instance, resources
):
    store.jobs.insert_many([crashed_job("user/z"), healthy_job("user/alive")])
    bad = {"heartbeat_timeout_seconds": 0, "max_stale_fraction": 7}

    result = cleanup(instance, resources, {"resources": {"zombie_policy": {"config": bad}}})

    expected = (
        "invalid zombie policy: heartbeat_timeout_seconds=0: should be greater than 0; "
        "max_stale_fraction=7: should be less than or equal to 1"  # as typed, though Dagster made it a float
    )
    assert not result.success
    assert result_cause(result) == expected
    [failure] = [event for event in result.all_events if event.is_step_failure]
    refused = found(failure.step_failure_data.user_failure_data).metadata
    assert refused["refused"].value == expected.removeprefix("invalid zombie policy: ").split("; ")
    assert (
        refused["policy_source"].value == "default, run config overrides heartbeat_timeout_seconds, max_stale_fraction"
    )
    assert [event.step_key for event in result.all_events if event.is_step_failure] == ["plan_and_recover"]
    assert attempts(result, "plan_and_recover") == 1
    assert retried_run(instance, result) == "false"
    assert failure_record(failure_seen_by_the_sensor(instance, result.run_id, resources), []).message == expected
    assert store.events.count_documents({}) == 0


def test_a_maximum_duration_below_the_heartbeat_timeout_is_refused_with_both_values(store, instance, resources):
    result = cleanup(instance, resources, {"resources": {"zombie_policy": {"config": {"max_duration_seconds": 100}}}})

    assert result_cause(result) == (
        "invalid zombie policy: max_duration_seconds (100 s) is shorter than heartbeat_timeout_seconds (300 s): a job "
        "would be killed for running long before a missing heartbeat could be seen"
    )
    assert retried_run(instance, result) == "false"


class OutageProxy(DelayProxy):
    """Forwards to the test's server, except for ``seconds`` after the first connection: refused then, as a server
    that is restarting or being elected refuses."""

    def __init__(self, target: tuple[str, int], seconds: float) -> None:
        super().__init__(target, 0.0)
        self.seconds = seconds
        self.first: float | None = None
        self.refused = 0

    def _connect(self, client: socket.socket) -> None:
        now = time.monotonic()
        self.first = self.first if self.first is not None else now
        if now - self.first < self.seconds:
            self.refused += 1
            client.close()
            return
        super()._connect(client)


def test_a_database_out_of_reach_for_a_moment_is_retried_within_the_run_which_then_succeeds(
    store, instance, resources, mongo_url, monkeypatch
):
    """The first step's check times out (0.5 s) while the server refuses connections; its retry, 2 s later, finds
    it back. The outage lasts 1.5 s from the first connection, so the first attempt fails whatever the load."""
    store.jobs.insert_many([crashed_job(f"user/{i}") for i in range(3)] + [healthy_job(f"u/{i}") for i in range(20)])
    proxy = OutageProxy(parse_uri(mongo_url)["nodelist"][0], seconds=1.5)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    url = f"mongodb://127.0.0.1:{proxy.address[1]}/?directConnection=true"
    monkeypatch.setenv(QUEUE_URL_ENV, url)
    monkeypatch.setenv(CACHE_URL_ENV, url)
    try:
        result = cleanup(instance, databases(resources, 500))
    finally:
        proxy.close()

    assert result.success, result_cause(result)
    assert proxy.refused >= 1
    # failed on the outage, then succeeded (on a loaded host the driver may take the second retry to see the server
    # back: its monitor checks a server it lost at most twice a second)
    tried = attempts(result, "plan_and_recover")
    assert tried in (2, 3)
    retry = [
        e for e in result.events_for_node("plan_and_recover") if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
    ]
    assert len(retry) == tried - 1
    assert store.events.count_documents({Event.STATE: "done"}) == 3


def test_a_database_out_of_reach_for_good_fails_after_the_steps_retries_with_where_it_looked(
    instance, resources, monkeypatch
):
    closed = f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"
    monkeypatch.setenv(QUEUE_URL_ENV, closed)
    monkeypatch.setenv(CACHE_URL_ENV, closed)

    result = cleanup(instance, databases(resources, 300))

    assert not result.success
    assert attempts(result, "plan_and_recover") == 3  # the first try and the retry policy's two
    cause = result_cause(result)
    assert cause.startswith(f"cannot reach MongoDB at {redact_url(closed)} (from ${QUEUE_URL_ENV}) within 0.3 s"), cause
    assert "\n" not in cause
    # the step's failure as the UI shows it starts with that line (not Dagster's "Exceeded max_retries of 2")
    [failure] = [event for event in result.all_events if event.is_step_failure]
    assert found(failure.step_failure_data.error).message.startswith(
        f"dagster._core.definitions.events.Failure: {cause}"
    )
    assert retried_run(instance, result) == "false"  # the step had its retries; the next tick tries again


# --- runs that never started: the run queue's launch failed, or run monitoring's start timeout ------------------

#: What the run queue's daemon records when a launch fails (queued_run_coordinator_daemon.py, Dagster 1.13).
DEQUEUE_FAILED = (
    "Caught an unrecoverable error while dequeuing the run. Marking the run as failed and dropping it from the queue"
)


def launched_where_no_code_server_answers(instance) -> dg.DagsterRun:
    """A queued cleanup launched as the run queue's daemon launches it, through Dagster's own gRPC client, at a port
    where no code server listens; then what the daemon does with the error: an engine event, the run failed."""
    run = recorded_cleanup_run(instance, dg.DagsterRunStatus.QUEUED)
    instance.report_dagster_event(
        dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_STARTING.value, job_name=run.job_name), run.run_id
    )
    client = DagsterGrpcClient(port=free_port(), host="127.0.0.1")
    with pytest.raises(DagsterUserCodeUnreachableError):
        try:
            DefaultRunLauncher.launch_run_from_grpc_client(instance, run, client)
        except DagsterUserCodeUnreachableError:
            error = serializable_error_info_from_exc_info(sys.exc_info())
            raise
    instance.report_engine_event(DEQUEUE_FAILED, run, EngineEventData.engine_error(error))
    instance.report_run_failed(run)
    return instance.get_run_by_id(run.run_id)


def test_a_cleanup_whose_launch_failed_is_recorded_and_posted_at_once_with_the_launch_error_and_is_retried(
    store, instance, resources, monkeypatch
):
    """Its failure event says only "marked as failed from outside the execution context": the cause is the error of
    the launch, which Dagster keeps as an engine event. Dagster retries it (dagster/max_retries); it is told now all
    the same, since its retry may start and nothing else would say that the code server did not answer."""
    run = launched_where_no_code_server_answers(instance)
    expected = (
        "launch failed: DagsterUserCodeUnreachableError: Could not reach user code server. gRPC Error code: UNAVAILABLE"
    )

    assert run.status == dg.DagsterRunStatus.FAILURE and run.tags[WILL_RETRY_TAG] == "true"
    received: list = []
    with webhook_server(received) as url:
        monkeypatch.setenv(WEBHOOK_ENV, url)
        pipeline_failure_sensor(failure_seen_by_the_sensor(instance, run.run_id, resources))

    stored = store.failures.find_one({ID: run.run_id})
    assert stored[Failure.MESSAGE] == expected and stored[Failure.WILL_RETRY] is True
    assert stored[Failure.FAILED_STEPS] == []
    [body] = received
    assert body[Failure.MESSAGE] == expected and body[Failure.WILL_RETRY] is True
    assert body["text"].endswith(": " + expected) and "\n" not in body["text"] and "retried" in body["text"]


def test_a_cleanup_failed_by_the_start_timeout_says_so_in_one_line_and_is_retried(store, resources):
    """Run monitoring's own check of a run that does not start, on an instance whose start timeout has passed."""
    overrides = {**RUN_RETRIES, "run_monitoring": {"enabled": True, "start_timeout_seconds": 0}}
    with dg.instance_for_test(overrides=overrides) as instance:
        run = recorded_cleanup_run(instance, dg.DagsterRunStatus.QUEUED)
        instance.report_dagster_event(
            dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_STARTING.value, job_name=run.job_name), run.run_id
        )
        monitor_starting_run(instance, found(instance.get_run_record_by_id(run.run_id)), logging.getLogger(__name__))

        assert found(instance.get_run_by_id(run.run_id)).tags[WILL_RETRY_TAG] == "true"
        pipeline_failure_sensor(failure_seen_by_the_sensor(instance, run.run_id, resources))

    stored = store.failures.find_one({ID: run.run_id})
    assert stored[Failure.MESSAGE] == "Run timed out due to taking longer than 0 seconds to start."
    assert stored[Failure.WILL_RETRY] is True


def test_a_cleanup_lost_after_it_started_is_left_to_its_retry(store, instance, resources):
    """Its worker died: Dagster retries it, and the retry reports if it fails too (told once)."""
    run = recorded_cleanup_run(instance, dg.DagsterRunStatus.STARTING)
    instance.report_dagster_event(
        dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_START.value, job_name=run.job_name), run.run_id
    )
    instance.report_run_failed(run, f"Run execution process for {run.run_id} unexpectedly exited with exit code -9.")

    assert found(instance.get_run_by_id(run.run_id)).tags[WILL_RETRY_TAG] == "true"
    pipeline_failure_sensor(failure_seen_by_the_sensor(instance, run.run_id, resources))
    assert store.failures.find_one({ID: run.run_id}) is None


# --- a webhook that records what it is sent ----------------------------------------------------------------------


@contextlib.contextmanager
def webhook_server(received: list) -> Iterator[str]:
    """An HTTP server on a free port that keeps the JSON bodies POSTed to it; its URL."""

    class Handler(QuietHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

    with http_server(Handler) as port:
        yield f"http://127.0.0.1:{port}/hook"
