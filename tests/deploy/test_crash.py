"""A crash mid-cleanup on the production deployment, without Kubernetes: what notices, how soon, and no burst after.

The deployment of tests/deploy/stack.py (PostgreSQL, the code server, the daemon; deploy/dagster.yaml with one
change: run monitoring polls every 2 s instead of every 30, so the test waits seconds where production waits half
a minute). A cleanup is caught mid-run deterministically: its policy (run config, as the launchpad gives it)
POSTs each finalized zombie to a compensation webhook of the test's, which holds the first request; while it is
held the run is STARTED, inside ``compensate_zombies``, its zombies finalized. Then:

- only its run worker dies (an OOM kill of that one process): the code server sees its child gone and fails the
  run within seconds;
- the whole code location dies (its container crashes, server and run worker together) and is restarted, as a
  container engine's restart policy does: nothing is left to notice the worker, so the run stays STARTED until
  its runtime limit, when run monitoring fails it; meanwhile every schedule and sensor tick skips, naming it,
  instead of queueing a backlog; the run is retried (or the next tick launches a cleanup) and that cleanup
  succeeds. The limit is the doomed run's own ``dagster/max_runtime`` tag (90 s here, so that a tick of the
  every-minute schedule surely falls inside the freeze; kill_zombies_job's own is 300 s, docs/deploy.md).

The figures (seconds from the kill to the run's failure and to the next successful cleanup) are printed.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import threading
import time
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus

from tests.deploy.stack import CLEANUP, RUN_TIMEOUT, Deployment, assert_never_two_cleanups_at_once, deployment_stack
from tests.e2e.harness import descendants
from tests.helpers import found
from zombie_pipeline.defs.tags import MAX_RUNTIME_TAG
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload

pytestmark = [pytest.mark.slow, pytest.mark.fault]

SCHEDULE = "kill_zombies_schedule"
SENSOR = "stale_jobs_sensor"
HOOK_ENV = "ZOMBIE_TEST_COMPENSATION_HOOK"
POLL_SECONDS = 2
STUCK_RUN_LIMIT = 90
#: Monitoring fails the stuck run within a poll of its limit; then a retry or a tick is queued, launched and done.
RECOVERY_MARGIN = 75


class HoldingHook:
    """A compensation webhook that, once armed, holds the next request until released (at most a minute)."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.received = threading.Event()
        self.release = threading.Event()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers["Content-Length"]))
                if hook.armed.is_set():
                    hook.armed.clear()
                    hook.received.set()
                    hook.release.wait(60)
                try:
                    self.send_response(204)
                    self.end_headers()
                except OSError:  # the caller died while held
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/compensate"

    def arm(self) -> None:
        self.received.clear()
        self.release.clear()
        self.armed.set()


