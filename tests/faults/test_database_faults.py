"""Faults in the database and the network during a cleanup: a stall, every connection reset, the server killed.

Against a SecantusDB server of the module's own with authentication (the pipeline's URL carries a password),
reached through a proxy the test drives (``tests/faults/proxy.py``), which strikes at a chosen command of the
traffic: before the server sees it, or after the server answered and before the pipeline hears it. Each queue is
a current one (2026-05: finished jobs deleted, every counter of the deployment, ``pastJobs``, locks) with retries
enqueued by the cleanup, and each scenario ends compared with an uninterrupted cleanup of an identical queue
(simulated from the same seed at the same instant): every original job, the retries, the cache entries, the events
with what each records as done around its finish, ``pastJobs``, locks, blockages and every counter, which must
also equal its recount.

The embedded server's two quirks (the team's reference notes on it) are kept out of the way as the docs say:
the pipeline's URL carries ``retryWrites=false`` (SecantusDB applies a retried write twice when its connection
resets while it executes it), and the cleanups run without transactions (it keeps an orphaned transaction's locks
for ever, where MongoDB aborts it after 60 s).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote_plus

import pymongo
import pytest
from dagster._core.execution.plan.objects import StepFailureData, StepRetryData
from pymongo import MongoClient

from tests.faults import repair_race
from tests.faults.proxy import HOUSEKEEPING, REPLY, REQUEST, WRITES, FaultProxy, Trigger
from tests.faults.scenario import (
    FULL,
    comparable_state,
    connect,
    counters_off,
    deployment_state,
)
from tests.figures import report_figures
from tests.helpers import failed_steps, found, run_kill_zombies, step_failure_messages, workload
from tests.servers import LocalServer, running_server
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.detection import detect
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    MONGO_TIMEOUT_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
)
from zombie_pipeline.defs.resources import ZombiePolicyResource, resources_from_env
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import DEFAULT_EVENTS_COLLECTION, Effect, Event, EventState
from zombie_pipeline.queue.cache import CACHE_METRICS_COLLECTION, DEFAULT_CACHE_COLLECTION
from zombie_pipeline.queue.connections import client_for, close_clients
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, ID
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.queue.worker_type_counts import WORKER_SIZE_METRICS_COLLECTION
from zombie_pipeline.simulation.simulator import simulate

pytestmark = [pytest.mark.fault, pytest.mark.filterwarnings("ignore::UserWarning")]

USER = "cleaner"
PASSWORD = "Zq7-s3cr3t@:/?#[]%2F+ &='\"-P4ss"
GENERATION = "2026-05"
QUEUE_GENERATION = QUEUE_GENERATIONS[GENERATION]
WORKLOAD = workload(
    finished=30,
    crashed=36,
    never_heartbeated=4,
    terminated=3,
    overdue=4,
    running=12,
    waiting=6,
    generation=GENERATION,
    seed=24,
)
#: Batches of 5: each zombie's batch is one of several, and a fault can strike between any two of them.
POLICY = ZombiePolicy(batch_size=5, claim_lease_seconds=0, enqueue_retries=True, min_started_for_brake=1_000)
#: The bound of every wait on the database in the scenarios that do not measure it.
TIMEOUT_MS = 1_500
#: Faults at random points of the traffic, one per run, before the clean run.
RANDOM_FAULTS = 12 if FULL else 6
#: Repairs measured amid live workers, each way.
RACE_REPAIRS = 100 if FULL else 30
#: A random fault strikes at one of a run's writes (a read is retried by pymongo, and the run goes on), within its
#: claims (one write per batch of 5, and the take-over) and its next two batches (11 writes each): with 47 zombies,
#: every run still has work when it is struck.
REACH = 11 + 2 * 11


# --- the module's server, the queues, the uninterrupted cleanup to compare with ---------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """SecantusDB with a user and authentication on: killed and restarted by the scenarios, on the same storage."""
    with running_server(tmp_path_factory.mktemp("secured"), users={USER: PASSWORD}) as server:
        yield server


@pytest.fixture
def proxy(secured: LocalServer) -> Iterator[FaultProxy]:
    with FaultProxy(secured.port) as proxy:
        yield proxy
    close_clients()  # the pipeline's clients of this proxy's URL


def credentials() -> str:
    return f"{quote_plus(USER)}:{quote_plus(PASSWORD)}"


@pytest.fixture(scope="module")
def admin(secured: LocalServer) -> Iterator[MongoClient]:
    """Straight to the server, never through the proxy: to build queues and read what the cleanups left."""
    client = connect(f"mongodb://{credentials()}@127.0.0.1:{secured.port}/?directConnection=true", timeout_ms=15_000)
    yield client
    client.close()


@dataclass(frozen=True)
class Queues:
    """The instant every queue is simulated at, the clean runs' instant, and the uninterrupted cleanup's result."""

    admin: MongoClient
    simulated_at: dt.datetime
    cleaned_at: dt.datetime
    expected: dict[str, Any]
    zombies: int

    def make(self) -> tuple[Store, set]:
        """A queue identical to the control's (same seed, same instant), in databases of its own; its job ids."""
        name = uuid.uuid4().hex[:8]
        store = Store.of(self.admin[f"q_{name}"], self.admin[f"c_{name}"])
        store.ensure_indexes()
        simulate(store, WORKLOAD, now=self.simulated_at)
        return store, {job[ID] for job in store.jobs.find({}, {ID: 1})}


