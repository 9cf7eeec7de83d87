"""Faults: the cleanup loses nothing and finalizes nothing twice when the database or the pipeline dies.

Every scenario runs against a SecantusDB server the test starts itself, on a free
port with its own storage and ``--sync-on-commit``, so that it can be stopped,
killed and restarted on the same port and storage. Each test prints its figures
on a ``FIGURES {...}`` line (``pytest -s``) and appends them as JSON lines to
``$ZOMBIE_FIGURES_FILE`` when set; docs/reliability.md quotes them.

Sizes: the default suite runs small versions; ``ZOMBIE_FAULTS_FULL=1`` runs the
sizes of the report (1,000 zombies and 1,000 healthy jobs under live workers,
20 SIGKILLs).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pymongo
import pytest
from bson import ObjectId
from pymongo import MongoClient, monitoring

from figures import report_figures
from zombie_pipeline.cleanup import run_cleanup
from zombie_pipeline.detection import detect, stale_filter
from zombie_pipeline.documents import (
    CACHE_KEY,
    DEFAULT_CACHE_COLLECTION,
    DEFAULT_EVENTS_COLLECTION,
    DEFAULT_JOBS_COLLECTION,
    HTTP_OK,
    ID,
    Cache,
    CacheOutcome,
    Event,
    EventState,
    Job,
    RetryOutcome,
    Status,
    cache_key_of_job,
)
from zombie_pipeline.embedded import free_port, start_server
from zombie_pipeline.orchestration.jobs import kill_zombies_job
from zombie_pipeline.orchestration.resources import (
    CACHE_URL_ENV,
    QUEUE_URL_ENV,
    CacheDatabase,
    QueueDatabase,
    ZombiePolicyResource,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.simulate import JOB_TYPES, Workload, cache_document, job_document, simulate, utc_now
from zombie_pipeline.store import Store

FULL = os.environ.get("ZOMBIE_FAULTS_FULL") == "1"
QUEUE = "faults_queue"
CACHE = "faults_cache"
REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# --- a server of our own ----------------------------------------------------------------------


class OwnServer:
    """A SecantusDB server this test starts, stops, kills and restarts on one port and one storage."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def start(self) -> None:
        self.process, _ = start_server(
            self.base / "data", port=self.port, log_path=self.base / "server.log", detach=False
        )
        self.starts += 1

    def stop(self) -> None:
        """SIGTERM, as an operator or an orchestrator stops a database."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: the database host loses power; only --sync-on-commit keeps acknowledged writes."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None


@pytest.fixture
def server(tmp_path: Path):
    own = OwnServer(tmp_path)
    own.start()
    try:
        yield own
    finally:
        own.stop()


def connect(url: str, timeout_ms: int = 5_000, listeners: list | None = None) -> MongoClient:
    return MongoClient(
        url,
        tz_aware=True,
        tzinfo=dt.timezone.utc,
        serverSelectionTimeoutMS=timeout_ms,
        event_listeners=listeners or [],
    )


def store_of(client: MongoClient, queue: str = QUEUE, cache: str = CACHE) -> Store:
    return Store.of(client[queue], client[cache])


def snapshot(client: MongoClient) -> dict[str, Any]:
    """Every document and every index of every user database."""
    state = {}
    for name in sorted(client.list_database_names()):
        if name in {"admin", "local", "config"}:
            continue
        for collection_name in sorted(client[name].list_collection_names()):
            collection = client[name][collection_name]
            state[f"{name}.{collection_name}"] = (
                sorted(collection.find(), key=lambda doc: str(doc[ID])),
                sorted(collection.index_information()),
            )
    return state




def dagster_resources(timeout_ms: int = 3_000, **policy: Any) -> dict[str, Any]:
    return {
        "queue_db": QueueDatabase(database=QUEUE, server_selection_timeout_ms=timeout_ms),
        "cache_db": CacheDatabase(database=CACHE, server_selection_timeout_ms=timeout_ms),
        "zombie_policy": ZombiePolicyResource(**policy),
    }


def run_job(resources: dict[str, Any], **config: Any) -> dg.ExecuteInProcessResult:
    """Run kill_zombies_job in process; ``result.step_seconds`` holds each op's duration from the event log."""
    run_config = {"ops": {"reconcile": {"config": config}}, "loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    with dg.DagsterInstance.ephemeral() as instance:  # in memory: 0.1 s instead of 1.8 s for a temporary sqlite one
        result = kill_zombies_job.execute_in_process(
            run_config=run_config, resources=resources, instance=instance, raise_on_error=False
        )
        starts, seconds = {}, {}
        for record in instance.all_logs(result.run_id):
            event = record.dagster_event
            if event is None or event.step_key is None:
                continue
            if event.event_type_value == "STEP_START":
                starts[event.step_key] = record.timestamp
            elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE"):
                seconds[event.step_key] = record.timestamp - starts[event.step_key]
        result.step_seconds = seconds
        return result


def failure_messages(result: dg.ExecuteInProcessResult) -> list[str]:
    return [
        event.step_failure_data.error.message
        for event in result.all_events
        if event.is_step_failure and event.step_failure_data.error is not None
    ]


def step_output_metadata(result: dg.ExecuteInProcessResult, step: str) -> dict[str, Any]:
    [event] = [e for e in result.events_for_node(step) if e.event_type_value == "STEP_OUTPUT"]
    return {key: value.value for key, value in event.step_output_data.metadata.items()}


@pytest.fixture
def urls_of(monkeypatch):
    def point_at(url: str) -> None:
        monkeypatch.setenv(QUEUE_URL_ENV, url)
        monkeypatch.setenv(CACHE_URL_ENV, url)

    return point_at


# --- checks of a final state ----------------------------------------------------------------------


def audit(store: Store, zombie_ids: list[ObjectId], prior_failed_runs: dict[ObjectId, int]) -> dict[str, int]:
    """Count what the cleanup did to ``zombie_ids``; every 'lost' and 'duplicate' figure must be 0."""
    jobs = {job[ID]: job for job in store.jobs.find()}
    events = {event[ID]: event for event in store.events.find()}
    entries = {tuple(entry.get(name) for name in CACHE_KEY): entry for entry in store.cache.find()}
    figures = Counter()
    retry_ids = Counter()
    for job_id in zombie_ids:
        job = jobs[job_id]
        event = events.get(job_id)
        if job[Job.STATUS] == Status.STARTED:
            figures["lost_zombies_still_started"] += 1
            continue
        if job[Job.STATUS] != Status.ERROR or event is None:
            figures["lost_not_finalized_by_cleanup"] += 1
            continue
        figures["zombies_finalized"] += 1
        if job.get(Job.FINISHED_AT) != event[Event.FINALIZED_AT]:
            figures["duplicate_finished_at_mismatch"] += 1
        if event[Event.STATE] != EventState.DONE:
            figures["lost_event_not_done"] += 1
        key = tuple(cache_key_of_job(job).values())
        entry = entries.get(key)
        if event.get(Event.CACHE_OUTCOME) == CacheOutcome.WRITTEN:
            if entry is not None and entry.get(Cache.UPDATED_AT) > event[Event.FINALIZED_AT]:
                figures["cache_entries_superseded_by_a_later_worker_write"] += 1
            elif entry is None or entry.get(Cache.UPDATED_AT) != event[Event.FINALIZED_AT]:
                figures["lost_cache_entries"] += 1
            else:
                figures["cache_entries_written"] += 1
                runs = entry.get(Cache.FAILED_RUNS, (entry.get(Cache.DETAILS) or {}).get(Cache.FAILED_RUNS))
                if runs != prior_failed_runs.get(job_id, 0) + 1:
                    figures["duplicate_failed_runs_counted"] += 1
        elif event.get(Event.CACHE_OUTCOME) == CacheOutcome.SKIPPED_FRESHER:
            figures["cache_entries_kept_fresher"] += 1
        else:
            figures["lost_cache_entries"] += 1
        if event.get(Event.RETRY_OUTCOME) == RetryOutcome.ENQUEUED:
            retry = jobs.get(event[Event.RETRY_JOB_ID])
            if retry is None:
                figures["lost_retries"] += 1
            else:
                figures["retries_enqueued"] += 1
                retry_ids[job[Job.UNICITY_ID]] += 1
    waiting = Counter(job[Job.UNICITY_ID] for job in jobs.values() if job[Job.STATUS] == Status.WAITING)
    figures["duplicate_retries"] = sum(max(0, waiting[u] - 1) for u in retry_ids)
    figures["events"] = len(events)
    figures["duplicate_events"] = len(events) - len({e[ID] for e in events.values()})
    for name in (
        "lost_zombies_still_started",
        "lost_not_finalized_by_cleanup",
        "lost_event_not_done",
        "lost_cache_entries",
        "lost_retries",
        "duplicate_finished_at_mismatch",
        "duplicate_failed_runs_counted",
    ):
        figures.setdefault(name, 0)
    return dict(figures)


def prior_failed_runs(store: Store, zombie_ids: list[ObjectId]) -> dict[ObjectId, int]:
    """The failed runs each zombie's cache entry counts before the cleanup (0 when none or a success)."""
    jobs = {job[ID]: job for job in store.jobs.find({ID: {"$in": zombie_ids}})}
    entries = {tuple(entry.get(name) for name in CACHE_KEY): entry for entry in store.cache.find()}
    prior = {}
    for job_id, job in jobs.items():
        entry = entries.get(tuple(cache_key_of_job(job).values()))
        if entry is None or entry.get(Cache.HTTP_STATUS) == HTTP_OK:
            prior[job_id] = 0
        else:
            prior[job_id] = entry.get(Cache.FAILED_RUNS, (entry.get(Cache.DETAILS) or {}).get(Cache.FAILED_RUNS, 0))
    return prior


def assert_nothing_lost_or_doubled(figures: dict[str, int]) -> None:
    bad = {name: value for name, value in figures.items() if name.startswith(("lost_", "duplicate_")) and value}
    assert bad == {}, figures


# --- 1. the database is unreachable when a run starts --------------------------------------------------


TIMEOUT_MS = 2_000


def test_an_unreachable_database_fails_the_run_within_its_timeout_writes_nothing_and_the_next_run_works(
    server: OwnServer, urls_of
):
    client = connect(server.url)
    store = store_of(client)
    store.ensure_indexes()
    simulation = simulate(client[QUEUE], client[CACHE], Workload(finished=40, crashed=8, never_heartbeated=2, overdue=2, running=20, waiting=5, seed=3))
    before = snapshot(client)
    server.stop()
    urls_of(server.url)

    started = time.monotonic()
    failed = run_job(dagster_resources(timeout_ms=TIMEOUT_MS))
    run_seconds = time.monotonic() - started
    assert not failed.success
    [message] = failure_messages(failed)
    assert f"cannot reach MongoDB at mongodb://127.0.0.1:{server.port}/" in message
    failing_step = [e for e in failed.all_events if e.is_step_failure][0].step_key
    assert failing_step == "reconcile"  # the first op: nothing ran before it
    step_seconds = failed.step_seconds[failing_step]
    assert TIMEOUT_MS / 1000 - 0.1 <= step_seconds <= TIMEOUT_MS / 1000 * 2 + 1

    # The core, called directly, fails the same way and within the same timeout.
    core_started = time.monotonic()
    with pytest.raises(pymongo.errors.ServerSelectionTimeoutError):
        run_cleanup(store_of(connect(server.url, timeout_ms=TIMEOUT_MS)), ZombiePolicy(), "core-run", override_brake=True)
    core_seconds = time.monotonic() - core_started
    assert core_seconds <= TIMEOUT_MS / 1000 * 2 + 1

    server.start()  # same port, same storage
    assert snapshot(client) == before, "a run that could not reach the database wrote something"

    worked = run_job(dagster_resources(timeout_ms=TIMEOUT_MS), override_brake=True)
    assert worked.success
    summary = worked.output_for_node("summarize")
    assert summary["finalized"] == len(simulation.zombie_ids) == 12
    report_figures(
        "unreachable_at_start",
        {
            "server_selection_timeout_ms": TIMEOUT_MS,
            "failing_op": failing_step,
            "failing_op_seconds": round(step_seconds, 2),
            "whole_failed_run_seconds": round(run_seconds, 2),
            "core_run_cleanup_seconds": round(core_seconds, 2),
            "message": message.strip().splitlines()[0][:200],
            "documents_changed_by_failed_run": 0,
            "next_run_finalized": summary["finalized"],
            "zombies": len(simulation.zombie_ids),
        },
    )


# --- 2. the database stops in the middle of a cleanup -------------------------------------------------


class KillServerAfter(monitoring.CommandListener):
    """Kills the server right after the n-th acknowledged ``command`` on ``collection``.

    Registered process-wide, so it sees the clients Dagster's resources create; disarmed
    once it fired, and for every other server.
    """

    def __init__(self, server: OwnServer, command: str, collection: str, count: int) -> None:
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


def _unregister(listener: monitoring.CommandListener) -> None:
    listeners = getattr(monitoring, "_LISTENERS", None)
    if listeners is not None and listener in getattr(listeners, "command_listeners", []):
        listeners.command_listeners.remove(listener)


CRASH_POINTS = {
    # name: (command, collection, n): the server dies right after the n-th acknowledged command
    "claim": ("insert", DEFAULT_EVENTS_COLLECTION, 3),
    "finalize": ("update", DEFAULT_JOBS_COLLECTION, 3),
    "cache_errors": ("update", DEFAULT_CACHE_COLLECTION, 2),
    "retries": ("insert", DEFAULT_JOBS_COLLECTION, 2),
}
MIDWAY_WORKLOAD = Workload(finished=60, crashed=40, never_heartbeated=5, overdue=5, running=20, waiting=10, seed=11)
MIDWAY_BATCH = 5


@pytest.mark.parametrize(
    "point",
    [
        "finalize",
        "cache_errors",
        *(
            pytest.param(point, marks=[pytest.mark.slow, pytest.mark.skipif(not FULL, reason="set ZOMBIE_FAULTS_FULL=1")])
            for point in ("claim", "retries")
        ),
    ],
)
def test_a_database_stopped_between_batches_fails_the_run_and_the_next_run_completes_every_zombie_once(
    server: OwnServer, urls_of, point: str
):
    client = connect(server.url)
    store = store_of(client)
    store.ensure_indexes()
    simulation = simulate(client[QUEUE], client[CACHE], MIDWAY_WORKLOAD)
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
        crashed = run_job(dagster_resources(timeout_ms=TIMEOUT_MS, batch_size=MIDWAY_BATCH, claim_lease_seconds=0), override_brake=True)
        failed_seconds = time.monotonic() - started
    finally:
        killer.armed = False
        _unregister(killer)
    assert killer.seen == count, f"the run never reached its {count}th {command} on {collection}"
    assert not crashed.success
    failed_step = [e for e in crashed.all_events if e.is_step_failure][0].step_key
    assert failure_messages(crashed)

    server.start()  # same port, same storage: what was acknowledged must be there
    at_crash = {
        "jobs_error": store.jobs.count_documents({ID: {"$in": zombies}, Job.STATUS: Status.ERROR}),
        "events": dict(Counter(e[Event.STATE] for e in store.events.find({}, {Event.STATE: 1}))),
        "finished_at": {j[ID]: j.get(Job.FINISHED_AT) for j in store.jobs.find({ID: {"$in": zombies}, Job.STATUS: Status.ERROR})},
    }
    assert at_crash["events"], "the crash came before any claim"

    recovered = run_job(dagster_resources(timeout_ms=TIMEOUT_MS, batch_size=MIDWAY_BATCH, claim_lease_seconds=0), override_brake=True)
    assert recovered.success, failure_messages(recovered)
    reconcile_metadata = step_output_metadata(recovered, "reconcile")
    figures = audit(store, zombies, prior)
    # finalized before the crash keep their stamp: nothing is finalized a second time
    changed = sum(
        1 for job in store.jobs.find({ID: {"$in": list(at_crash["finished_at"])}})
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


# --- 3. live workers, and 2 to 4 cleanups in separate processes ------------------------------------------

WORKER_SCRIPT = r'''
import datetime as dt, json, os, random, sys, time
from bson import ObjectId
from pymongo import MongoClient, ReplaceOne, UpdateOne
args = json.loads(open(sys.argv[1]).read())
client = MongoClient(args["url"], tz_aware=True, tzinfo=dt.timezone.utc)
jobs = client[args["queue"]]["jobsBlue"]
cache = client[args["cache"]]["cachedResponsesBlue"]
rng = random.Random(args["seed"])
KEY = ("kind", "dataset", "config", "split")

def now():
    t = dt.datetime.now(dt.timezone.utc)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)

def key_of(job):
    return {"kind": job["type"], "dataset": job["dataset"], "config": job.get("config"), "split": job.get("split")}

def load(ids):
    return {job["_id"]: job for job in jobs.find({"_id": {"$in": [ObjectId(i) for i in ids]}})}

healthy = load(args["healthy"])
revived = load(args["revived"])
unfinished = set(healthy)
report = {"beat_rounds": 0, "beats": 0, "healthy_finished": 0, "healthy_finish_refused": 0,
          "revived_worker_won": 0, "revived_cleanup_won": 0, "success_writes": []}

def finish(batch):
    """As a datasets-server worker does: write the response, then mark the job finished."""
    stamp = now()
    ops = []
    for job in batch:
        key = key_of(job)
        entry = {**{k: v for k, v in key.items() if v is not None}, "http_status": 200, "error_code": None,
                 "content": {"result": "ok", "job_id": str(job["_id"])}, "details": {},
                 "job_runner_version": 2, "dataset_git_revision": "live", "progress": 1.0,
                 "updated_at": stamp, "duration": 1.0, "failed_runs": 0}
        entry = {k: v for k, v in entry.items() if v is not None}
        ops.append(ReplaceOne(key, entry, upsert=True))
        report["success_writes"].append(str(job["_id"]))
    cache.bulk_write(ops, ordered=False)
    jobs.bulk_write([UpdateOne({"_id": job["_id"], "status": "started"},
                               {"$set": {"status": "success", "finished_at": stamp}}) for job in batch], ordered=False)
    done = {j["_id"] for j in jobs.find({"_id": {"$in": [job["_id"] for job in batch]}, "status": "success"}, {"_id": 1})}
    return done

go = args["go_at"]
schedule = sorted((go + rng.uniform(0, args["spread_seconds"]), job_id) for job_id in revived)
print("ready", flush=True)
while not os.path.exists(args["stop_file"]):
    if unfinished:
        result = jobs.update_many({"_id": {"$in": list(unfinished)}, "status": "started"},
                                  {"$set": {"last_heartbeat": now()}})
        report["beat_rounds"] += 1
        report["beats"] += result.modified_count
        if time.time() >= go:
            k = max(1, int(len(unfinished) * args["finish_fraction"]))
            batch = [healthy[i] for i in rng.sample(sorted(unfinished), min(k, len(unfinished)))]
            done = finish(batch)
            report["healthy_finished"] += len(done)
            report["healthy_finish_refused"] += len(batch) - len(done)
            unfinished -= {job["_id"] for job in batch}
    due = [job_id for at, job_id in schedule if at <= time.time()]
    if due:
        schedule = [(at, job_id) for at, job_id in schedule if job_id not in due]
        done = finish([revived[i] for i in due])
        report["revived_worker_won"] += len(done)
        report["revived_cleanup_won"] += len(due) - len(done)
    time.sleep(args["pause"])
left = [job_id for _, job_id in schedule]
if left:
    done = finish([revived[i] for i in left])
    report["revived_worker_won"] += len(done)
    report["revived_cleanup_won"] += len(left) - len(done)
report["healthy_unfinished"] = len(unfinished)
print(json.dumps(report), flush=True)
'''

CLEANUP_SCRIPT = r'''
import datetime as dt, json, sys, time
from pymongo import MongoClient, monitoring
from zombie_pipeline.cleanup import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.store import Store
args = json.loads(open(sys.argv[1]).read())

class Writes(monitoring.CommandListener):
    """What this process's writes changed, per collection, from the server's replies."""
    def __init__(self):
        self.requests, self.totals = {}, {}
    def started(self, event):
        if event.command_name in ("update", "insert", "delete"):
            self.requests[event.request_id] = (event.command_name, event.command.get(event.command_name))
    def succeeded(self, event):
        name = self.requests.pop(event.request_id, None)
        if name is None:
            return
        reply = event.reply
        totals = self.totals.setdefault(f"{name[0]}:{name[1]}", {"commands": 0, "n": 0, "nModified": 0, "upserted": 0})
        totals["commands"] += 1
        totals["n"] += reply.get("n", 0)
        totals["nModified"] += reply.get("nModified", 0)
        totals["upserted"] += len(reply.get("upserted", []))
    def failed(self, event):
        self.requests.pop(event.request_id, None)

writes = Writes()
client = MongoClient(args["url"], tz_aware=True, tzinfo=dt.timezone.utc, event_listeners=[writes])
store = Store.of(client[args["queue"]], client[args["cache"]])
policy = ZombiePolicy(**args["policy"])
while time.time() < args["go_at"]:
    time.sleep(0.005)
started = time.monotonic()
report = run_cleanup(store, policy, args["run_id"], job_types=args["job_types"], override_brake=True)
print(json.dumps({
    "run_id": args["run_id"], "seconds": round(time.monotonic() - started, 2),
    "counts": {k: v for k, v in report.counts.items() if not k.startswith("type:")},
    "reconciled": dict(report.reconciled.counts),
    "won": [row["id"] for row in report.steps.rows],
    "writes": writes.totals,
}), flush=True)
'''


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _args_file(tmp_path: Path, name: str, args: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(args, default=str))
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


LIVE_SIZES = {
    "default": dict(zombies=120, healthy=120, cleanups=3, revived_fraction=0.1),
    "full": dict(zombies=1_000, healthy=1_000, cleanups=int(os.environ.get("ZOMBIE_FAULTS_CLEANUPS", "4")), revived_fraction=0.1),
}
LIVE_POLICY = dict(heartbeat_timeout_seconds=300, max_duration_seconds=86_400, batch_size=100, claim_lease_seconds=900)
LIVE_BATCH_SIZES = (100, 37, 61, 13)
LIVE_HALF_OF_TYPES = [job_type.name for job_type in JOB_TYPES[::2]]


def _live_jobs(zombies: int, healthy: int, now: dt.datetime, seed: int) -> tuple[list[dict], list[dict], list[dict]]:
    rng = random.Random(seed)
    started_at = now - dt.timedelta(hours=1)
    zombie_jobs, healthy_jobs, entries = [], [], []
    for kind, count, target, heartbeat in (
        ("zombie", zombies, zombie_jobs, now - dt.timedelta(minutes=30)),
        ("healthy", healthy, healthy_jobs, now - dt.timedelta(seconds=5)),
    ):
        for i in range(count):
            job_type = JOB_TYPES[i % len(JOB_TYPES)]
            config = None if job_type.level == "dataset" else rng.choice(["default", "en"])
            split = "train" if job_type.level == "split" else None
            job = job_document(
                job_type.name, f"user{i % 40}/{kind}-{i}", config, split,
                started_at=started_at, last_heartbeat=heartbeat,
            )
            target.append(job)
            if rng.random() < 0.5:  # an older result of the same step
                entries.append(cache_document(job, started_at - dt.timedelta(days=1), http_status=500, error_code="X", failed_runs=1))
    return zombie_jobs, healthy_jobs, entries


@pytest.mark.parametrize(
    "size",
    [
        "default",
        pytest.param("full", marks=[pytest.mark.slow, pytest.mark.skipif(not FULL, reason="set ZOMBIE_FAULTS_FULL=1")]),
    ],
)
def test_concurrent_cleanups_with_live_workers_finalize_each_zombie_once_and_never_a_live_job(
    server: OwnServer, tmp_path: Path, size: str
):
    sizes = LIVE_SIZES[size]
    client = connect(server.url)
    store = store_of(client)
    store.ensure_indexes()
    now = utc_now()
    zombie_jobs, healthy_jobs, entries = _live_jobs(sizes["zombies"], sizes["healthy"], now, seed=17)
    store.jobs.insert_many(zombie_jobs + healthy_jobs, ordered=False)
    store.cache.insert_many(entries, ordered=False)
    zombie_ids = [job[ID] for job in zombie_jobs]
    healthy_ids = [job[ID] for job in healthy_jobs]
    revived_ids = zombie_ids[:: int(1 / sizes["revived_fraction"])]
    prior = prior_failed_runs(store, zombie_ids)
    assert len(detect(store.jobs, ZombiePolicy(**LIVE_POLICY), utc_now()).candidates) == len(zombie_ids)

    spread = 0.05 * sizes["zombies"]
    go_at = time.time() + 4.0
    stop_file = tmp_path / "stop"
    worker_args = _args_file(
        tmp_path, "worker.json",
        {
            "url": server.url, "queue": QUEUE, "cache": CACHE, "seed": 5,
            "healthy": [str(i) for i in healthy_ids], "revived": [str(i) for i in revived_ids],
            "go_at": go_at, "spread_seconds": spread, "finish_fraction": 0.02, "pause": 0.2,
            "stop_file": str(stop_file),
        },
    )
    worker = subprocess.Popen(
        [sys.executable, str(_script(tmp_path, "worker.py", WORKER_SCRIPT)), str(worker_args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )
    cleanups: list[subprocess.Popen] = []
    try:
        assert worker.stdout.readline().strip() == "ready", worker.stderr.read()
        script = _script(tmp_path, "cleanup.py", CLEANUP_SCRIPT)
        for n in range(sizes["cleanups"]):
            # different batch sizes, staggered starts and one run limited to some job types (as a
            # partitioned run would be), so that claims and finalizations of the runs interleave
            policy = {**LIVE_POLICY, "batch_size": LIVE_BATCH_SIZES[n % len(LIVE_BATCH_SIZES)]}
            args = _args_file(
                tmp_path, f"cleanup-{n}.json",
                {
                    "url": server.url, "queue": QUEUE, "cache": CACHE, "policy": policy, "run_id": f"cleanup-{n}",
                    "go_at": go_at + 0.4 * n, "job_types": LIVE_HALF_OF_TYPES if n == 1 else None,
                },
            )
            cleanups.append(
                subprocess.Popen([sys.executable, str(script), str(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
            )
        outputs = [process.communicate(timeout=1_800) for process in cleanups]
        for process, (out, err) in zip(cleanups, outputs):
            assert process.returncode == 0, err[-3000:]
        reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
        time.sleep(1.0)  # a last heartbeat round
        stop_file.touch()
        worker_out, worker_err = worker.communicate(timeout=300)
        assert worker.returncode == 0, worker_err[-3000:]
        worker_report = json.loads(worker_out.strip().splitlines()[-1])
    finally:
        stop_file.touch()
        for process in [worker, *cleanups]:
            if process.poll() is None:
                process.kill()
                process.wait()

    jobs = {job[ID]: job for job in store.jobs.find()}
    events = list(store.events.find())
    events_by_job = Counter(event[ID] for event in events)
    error_jobs = {job_id for job_id in zombie_ids if jobs[job_id][Job.STATUS] == Status.ERROR}
    won = Counter(job_id for report in reports for job_id in report["won"])
    job_updates_modified = sum(report["writes"].get(f"update:{DEFAULT_JOBS_COLLECTION}", {}).get("nModified", 0) for report in reports)
    entries_now = {tuple(e.get(n) for n in CACHE_KEY): e for e in store.cache.find()}
    success_overwritten = 0
    for job_id in map(ObjectId, worker_report["success_writes"]):
        entry = entries_now.get(tuple(cache_key_of_job(jobs[job_id]).values()))
        if entry is None or entry.get(Cache.HTTP_STATUS) != HTTP_OK or entry[Cache.CONTENT].get("job_id") != str(job_id):
            success_overwritten += 1
    figures = {
        "zombies": len(zombie_ids),
        "healthy": len(healthy_ids),
        "revived_zombies": len(revived_ids),
        "cleanups": len(reports),
        "cleanup_seconds": [report["seconds"] for report in reports],
        "claimed_per_run": [report["counts"].get("claimed", 0) for report in reports],
        "claim_refused_per_run": [report["counts"].get("claimed_by_another_cleanup", 0) for report in reports],
        "finalized_per_run": [report["counts"].get("finalized", 0) for report in reports],
        "compare_and_set_lost_to_live_worker_per_run": [report["counts"].get("lost_to_live_worker", 0) for report in reports],
        "zombies_finalized": len(error_jobs),
        "double_finalizations_reported": sum(1 for count in won.values() if count > 1),
        "double_finalizations_written": job_updates_modified - len(error_jobs),
        "healthy_finalized": sum(1 for job_id in healthy_ids if jobs[job_id][Job.STATUS] == Status.ERROR),
        "healthy_finished_by_worker": worker_report["healthy_finished"],
        "healthy_finish_refused": worker_report["healthy_finish_refused"],
        "heartbeats_written": worker_report["beats"],
        "revived_finished_by_worker_first": worker_report["revived_worker_won"],
        "revived_finalized_by_cleanup_first": worker_report["revived_cleanup_won"],
        "successes_written_by_workers": len(worker_report["success_writes"]),
        "successes_overwritten_in_cache": success_overwritten,
        "zombies_left": sum(1 for job_id in zombie_ids if jobs[job_id][Job.STATUS] == Status.STARTED)
        + store.jobs.count_documents(stale_filter(ZombiePolicy(**LIVE_POLICY), utc_now())),
        "events_per_finalized_job": sorted(set(events_by_job[job_id] for job_id in error_jobs)),
        "events_for_jobs_not_finalized": sum(1 for event in events if event[ID] not in error_jobs),
        "events_not_done": sum(1 for event in events if event[Event.STATE] != EventState.DONE),
    }
    # every zombie is accounted for, exactly once: finalized by one cleanup, or finished by its revived worker
    figures.update({k: v for k, v in audit(store, sorted(error_jobs), prior).items() if k.startswith(("lost_", "duplicate_", "cache_", "retries"))})
    figures["lost_zombies_neither_finalized_nor_finished"] = sum(
        1 for job_id in zombie_ids if jobs[job_id][Job.STATUS] not in (Status.ERROR, Status.SUCCESS)
    )
    report_figures(f"live_workers:{size}", figures)

    assert figures["double_finalizations_reported"] == 0
    assert figures["double_finalizations_written"] == 0
    assert figures["healthy_finalized"] == 0
    assert figures["healthy_finish_refused"] == 0
    assert figures["successes_overwritten_in_cache"] == 0
    assert figures["zombies_left"] == 0
    assert figures["events_per_finalized_job"] == [1]
    assert figures["events_for_jobs_not_finalized"] == 0
    assert figures["events_not_done"] == 0
    assert figures["lost_zombies_neither_finalized_nor_finished"] == 0
    assert len(error_jobs) + worker_report["revived_worker_won"] == len(zombie_ids)
    assert sum(figures["finalized_per_run"]) == len(error_jobs)
    assert_nothing_lost_or_doubled(figures)


# --- 4. the pipeline's own process SIGKILLed at random points, repeatedly ----------------------------------

KILLABLE_SCRIPT = r'''
import datetime as dt, json, sys
from pymongo import MongoClient
from zombie_pipeline.cleanup import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.store import Store
args = json.loads(open(sys.argv[1]).read())
client = MongoClient(args["url"], tz_aware=True, tzinfo=dt.timezone.utc)
store = Store.of(client[args["queue"]], client[args["cache"]])
print("started", flush=True)
run_cleanup(store, ZombiePolicy(**args["policy"]), args["run_id"], now=dt.datetime.fromisoformat(args["now"]), override_brake=True)
print("completed", flush=True)
'''

KILL_WORKLOAD = (
    Workload(finished=80, crashed=50, never_heartbeated=8, overdue=8, running=20, waiting=10, seed=23)
    if FULL
    else Workload(finished=60, crashed=35, never_heartbeated=5, overdue=5, running=15, waiting=10, seed=23)
)
KILL_POLICY = dict(batch_size=3, claim_lease_seconds=0)
KILLS = 20 if FULL else 6


def _add_fresher_entries(store: Store, job_ids: list[ObjectId]) -> None:
    for job in store.jobs.find({ID: {"$in": job_ids}}):
        entry = cache_document(job, job[Job.STARTED_AT] + dt.timedelta(seconds=45))
        store.cache.replace_one({name: entry.get(name) for name in CACHE_KEY}, entry, upsert=True)


def _comparable_state(store: Store, original_ids: set) -> dict[str, Any]:
    """The state an operator cares about, without timestamps, run ids and ids chosen at random."""
    jobs, retries = {}, []
    for job in store.jobs.find():
        if job[ID] in original_ids:
            jobs[job[ID]] = {**{k: v for k, v in job.items() if k != Job.FINISHED_AT}, "finished": Job.FINISHED_AT in job}
        else:
            retries.append(sorted((k, repr(v)) for k, v in job.items() if k not in (ID, Job.CREATED_AT)))
    entries = {}
    for entry in store.cache.find():
        details = {k: v for k, v in (entry.get(Cache.DETAILS) or {}).items() if k not in ("run_id", Cache.DURATION)}
        entries[tuple(entry.get(n) for n in CACHE_KEY)] = {
            **{k: v for k, v in entry.items() if k not in (ID, Cache.UPDATED_AT, Cache.DURATION, Cache.DETAILS)},
            Cache.DETAILS: details,
        }
    events = {}
    for event in store.events.find():
        events[event[ID]] = {
            k: v
            for k, v in event.items()
            if k not in (Event.FINALIZED_AT, Event.RUN_ID, Event.LEASE_OWNER, Event.LEASE_UNTIL, Event.DETECTED_AT,
                         Event.COMPLETED_AT, Event.RETRY_JOB_ID)
        }
    return {"jobs": jobs, "retries": sorted(retries), "cache": entries, "events": events}


def test_sigkilled_cleanups_then_a_clean_run_end_in_the_state_of_an_uninterrupted_run(server: OwnServer, tmp_path: Path):
    client = connect(server.url)
    sim_now = utc_now()
    reference = store_of(client, "ref_queue", "ref_cache")
    killed = store_of(client, "kill_queue", "kill_cache")
    for store in (reference, killed):
        store.ensure_indexes()
        simulation = simulate(store.jobs.database, store.cache.database, KILL_WORKLOAD, now=sim_now)
        _add_fresher_entries(store, simulation.zombie_ids[:4])
    zombies = simulation.zombie_ids
    original_ids = {job[ID] for job in killed.jobs.find({}, {ID: 1})}
    prior = prior_failed_runs(killed, zombies)
    policy = ZombiePolicy(**KILL_POLICY)
    clean_now = sim_now + dt.timedelta(seconds=1)
    # the kills run at sim_now + i ms: the same zombies are due at every instant used
    assert {c.id for c in detect(killed.jobs, policy, sim_now).candidates} == {c.id for c in detect(killed.jobs, policy, clean_now).candidates} == set(zombies)

    started = time.monotonic()
    run_cleanup(reference, policy, "uninterrupted", now=clean_now, override_brake=True)
    reference_seconds = time.monotonic() - started

    rng = random.Random(int(os.environ.get("ZOMBIE_FAULTS_SEED", "7")))
    script = _script(tmp_path, "killable.py", KILLABLE_SCRIPT)
    outcomes = Counter()
    delays = []
    for i in range(KILLS):
        args = _args_file(
            tmp_path, f"kill-{i}.json",
            {"url": server.url, "queue": "kill_queue", "cache": "kill_cache", "policy": KILL_POLICY,
             "run_id": f"killed-{i}", "now": (sim_now + dt.timedelta(milliseconds=i)).isoformat()},
        )
        process = subprocess.Popen([sys.executable, str(script), str(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        assert process.stdout.readline().strip() == "started", process.stderr.read()
        # together the delays add up to about 1.5 uninterrupted runs: every step gets killed somewhere
        delay = rng.uniform(0.0, 3 * reference_seconds / KILLS)
        delays.append(round(delay, 2))
        try:
            process.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
        out, err = process.communicate(timeout=60)
        if process.returncode == -signal.SIGKILL:
            outcomes["killed_mid_run"] += 1
        else:
            assert process.returncode == 0, err[-3000:]
            outcomes["completed_before_kill"] += 1
        states = Counter(e[Event.STATE] for e in killed.events.find({}, {Event.STATE: 1}))
        outcomes[f"events_after_kill_{i}"] = "/".join(
            f"{states[state]}{state[0]}" for state in (EventState.CLAIMED, EventState.FINALIZED, EventState.DONE)
        )
    at_last_kill = dict(Counter(e[Event.STATE] for e in killed.events.find({}, {Event.STATE: 1})))
    finalized_before_clean = {j[ID]: j[Job.FINISHED_AT] for j in killed.jobs.find({ID: {"$in": zombies}, Job.STATUS: Status.ERROR})}

    clean = run_cleanup(killed, policy, "clean", now=clean_now, override_brake=True)

    expected, actual = _comparable_state(reference, original_ids), _comparable_state(killed, original_ids)
    differences = {part: _diff_count(expected[part], actual[part]) for part in expected}
    refinalized = sum(
        1 for job in killed.jobs.find({ID: {"$in": list(finalized_before_clean)}})
        if job[Job.FINISHED_AT] != finalized_before_clean[job[ID]]
    )
    figures = audit(killed, zombies, prior)
    report_figures(
        "sigkill_repeated",
        {
            "zombies": len(zombies),
            "batch_size": KILL_POLICY["batch_size"],
            "uninterrupted_run_seconds": round(reference_seconds, 1),
            "sigkills": KILLS,
            "killed_mid_run": outcomes["killed_mid_run"],
            "completed_before_kill": outcomes["completed_before_kill"],
            "kill_delays_seconds": delays,
            "events_claimed/finalized/done_after_each_kill": [outcomes[f"events_after_kill_{i}"] for i in range(KILLS)],
            "events_by_state_at_last_kill": at_last_kill,
            "clean_run_taken_over": clean.reconciled.counts["taken_over"],
            "clean_run_finalized_new": clean.counts["finalized"],
            "jobs_compared": len(actual["jobs"]),
            "cache_entries_compared": len(actual["cache"]),
            "events_compared": len(actual["events"]),
            "retries_compared": len(actual["retries"]),
            "differences_from_uninterrupted": differences,
            "refinalized_after_kill": refinalized,
            **{k: v for k, v in figures.items() if k.startswith(("lost_", "duplicate_", "retries", "events"))},
        },
    )
    assert outcomes["killed_mid_run"] >= 1
    assert differences == {"jobs": 0, "retries": 0, "cache": 0, "events": 0}, differences
    assert expected == actual
    assert refinalized == 0
    assert len(actual["events"]) == len(zombies)
    assert figures["duplicate_retries"] == 0


def _diff_count(expected: Any, actual: Any) -> int:
    if isinstance(expected, dict):
        keys = set(expected) | set(actual)
        return sum(1 for key in keys if expected.get(key) != actual.get(key))
    return sum(1 for a, b in zip(expected, actual) if a != b) + abs(len(expected) - len(actual))