@pytest.fixture(scope="module")
def hook() -> Iterator[HoldingHook]:
    hook = HoldingHook()
    thread = threading.Thread(target=hook.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        hook.release.set()
        hook.server.shutdown()
        hook.server.server_close()


@pytest.fixture(scope="module")
def deployment(mongo_url: str, tmp_path_factory: pytest.TempPathFactory, hook: HoldingHook) -> Iterator[Deployment]:
    workload = Workload(
        finished=20, crashed=2, never_heartbeated=0, terminated=0, overdue=0, running=10, waiting=0, days=1.0, seed=22
    )
    with deployment_stack(
        mongo_url, tmp_path_factory.mktemp("crash"), workload,
        instance_changes={"run_monitoring": {"poll_interval_seconds": POLL_SECONDS}},
        pipeline_env={HOOK_ENV: hook.url},
        before_daemon=lambda ops: ops.stop_sensor("cleanup_checks_sensor"),
    ) as deployment:  # fmt: skip
        yield deployment


def add_zombies(deployment: Deployment, seed: int) -> list:
    """Two fresh zombies beside live jobs, so that a cleanup finalizes something and calls the hook."""
    added = simulate(deployment.store, Workload(finished=0, crashed=2, never_heartbeated=0, terminated=0, overdue=0,
                                                running=4, waiting=0, days=1.0, seed=seed))  # fmt: skip
    return added.zombie_ids


def launch_held_cleanup(deployment: Deployment, hook: HoldingHook, tags: dict[str, str] | None = None) -> dg.DagsterRun:
    """A cleanup that will be STARTED, inside compensate_zombies, when this returns."""
    hook.arm()
    run_config = {
        "resources": {
            "zombie_policy": {"config": {"compensation_webhooks": {"*": HOOK_ENV}, "compensation_timeout_seconds": 120}}
        }
    }
    run = deployment.ops.launch(CLEANUP, tags=tags, run_config=run_config)
    deployment.wait(
        f"cleanup {run.run_id} to reach the compensation hook", hook.received.is_set, RUN_TIMEOUT, interval=0.2
    )
    assert found(deployment.instance.get_run_by_id(run.run_id)).status == dg.DagsterRunStatus.STARTED
    return run


def run_worker_pids(deployment: Deployment) -> list[int]:
    """The code server's children that execute a run (multiprocessing's spawned workers)."""
    assert deployment.server.process is not None
    found = []
    for pid in descendants(deployment.server.process.pid):
        with contextlib.suppress(FileNotFoundError):
            if b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(pid)
    return found


def failure_message(deployment: Deployment, run_id: str) -> str:
    events = deployment.instance.all_logs(run_id)
    return "\n".join(
        event.message or "" for event in events if event.dagster_event and event.dagster_event.is_run_failure
    )


def engine_messages(deployment: Deployment, run_id: str) -> str:
    return "\n".join(event.message or "" for event in deployment.instance.all_logs(run_id))


def first_success_after(deployment: Deployment, moment: float) -> dg.RunRecord | None:
    successes = [record for record in deployment.cleanup_records()
                 if record.dagster_run.status == dg.DagsterRunStatus.SUCCESS and record.create_timestamp.timestamp() > moment]  # fmt: skip
    return min(successes, key=lambda record: found(record.end_time)) if successes else None


def test_a_run_worker_killed_alone_is_failed_within_seconds_by_the_code_server(deployment, hook):
    add_zombies(deployment, seed=31)
    before = set(run_worker_pids(deployment))
    run = launch_held_cleanup(deployment, hook)
    workers = [pid for pid in run_worker_pids(deployment) if pid not in before]
    assert workers, "no run worker process found under the code server"
    killed_at = time.time()
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert deployment.wait_for_run(run.run_id, timeout=60) == dg.DagsterRunStatus.FAILURE
    failed_after = deployment.instance.get_run_record_by_id(run.run_id).end_time - killed_at
    print(f"run worker SIGKILLed alone: run failed {failed_after:.1f} s later")
    assert failed_after < 30
    assert f"Run execution process for {run.run_id}" in engine_messages(deployment, run.run_id)
    hook.release.set()
    # retried from the start (dagster/max_retries), and the retry completes the cleanup
    retry = deployment.wait(
        "the retry of the failed cleanup", lambda: first_success_after(deployment, killed_at), RUN_TIMEOUT, interval=1
    )
    assert retry.dagster_run.tags.get("dagster/parent_run_id") == run.run_id
    assert_never_two_cleanups_at_once(deployment)


def test_a_crashed_code_location_frees_its_queue_at_the_cleanups_runtime_limit_without_a_burst(deployment, hook):
    ops = deployment.ops
    add_zombies(deployment, seed=32)
    run = launch_held_cleanup(deployment, hook, tags={MAX_RUNTIME_TAG: str(STUCK_RUN_LIMIT)})
    started_at = deployment.instance.get_run_record_by_id(run.run_id).start_time
    runs_before = {record.dagster_run.run_id for record in deployment.cleanup_records()}

    crashed_at = time.time()
    deployment.server.crash()
    hook.release.set()
    deployment.restart_code_server()
    # stale jobs for the sensor to see during the freeze, and the automation an operator has on
    later_zombies = add_zombies(deployment, seed=33)
    ops.start_sensor(SENSOR)
    ops.start_schedule(SCHEDULE)

    assert deployment.wait_for_run(run.run_id, timeout=STUCK_RUN_LIMIT + RUN_TIMEOUT) == dg.DagsterRunStatus.FAILURE
    failed_at = deployment.instance.get_run_record_by_id(run.run_id).end_time
    assert f"maximum runtime of {STUCK_RUN_LIMIT} seconds" in engine_messages(deployment, run.run_id)
    # failed by run monitoring at its limit (within a poll and a busy machine's delay), not before
    assert STUCK_RUN_LIMIT <= failed_at - started_at <= STUCK_RUN_LIMIT + POLL_SECONDS + 30

    success = deployment.wait("a successful cleanup after the crash", lambda: first_success_after(deployment, crashed_at),
                              RUN_TIMEOUT, interval=1)  # fmt: skip
    recovered_after = success.end_time - crashed_at
    print(
        f"code location crashed {crashed_at - started_at:.1f} s into the run: run failed by monitoring "
        f"{failed_at - crashed_at:.1f} s after the crash ({failed_at - started_at:.1f} s after its start, limit "
        f"{STUCK_RUN_LIMIT} s), next successful cleanup ended {recovered_after:.1f} s after the crash "
        f"(run {success.dagster_run.run_id}, {'a retry' if 'dagster/parent_run_id' in success.dagster_run.tags else 'a tick'})"
    )
    assert recovered_after <= STUCK_RUN_LIMIT + POLL_SECONDS + RECOVERY_MARGIN
    # the next cleanup finalized what had died meanwhile
    assert deployment.store.jobs.count_documents({ID: {"$in": later_zombies}, Job.STATUS: Status.STARTED}) == 0

    # while the run was stuck, every tick skipped and named it: no backlog
    def ticks_during_freeze(ticks):
        return [tick for tick in ticks if crashed_at <= tick.timestamp <= failed_at]

    schedule_ticks = ticks_during_freeze(ops.schedule_ticks(SCHEDULE))
    sensor_ticks = ticks_during_freeze(ops.sensor_ticks(SENSOR))
    assert schedule_ticks and sensor_ticks, (schedule_ticks, sensor_ticks)
    for tick in [*schedule_ticks, *sensor_ticks]:
        assert tick.status == TickStatus.SKIPPED and not tick.run_ids, tick
        assert run.run_id in (tick.skip_reason or ""), tick.skip_reason
    # and after it: no burst, one cleanup at a time
    new_runs = [record for record in deployment.cleanup_records()
                if record.dagster_run.run_id not in runs_before and record.create_timestamp.timestamp() <= success.end_time]  # fmt: skip
    assert len(new_runs) <= 2, [(r.dagster_run.run_id, r.dagster_run.tags) for r in new_runs]
    assert_never_two_cleanups_at_once(deployment)
    # a run lost with its worker is retried by Dagster (dagster/max_retries), and pipeline_failure_sensor leaves a
    # run that will be retried to its retry's outcome: reported once, by the retry if it fails too
    retries = [r for r in deployment.cleanup_records() if r.dagster_run.tags.get("dagster/parent_run_id") == run.run_id]
    assert retries, "the stuck run was not retried"
    assert deployment.store.failures.find_one({ID: run.run_id}) is None