def final_state(store: Store, original_ids: set) -> dict[str, Any]:
    """Everything compared with the control; each event's recorded policy without ``transactions`` (the control
    runs without them, some scenarios with)."""
    state = {**comparable_state(store, original_ids), **deployment_state(store, QUEUE_GENERATION)}
    for event in state["events"].values():
        event[Event.POLICY] = {name: value for name, value in event[Event.POLICY].items() if name != "transactions"}
    return state


@pytest.fixture(scope="module")
def queues(admin: MongoClient) -> Queues:
    """The control: a queue cleaned by one uninterrupted run, as every scenario's queue must end."""
    simulated_at = utc_now()
    cleaned_at = simulated_at + dt.timedelta(seconds=1)
    store = Store.of(admin["control_queue"], admin["control_cache"])
    store.ensure_indexes()
    simulation = simulate(store, WORKLOAD, now=simulated_at)
    original_ids = {job[ID] for job in store.jobs.find({}, {ID: 1})}
    # the faulted runs detect at other instants in between: the same zombies are due at each
    assert {c.id for c in detect(store.jobs, POLICY, simulated_at).candidates} == set(simulation.zombie_ids)
    assert {c.id for c in detect(store.jobs, POLICY, cleaned_at).candidates} == set(simulation.zombie_ids)
    report = run_cleanup(store, POLICY, "uninterrupted", now=cleaned_at, override_brake=True)
    assert report.counts["finalized"] == len(simulation.zombie_ids)
    assert counters.stored(store, QUEUE_GENERATION) == counters.recount(store, QUEUE_GENERATION)
    expected = final_state(store, original_ids)
    effects = {tuple(event[Event.EFFECTS]) for event in expected["events"].values()}
    assert (Effect.JOB_METRICS, Effect.PAST_JOB, Effect.LOCKS_RELEASED) in effects  # what a takeover must record too
    return Queues(admin, simulated_at, cleaned_at, expected, len(simulation.zombie_ids))


def piped(proxy: FaultProxy, store: Store, timeout_ms: int = TIMEOUT_MS) -> Store:
    """``store``'s databases as the pipeline reaches them: through the proxy, by ``client_for`` (every wait bounded)."""
    client = client_for(proxy.url(credentials()), timeout_ms)
    return Store.of(client[store.jobs.database.name], client[store.cache.database.name])


