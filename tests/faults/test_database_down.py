"""The database fails the cleanup: unreachable when a run starts, or stopped between two batches of a run.

Against a SecantusDB server the test starts itself (``server``), so that it can be
stopped, killed and restarted on the same port and storage. Nothing is lost and
nothing finalized twice: the next run completes every zombie once.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from typing import Any

import pymongo
import pytest
from pymongo import monitoring

from tests.faults.scenario import (
    FULL_SIZE,
    assert_nothing_lost_or_doubled,
    audit,
    connect,
    dagster_resources,
    faults_store,
    prior_failed_runs,
    snapshot,
    step_seconds,
)
from tests.figures import report_figures
from tests.helpers import (
    failed_steps,
    run_kill_zombies,
    step_failure_messages,
    step_metadata,
    unregister,
    workload,
)
from tests.servers import LocalServer
from zombie_pipeline.cleanup.detection import stale_filter
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.defs.failures.causes import result_cause
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import DEFAULT_EVENTS_COLLECTION, Event
from zombie_pipeline.queue.cache import CACHE_KEY, DEFAULT_CACHE_COLLECTION
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, ID, Job, Status
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.simulation.simulator import simulate

pytestmark = [pytest.mark.fault, pytest.mark.filterwarnings("ignore::UserWarning")]


# --- the database is unreachable when a run starts --------------------------------------------------


TIMEOUT_MS = 2_000
#: The cleanup ops' retry policy waits 2 s, then 4 s, between attempts.
RETRY_WAITS_SECONDS = 2 + 4


def test_an_unreachable_database_fails_the_run_after_its_step_retries_each_within_its_timeout_writes_nothing_and_the_next_run_works(
    server: LocalServer, urls_of
):
    """The first op's check waits the timeout, and its retry policy tries twice more (2 s, then 4 s later): an
    outage that short is survived (tests/defs/failures/test_failures.py); this one is not, and the run says why."""
    client = connect(server.url)
    store = faults_store(client)
    store.ensure_indexes()
    simulation = simulate(
        store, workload(finished=40, crashed=8, never_heartbeated=2, overdue=2, running=20, waiting=5, seed=3)
    )
    before = snapshot(client)
    server.stop()
    urls_of(server.url)

    started = time.monotonic()
    failed = run_kill_zombies(dagster_resources(timeout_ms=TIMEOUT_MS))
    run_seconds = time.monotonic() - started
    assert not failed.success
    message = result_cause(failed)
    assert message.startswith(f"cannot reach MongoDB at mongodb://127.0.0.1:{server.port}/"), message
    failing_step = failed_steps(failed)[0]
    assert failing_step == "plan_and_recover"  # the first op: nothing ran before it
    failing_seconds = step_seconds(failed)[failing_step]  # its three attempts and the two waits between them
    timeout, waits = TIMEOUT_MS / 1000, RETRY_WAITS_SECONDS
    assert 3 * (timeout - 0.1) + waits <= failing_seconds <= 3 * (timeout * 2 + 1) + waits

    # The core, called directly, fails the same way and within the same timeout.
    core_started = time.monotonic()
    with pytest.raises(pymongo.errors.ServerSelectionTimeoutError):
        run_cleanup(
            faults_store(connect(server.url, timeout_ms=TIMEOUT_MS)), ZombiePolicy(), "core-run", override_brake=True
        )
    core_seconds = time.monotonic() - core_started
    assert core_seconds <= TIMEOUT_MS / 1000 * 2 + 1

    server.start()  # same port, same storage
    assert snapshot(client) == before, "a run that could not reach the database wrote something"

    worked = run_kill_zombies(dagster_resources(timeout_ms=TIMEOUT_MS), override_brake=True)
    assert worked.success
    summary = worked.output_for_node("report_cleanup")
    assert summary["finalized"] == len(simulation.zombie_ids) == 12
    report_figures(
        "unreachable_at_start",
        {
            "timeout_ms": TIMEOUT_MS,
            "failing_op": failing_step,
            "failing_op_seconds": round(failing_seconds, 2),
            "whole_failed_run_seconds": round(run_seconds, 2),
            "core_run_cleanup_seconds": round(core_seconds, 2),
            "message": message[:200],
            "documents_changed_by_failed_run": 0,
            "next_run_finalized": summary["finalized"],
            "zombies": len(simulation.zombie_ids),
        },
    )


# --- the database stops in the middle of a cleanup -------------------------------------------------


class KillServerAfter(monitoring.CommandListener):
    """Kills the server right after the n-th acknowledged ``command`` on ``collection``.

    Registered process-wide, so it sees the clients Dagster's resources create; disarmed
    once it fired, and for every other server.
    """

    def __init__(self, server: LocalServer, command: str, collection: str, count: int) -> None:
        self.server = server
        self.command = command
        self.collection = collection
        self.count = count
        self.seen = 0
        self.armed = True
        self.fired_at: float | None = None
        self._requests: dict[int, bool] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.armed or event.connection_id[1] != self.server.port:
            return
        if event.command_name == self.command and event.command.get(self.command) == self.collection:
            self._requests[event.request_id] = True

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if not self._requests.pop(event.request_id, False) or not self.armed:
            return
        self.seen += 1
        if self.seen == self.count:
            self.armed = False
            self.fired_at = time.monotonic()
            self.server.kill()

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._requests.pop(event.request_id, None)


CRASH_POINTS = {
    # name: (command, collection, n): the server dies right after the n-th acknowledged command
    "claim": ("insert", DEFAULT_EVENTS_COLLECTION, 3),
    "finalize": ("update", DEFAULT_JOBS_COLLECTION, 3),
    "cache_errors": ("update", DEFAULT_CACHE_COLLECTION, 2),
    "retries": ("insert", DEFAULT_JOBS_COLLECTION, 2),
}
MIDWAY_WORKLOAD = workload(finished=60, crashed=40, never_heartbeated=5, overdue=5, running=20, waiting=10, seed=11)
MIDWAY_BATCH = 5


@pytest.mark.parametrize(
    "point",
    [
        "finalize",
        "cache_errors",
        *(pytest.param(point, marks=FULL_SIZE) for point in ("claim", "retries")),
    ],
)
def test_a_database_stopped_between_batches_fails_the_run_and_the_next_run_completes_every_zombie_once(
    server: LocalServer, urls_of, point: str
):
    client = connect(server.url)
    store = faults_store(client)
    store.ensure_indexes()
    simulation = simulate(store, MIDWAY_WORKLOAD)
    zombies = simulation.zombie_ids
    # a few zombies whose step already has a fresher result (written after they started)
    fresher = zombies[:3]
    for job in store.jobs.find({ID: {"$in": fresher}}):
        entry = cache_document(job, job[Job.STARTED_AT] + dt.timedelta(seconds=30))
        store.cache.replace_one({name: entry.get(name) for name in CACHE_KEY}, entry, upsert=True)
    prior = prior_failed_runs(store, zombies)
    urls_of(server.url)

    command, collection, count = CRASH_POINTS[point]
    killer = KillServerAfter(server, command, collection, count)
    monitoring.register(killer)
    try:
        started = time.monotonic()
        crashed = run_kill_zombies(
            dagster_resources(timeout_ms=TIMEOUT_MS, batch_size=MIDWAY_BATCH, claim_lease_seconds=0),
            override_brake=True,
        )
        failed_seconds = time.monotonic() - started
    finally:
        killer.armed = False
        unregister(killer)
    assert killer.seen == count, f"the run never reached its {count}th {command} on {collection}"
    assert not crashed.success
    failed_step = failed_steps(crashed)[0]
    assert step_failure_messages(crashed)

    server.start()  # same port, same storage: what was acknowledged must be there
    at_crash: dict[str, Any] = {
        "jobs_error": store.jobs.count_documents({ID: {"$in": zombies}, Job.STATUS: Status.ERROR}),
        "events": dict(Counter(e[Event.STATE] for e in store.events.find({}, {Event.STATE: 1}))),
        "finished_at": {
            j[ID]: j.get(Job.FINISHED_AT) for j in store.jobs.find({ID: {"$in": zombies}, Job.STATUS: Status.ERROR})
        },
    }
    assert at_crash["events"], "the crash came before any claim"

    recovered = run_kill_zombies(
        dagster_resources(timeout_ms=TIMEOUT_MS, batch_size=MIDWAY_BATCH, claim_lease_seconds=0), override_brake=True
    )
    assert recovered.success, step_failure_messages(recovered)
    reconcile_metadata = step_metadata(recovered, "plan_and_recover")
    figures = audit(store, zombies, prior)
    # finalized before the crash keep their stamp: nothing is finalized a second time
    changed = sum(
        1
        for job in store.jobs.find({ID: {"$in": list(at_crash["finished_at"])}})
        if job.get(Job.FINISHED_AT) != at_crash["finished_at"][job[ID]]
    )
    figures["duplicate_refinalized_after_restart"] = changed
    figures["zombies_left"] = store.jobs.count_documents(stale_filter(ZombiePolicy(), utc_now()))
    assert_nothing_lost_or_doubled(figures)
    assert figures["zombies_left"] == 0
    assert figures["zombies_finalized"] == len(zombies)
    assert figures["events"] == len(zombies)
    assert figures["cache_entries_kept_fresher"] == len(fresher)
    assert figures["cache_entries_written"] == len(zombies) - len(fresher)
    report_figures(
        f"db_stopped_midway:{point}",
        {
            "zombies": len(zombies),
            "batch_size": MIDWAY_BATCH,
            "server_killed_after": f"{count} x {command} on {collection}",
            "failed_op": failed_step,
            "failed_run_seconds": round(failed_seconds, 1),
            "at_crash_jobs_finalized": at_crash["jobs_error"],
            "at_crash_events_by_state": at_crash["events"],
            "recovery_taken_over": reconcile_metadata.get("taken_over"),
            **figures,
        },
    )
