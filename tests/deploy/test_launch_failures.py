"""A cleanup launched while the code server cannot answer, on the production deployment: told, retried, not in the way.

The deployment of tests/deploy/stack.py (PostgreSQL, the code server, the daemon; deploy/dagster.yaml with run
monitoring polling every 2 s), the failure webhook pointed at a server of the test's, and one change to the daemon:
its calls to the code server time out after 15 s (``DAGSTER_GRPC_TIMEOUT_SECONDS``; deploy/ gives them 180), so a
launch fails in seconds where production waits minutes (and before gRPC gives up connecting, after 20 s: the error
is the timeout a code server too slow to answer gives). The schedule runs every minute, as an operator has it.

The code server is paused by its PID (SIGSTOP: the kernel still accepts the daemon's connections, nothing answers,
as a code server starved on a loaded host or stuck in a long pause), a cleanup is queued, and the daemon launches
it: the call to start it times out and the run queue fails it, before it ever started. Then the code server answers
again (SIGCONT), and the test shows what an operator gets: the failure record in ``zombiePipelineFailures`` and the
webhook with the launch error in one line, Dagster's retry of the cleanup (its ``dagster/max_retries``), which
succeeds, and the next schedule tick launching a cleanup, held back by nothing. The figures are printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import InstigatorTick, TickStatus

from tests.deploy.processes import ProcessTree
from tests.deploy.stack import CLEANUP, RUN_TIMEOUT, Deployment, assert_never_two_cleanups_at_once, deployment_stack
from tests.helpers import found
from tests.servers import QuietHandler, http_server
from zombie_pipeline.config import WEBHOOK_URL_ENV
from zombie_pipeline.defs.failures.causes import launch_of
from zombie_pipeline.defs.tags import WILL_RETRY_TAG
from zombie_pipeline.queue.audit_documents import Failure
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload

pytestmark = [pytest.mark.slow, pytest.mark.fault]

SCHEDULE = "kill_zombies_schedule"
#: The daemon's gRPC timeout here: how long the launch of a run waits for the paused code server.
GRPC_TIMEOUT = 15
LAUNCH_ERROR = (
    "launch failed: DagsterUserCodeUnreachableError: User code server request timed out due to taking longer than "
    f"{GRPC_TIMEOUT} seconds to complete."
)
#: Dagster's tag on a retry: the run it retries.
PARENT_RUN_TAG = "dagster/parent_run_id"
#: A schedule tick comes every minute; then its run is queued, launched and done.
NEXT_TICK = 60 + RUN_TIMEOUT


class RecordingWebhook:
    """The failure webhook: keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.url = ""

    def bodies_about(self, run_id: str) -> list[dict]:
        return [body for body in self.received if body.get("run_id") == run_id]