def assert_as_uninterrupted(store: Store, original_ids: set, queues: Queues) -> dict[str, int]:
    """The queue ends as the control did, part by part; the counters equal their recount. The parts that differ."""
    actual = final_state(store, original_ids)
    differences = {part: _differences(queues.expected[part], actual[part]) for part in queues.expected}
    assert counters_off(store, QUEUE_GENERATION) == {
        JOB_METRICS_COLLECTION: 0,
        WORKER_SIZE_METRICS_COLLECTION: 0,
        CACHE_METRICS_COLLECTION: 0,
    }
    for part in queues.expected:
        assert actual[part] == queues.expected[part], part
    return differences


def _differences(expected: Any, actual: Any) -> int:
    if isinstance(expected, dict):
        return sum(1 for key in set(expected) | set(actual) if expected.get(key) != actual.get(key))
    return sum(1 for a, b in zip(expected, actual) if a != b) + abs(len(expected) - len(actual))


# --- faults ----------------------------------------------------------------------------------------------------


@dataclass
class Fault:
    """What strikes (``reset``, ``stall``, ``kill``), where (a trigger on the traffic), and what it took to fail."""

    action: str
    trigger: Trigger
    failed_after: float | None = None  # seconds from the fault to the run's failure
    error: str | None = None

    def arm(self, proxy: FaultProxy, server: LocalServer) -> None:
        def kill() -> None:
            server.kill()
            proxy.reset()

        strikes: dict[str, Callable[[], None]] = {
            "reset": proxy.reset,
            "stall": proxy.stall,  # until the run has failed: the test resumes it
            "kill": kill,
        }
        proxy.on(self.trigger, strikes[self.action])

    def heal(self, proxy: FaultProxy, server: LocalServer, admin: MongoClient) -> None:
        """After the failed run: traffic flows again, the server is up again (same port, same storage)."""
        if self.trigger.fired_at is not None:  # a killed server may break the run before its killer has returned
            assert self.trigger.done.wait(30)
        proxy.clear()
        proxy.resume()
        if server.process is None:
            server.start()
            for _ in range(5):  # the admin client's pooled connections died with the server: it notices on first use
                try:
                    admin.admin.command("ping")
                    break
                except pymongo.errors.AutoReconnect:
                    time.sleep(0.2)

    def describe(self) -> str:
        command = self.trigger.command
        what = "write" if command == WRITES else command or "command"
        where = f" on {self.trigger.collection}" if self.trigger.collection else ""
        return f"{self.action} at the {self.trigger.phase} of the {self.trigger.nth}th {what}{where}"


def run_with(
    fault: Fault,
    proxy: FaultProxy,
    server: LocalServer,
    queues: Queues,
    store: Store,
    run_id: str,
    now: dt.datetime,
    policy: ZombiePolicy = POLICY,
) -> bool:
    """One cleanup through the proxy with ``fault`` armed; whether it failed (the fault struck mid-run).

    With transactions, the server is restarted after any fault: SecantusDB would keep for ever the locks of a
    transaction whose connection was cut (MongoDB aborts it after 60 s).
    """
    fault.arm(proxy, server)
    try:
        run_cleanup(piped(proxy, store), policy, run_id, now=now, override_brake=True)
        failed = False
    except pymongo.errors.PyMongoError as error:
        fault.failed_after = time.time() - fault.trigger.fired_at if fault.trigger.fired_at else None
        fault.error = type(error).__name__
        failed = True
    if policy.transactions and server.process is not None:
        server.stop()
    fault.heal(proxy, server, queues.admin)
    return failed


# --- 1. a stall is bounded by the setting, and said in one line ---------------------------------------------


@pytest.mark.parametrize("timeout_ms", [1_500, 4_000])
def test_a_stalled_database_fails_the_step_within_its_timeout_in_one_line_and_the_next_run_completes_it(
    secured: LocalServer, proxy: FaultProxy, queues: Queues, monkeypatch, timeout_ms: int
):
    """The database stops answering right after it deleted a batch of zombies (their reply held): the step fails
    within ``$ZOMBIE_MONGO_TIMEOUT_MS``, in one line naming the masked URL, the step and the variable; the next run
    (the stall over) leaves the queue as an uninterrupted run."""
    store, original_ids = queues.make()
    url = proxy.url(credentials())
    for variable, value in {
        QUEUE_URL_ENV: url,
        CACHE_URL_ENV: url,
        QUEUE_DATABASE_ENV: store.jobs.database.name,
        CACHE_DATABASE_ENV: store.cache.database.name,
        MONGO_TIMEOUT_ENV: str(timeout_ms),
    }.items():
        monkeypatch.setenv(variable, value)
    resources = {**resources_from_env(), "zombie_policy": ZombiePolicyResource(**POLICY.model_dump())}
    stall = proxy.on(Trigger("delete", DEFAULT_JOBS_COLLECTION, nth=2, phase=REPLY), proxy.stall)

    failed = run_kill_zombies(resources, override_brake=True)
    proxy.resume()

    assert stall.fired_at is not None, "the run never deleted a second batch"
    assert not failed.success and failed_steps(failed) == ["finalize_zombies"]
    [failure] = [event for event in failed.all_events if event.is_step_failure]
    # Each attempt of the step (its retry policy tries twice more, 2 s then 4 s later: the stall outlasts them)
    # fails within the setting; the first one's failure is the one the stall caused.
    attempts = [
        log
        for log in failed.logs
        if log.dagster_event and log.dagster_event.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_FAILURE")
    ]
    assert len(attempts) == 3
    seconds = attempts[0].timestamp - stall.fired_at
    # pymongo counts the timeout from the command's start, which precedes the held reply by the server's time on the
    # delete (0.17 s once on a loaded host): the failure may come that much before the stall is timeout_ms old
    assert timeout_ms / 1000 - 0.5 <= seconds <= timeout_ms / 1000 + 1.5
    # the whole step, three attempts each bounded alike and the retry policy's 2 s and 4 s between them
    assert attempts[-1].timestamp - stall.fired_at <= 3 * (timeout_ms / 1000 + 1.5) + 2 + 4
    data = cast(StepRetryData | StepFailureData, found(attempts[0].dagster_event).event_specific_data)
    error = found(data.error)  # RetryRequestedFromPolicy, caused by the step's own
    while error.cause is not None:
        error = error.cause
    message = error.message
    line = message.strip().removeprefix("dagster._core.definitions.events.Failure: ")
    assert "\n" not in line
    assert line.startswith("finalize_zombies: claiming and finalizing zombies: MongoDB at ")
    assert f"mongodb://***:***@127.0.0.1:{proxy.port}/" in line
    assert f"did not answer within {timeout_ms / 1000:g} s" in line
    assert f"${MONGO_TIMEOUT_ENV} bounds every wait on the database ({timeout_ms} ms)" in line
    metadata = {key: value.value for key, value in found(failure.step_failure_data.user_failure_data).metadata.items()}
    assert metadata["timeout_ms"] == timeout_ms  # the last attempt's failure: it may fail on reaching the server
    for text in (message, *step_failure_messages(failed), repr(metadata)):
        assert PASSWORD not in text and quote_plus(PASSWORD) not in text

    recovered = run_kill_zombies(resources, override_brake=True)
    assert recovered.success, step_failure_messages(recovered)
    differences = assert_as_uninterrupted(store, original_ids, queues)
    report_figures(
        f"database_stall:{timeout_ms}",
        {
            "timeout_ms": timeout_ms,
            "stall_at": "the reply to the 2nd delete of jobs (a batch deleted, its reply held)",
            "failed_op": "finalize_zombies",
            "seconds_from_stall_to_failure": round(seconds, 2),
            "message": line,
            "differences_from_uninterrupted": differences,
        },
    )


# --- 2. at chosen points: the counters' write lost, its reply lost, the server killed ----------------------