@pytest.fixture(scope="module")
def webhook() -> Iterator[RecordingWebhook]:
    hook = RecordingWebhook()

    class Handler(QuietHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            hook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

    with http_server(Handler) as port:
        hook.url = f"http://127.0.0.1:{port}/failures"
        yield hook


@pytest.fixture(scope="module")
def deployment(
    mongo_url: str, tmp_path_factory: pytest.TempPathFactory, webhook: RecordingWebhook
) -> Iterator[Deployment]:
    workload = Workload(
        finished=20, crashed=2, never_heartbeated=0, terminated=0, overdue=0, running=10, waiting=0, days=1.0, seed=41
    )
    with deployment_stack(
        mongo_url, tmp_path_factory.mktemp("launch"), workload,
        instance_changes={"run_monitoring": {"poll_interval_seconds": 2}},
        pipeline_env={WEBHOOK_URL_ENV: webhook.url},
        before_daemon=lambda ops: ops.stop_sensor("cleanup_checks_sensor"),
        daemon_env={"DAGSTER_GRPC_TIMEOUT_SECONDS": str(GRPC_TIMEOUT)},
    ) as deployment:  # fmt: skip
        yield deployment


@contextlib.contextmanager
def paused(server: ProcessTree) -> Iterator[None]:
    """The code server's process stopped (SIGSTOP) for the block, resumed (SIGCONT) after it, whatever happens."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def add_zombies(deployment: Deployment, seed: int) -> list:
    """Two fresh zombies beside live jobs: work for the cleanup that could not be launched."""
    added = simulate(deployment.store, Workload(finished=0, crashed=2, never_heartbeated=0, terminated=0, overdue=0,
                                                running=4, waiting=0, days=1.0, seed=seed))  # fmt: skip
    return added.zombie_ids


def schedule_ticks_after(deployment: Deployment, moment: float) -> list:
    """The schedule's ticks since ``moment`` that are done, oldest first."""
    ticks = [tick for tick in deployment.ops.schedule_ticks(SCHEDULE) if tick.timestamp > moment]
    return sorted((tick for tick in ticks if tick.status != TickStatus.STARTED), key=lambda tick: tick.timestamp)


def after_a_scheduled_cleanup(deployment: Deployment) -> None:
    """As in production, the schedule's cleanups come and go: the test's own starts right after one ended."""
    ops = deployment.ops
    ops.start_schedule(SCHEDULE)
    moment = time.time()
    ran = deployment.wait("a cleanup launched by the schedule", lambda: [t for t in schedule_ticks_after(deployment, moment - 60)
                          if t.run_ids], NEXT_TICK, interval=1)[-1]  # fmt: skip
    assert deployment.wait_for_run(ran.run_ids[0]) == dg.DagsterRunStatus.SUCCESS


def launched_while_paused(
    deployment: Deployment, paused_until: Callable[[dg.DagsterRun], bool]
) -> tuple[dg.RunRecord, float]:
    """A cleanup queued while the code server is paused, which the daemon launches and fails; the code server resumed
    once ``paused_until`` holds of the failed run. The failed run's record, and when the code server answered again."""
    ops, instance = deployment.ops, deployment.instance
    run = ops.create(CLEANUP)  # its plan from the code server, as `dagster job launch` makes it
    with paused(deployment.server):
        ops.submit(run.run_id)
        assert deployment.wait_for_run(run.run_id, timeout=GRPC_TIMEOUT + RUN_TIMEOUT) == dg.DagsterRunStatus.FAILURE
        deployment.wait("the code server to be needed again", lambda: paused_until(found(instance.get_run_by_id(run.run_id))),
                        RUN_TIMEOUT, interval=0.5)  # fmt: skip
    resumed_at = time.time()
    failed = found(instance.get_run_record_by_id(run.run_id))
    assert not launch_of(instance, run.run_id).started and failed.start_time is None  # no step ever ran
    return failed, resumed_at


def told(deployment: Deployment, webhook: RecordingWebhook, run_id: str) -> tuple[dict, dict]:
    """The failure record of ``run_id`` and the webhook's body, once pipeline_failure_sensor has told them (the sensor
    runs in the code server just resumed: on a host at load 10 its first ticks failed to reach it for 150 s)."""
    stored = deployment.wait(f"the failure record of {run_id}", lambda: deployment.store.failures.find_one({ID: run_id}),
                             2 * RUN_TIMEOUT, interval=1)  # fmt: skip
    [body] = webhook.bodies_about(run_id)
    assert stored[Failure.WEBHOOK_OUTCOME] == "sent (HTTP 204)" and "\n" not in body["text"]
    return stored, body


def next_tick_runs_a_cleanup(deployment: Deployment, moment: float) -> InstigatorTick:
    """The first schedule tick after ``moment``: not skipped, it launched a cleanup, which succeeded."""
    [tick] = deployment.wait("the next schedule tick", lambda: schedule_ticks_after(deployment, moment)[:1], NEXT_TICK,
                             interval=1)  # fmt: skip
    assert tick.status == TickStatus.SUCCESS and tick.run_ids, (tick.status, tick.skip_reason, tick.error)
    assert deployment.wait_for_run(tick.run_ids[0]) == dg.DagsterRunStatus.SUCCESS
    return tick


def test_a_cleanup_launched_while_the_code_server_cannot_answer_is_told_with_the_launch_error_retried_and_waited_for_by_no_tick(
    deployment, webhook
):
    instance = deployment.instance
    after_a_scheduled_cleanup(deployment)
    zombies = add_zombies(deployment, seed=42)

    failed, resumed_at = launched_while_paused(deployment, paused_until=lambda run: True)
    run_id = failed.dagster_run.run_id
    assert failed.dagster_run.tags[WILL_RETRY_TAG] == "true"

    # Dagster's run retries start it again once the code server answers, and the retry does the cleanup
    def the_retry():
        return [r for r in deployment.cleanup_records() if r.dagster_run.tags.get(PARENT_RUN_TAG) == run_id]

    [retry] = deployment.wait("the retry of the cleanup that was not launched", the_retry, RUN_TIMEOUT, interval=1)
    assert deployment.wait_for_run(retry.dagster_run.run_id) == dg.DagsterRunStatus.SUCCESS
    retry = instance.get_run_record_by_id(retry.dagster_run.run_id)
    assert deployment.store.jobs.count_documents({ID: {"$in": zombies}, Job.STATUS: Status.STARTED}) == 0

    # told at once, though retried: the launch error in one line, in the record and the webhook; the retry, a
    # success, is not
    stored, body = told(deployment, webhook, run_id)
    assert stored[Failure.MESSAGE] == body[Failure.MESSAGE] == LAUNCH_ERROR
    assert stored[Failure.WILL_RETRY] is body[Failure.WILL_RETRY] is True
    assert deployment.store.failures.find_one({ID: retry.dagster_run.run_id}) is None

    # no tick waited for it: none skipped naming it, and the first tick after the retry launched a cleanup
    tick = next_tick_runs_a_cleanup(deployment, retry.end_time)
    for later in schedule_ticks_after(deployment, failed.create_timestamp.timestamp()):
        assert run_id not in (later.skip_reason or ""), later.skip_reason
    assert_never_two_cleanups_at_once(deployment)
    queued_at = instance.get_run_stats(run_id).enqueued_time
    print(
        f"code server paused: the cleanup queued, then failed at launch {failed.end_time - queued_at:.1f} s later "
        f"(gRPC timeout {GRPC_TIMEOUT} s); code server resumed: the retry ended {retry.end_time - resumed_at:.1f} s "
        f"after (queued to success {retry.end_time - retry.create_timestamp.timestamp():.1f} s), the next tick "
        f"{tick.timestamp - retry.end_time:.1f} s after the retry launched a cleanup"
    )


def test_a_cleanup_whose_retry_cannot_be_created_either_is_told_as_not_retried_and_the_next_tick_runs_the_cleanup(
    deployment, webhook
):
    """The code server still does not answer when the daemon creates the retry (its plan comes from the code server):
    Dagster gives up retrying ("Failed to retry run") and says so on the run; the schedule's next tick is the retry."""
    after_a_scheduled_cleanup(deployment)
    zombies = add_zombies(deployment, seed=43)

    failed, resumed_at = launched_while_paused(deployment, lambda run: run.tags.get(WILL_RETRY_TAG) == "false")
    run_id = failed.dagster_run.run_id
    assert "Failed to retry run" in [entry.message for entry in deployment.instance.all_logs(run_id)]
    assert not [r for r in deployment.cleanup_records() if r.dagster_run.tags.get(PARENT_RUN_TAG) == run_id]

    stored, body = told(deployment, webhook, run_id)
    assert stored[Failure.MESSAGE] == body[Failure.MESSAGE] == LAUNCH_ERROR
    assert stored[Failure.WILL_RETRY] is body[Failure.WILL_RETRY] is False

    tick = next_tick_runs_a_cleanup(deployment, resumed_at - 1)
    assert deployment.store.jobs.count_documents({ID: {"$in": zombies}, Job.STATUS: Status.STARTED}) == 0
    assert_never_two_cleanups_at_once(deployment)
    print(f"no retry could be created: the next tick {tick.timestamp - resumed_at:.1f} s after the code server answered "
          "again launched the cleanup")  # fmt: skip