POINTS = {
    # name: (action, command, collection, nth, phase)
    "a batch's deletions acknowledged, connections reset before the reply": (
        "reset",
        "delete",
        DEFAULT_JOBS_COLLECTION,
        2,
        REPLY,
    ),
    "connections reset before a batch's jobTotalMetric write": ("reset", "update", JOB_METRICS_COLLECTION, 3, REQUEST),
    "cacheTotalMetric applied, its reply lost": ("reset", "update", CACHE_METRICS_COLLECTION, 2, REPLY),
    "retries' workerTypeJobCounts applied, its reply lost": (
        "reset",
        "update",
        WORKER_SIZE_METRICS_COLLECTION,
        1,
        REPLY,
    ),
    # (the 1st update of the events is the take-over's, in reconcile)
    "server killed before a batch's events are completed": ("kill", "update", DEFAULT_EVENTS_COLLECTION, 2, REQUEST),
    "server killed after a batch's cache entries were written": ("kill", "insert", DEFAULT_CACHE_COLLECTION, 2, REPLY),
}
#: With transactions, a batch is three (its cache entries, its finish, its retries and events), each committed
#: durably: the server killed once a commit is applied and before its reply (pymongo retries a commit whose reply
#: is lost on a live server, and the server answers it again), or in the middle of one (which ends it).
TRANSACTION_POINTS = {
    "a batch's finish committed, the server killed before the reply": ("kill", "commitTransaction", None, 2, REPLY),
    "a batch's cache entries committed, the server killed before the reply": (
        "kill",
        "commitTransaction",
        None,
        4,
        REPLY,
    ),
    "server killed in the middle of a batch's finish": ("kill", "update", JOB_METRICS_COLLECTION, 2, REPLY),
}


@pytest.mark.parametrize(
    "point, transactions",
    [pytest.param(point, False, id=point) for point in POINTS]
    + [pytest.param(point, True, id=f"transactions: {point}") for point in TRANSACTION_POINTS],
)
def test_after_a_fault_at_a_chosen_point_the_next_run_leaves_counters_and_events_as_an_uninterrupted_run(
    secured: LocalServer, proxy: FaultProxy, queues: Queues, point: str, transactions: bool
):
    """Without transactions the run that takes over sets the counters in doubt from a recount; with them, nothing
    is in doubt (a finish and its counters commit together) and nothing is recounted."""
    store, original_ids = queues.make()
    action, command, collection, nth, phase = (TRANSACTION_POINTS if transactions else POINTS)[point]
    fault = Fault(action, Trigger(command, collection, nth, phase))
    policy = POLICY.model_copy(update={"transactions": transactions})

    now = queues.simulated_at + dt.timedelta(milliseconds=1)
    assert run_with(fault, proxy, secured, queues, store, "faulted", now, policy)
    drift = counters_off(store, QUEUE_GENERATION)
    sent = len(proxy.commands)
    clean = run_cleanup(piped(proxy, store), policy, "clean", now=queues.cleaned_at, override_brake=True)

    differences = assert_as_uninterrupted(store, original_ids, queues)
    repaired = clean.reconciled.counts["counters_repaired"]
    if transactions:
        assert repaired == 0
        assert any(command.name == "commitTransaction" for command in proxy.commands), "no transaction ran"
    report_figures(
        f"database_fault_at:{'transactions: ' if transactions else ''}{point}",
        {
            "fault": fault.describe(),
            "error": fault.error,
            "seconds_to_fail": round(fault.failed_after or 0, 2),
            "counters_off_after_the_fault": drift,
            "taken_over_by_the_clean_run": clean.reconciled.counts["taken_over"],
            "counters_repaired_by_the_clean_run": repaired,
            "commands_of_the_clean_run": sum(1 for c in proxy.commands[sent:] if c.name not in HOUSEKEEPING),
            "differences_from_uninterrupted": differences,
        },
    )


# --- 3. faults at random points, one per run, then a clean run ---------------------------------------------------


ACTIONS = [
    ("reset", REQUEST),
    ("reset", REPLY),
    ("stall", REQUEST),
    ("stall", REPLY),
    ("kill", REQUEST),
    ("kill", REPLY),
]


def test_counters_and_events_are_exact_after_faults_at_random_points_of_the_traffic(
    secured: LocalServer, proxy: FaultProxy, queues: Queues
):
    """Runs one after the other, each struck at a random command by a random fault (reset, stall past the timeout,
    server killed; before the server sees the command or after it answered), then a clean run: the queue ends as
    an uninterrupted run's, counters exact."""
    store, original_ids = queues.make()
    rng = random.Random(int(os.environ.get("ZOMBIE_FAULTS_SEED", "24")))
    fired, failed, drifts, states = [], 0, [], []
    for i in range(RANDOM_FAULTS):
        unfinished = queues.zombies - store.events.count_documents({Event.STATE: EventState.DONE})
        if not unfinished:
            break
        action, phase = rng.choice(ACTIONS)
        fault = Fault(action, Trigger(WRITES, None, rng.randint(1, REACH), phase))
        now = queues.simulated_at + dt.timedelta(milliseconds=i)
        failed += run_with(fault, proxy, secured, queues, store, f"faulted-{i}", now)
        if fault.trigger.fired_at is not None:
            fired.append(fault)
        drifts.append(sum(counters_off(store, QUEUE_GENERATION).values()))
        states.append(dict(Counter(event[Event.STATE] for event in store.events.find({}, {Event.STATE: 1}))))
    clean = run_cleanup(piped(proxy, store), POLICY, "clean", now=queues.cleaned_at, override_brake=True)

    differences = assert_as_uninterrupted(store, original_ids, queues)
    stalls = [fault.failed_after for fault in fired if fault.action == "stall" and fault.failed_after is not None]
    report_figures(
        "database_faults_at_random",
        {
            "zombies": queues.zombies,
            "batch_size": POLICY.batch_size,
            "timeout_ms": TIMEOUT_MS,
            "faults_fired": len(fired),
            "runs_failed": failed,
            "faults": [fault.describe() + (f": {fault.error}" if fault.error else ": absorbed") for fault in fired],
            "seconds_to_fail_at_most": {
                action: round(max(f.failed_after or 0 for f in fired if f.action == action), 2)
                for action in sorted({f.action for f in fired})
            },
            "counters_off_after_each_run": drifts,
            "events_after_each_run": states,
            "clean_run_taken_over": clean.reconciled.counts["taken_over"],
            "clean_run_counters_repaired": clean.reconciled.counts["counters_repaired"],
            "differences_from_uninterrupted": differences,
        },
    )
    assert failed >= RANDOM_FAULTS // 2, [fault.describe() for fault in fired]
    assert all(seconds <= TIMEOUT_MS / 1000 + 1.5 for seconds in stalls), stalls


# --- 4. a repair amid the deployment's live workers ------------------------------------------------------------


def test_a_repair_amid_live_workers_leaves_counters_off_no_more_often_than_the_deployments_own_recount(
    tmp_path: Path,
):
    """The repair's race with workers moving the same counters, measured (``tests/faults/repair_race.py``): one
    repair at a random moment, then the workers paused and every counter compared with its recount; against the
    same with the recount written as it is, as the deployment's periodic recount writes it."""
    with running_server(tmp_path / "race") as server:
        client = connect(server.url)
        ours = repair_race.measure(Store.of(client["q_cas"], client["c_cas"]), RACE_REPAIRS, recount_set=False)
        theirs = repair_race.measure(Store.of(client["q_set"], client["c_set"]), RACE_REPAIRS, recount_set=True)
    report_figures("repair_amid_live_workers", {"repair": ours, "deployment_recount": theirs})
    assert ours["worker_moves"]["started"] > RACE_REPAIRS and theirs["worker_moves"]["started"] > RACE_REPAIRS
    assert ours["repairs_that_left_a_counter_off"] <= theirs["repairs_that_left_a_counter_off"]
