"""A write the server applied whose reply never reached the cleanup: the step's own retry must finish the job as ours.

The proxy (``tests/faults/proxy.py``) lets one write of a chosen kind reach the server, then resets every
connection before its reply gets back: the server applied it, the cleanup cannot know. ``kill_zombies_job`` runs
in process with its retry policy, against a password URL with ``retryWrites=false`` (so a lost reply stays lost),
at the early-2023 generation (finished jobs kept as ``error``, retries enqueued by the cleanup) and at today's
(jobs deleted, ``pastJobs``, every counter), with ``transactions`` off and on. Each run must succeed through its
step retry and leave the queue as an uninterrupted cleanup of an identical queue (same seed, same instant) does:
every zombie finalized once, with its event; locks released; ``pastJobs`` and every counter equal to a recount;
the other jobs untouched.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

import pytest
from pymongo import MongoClient

from tests.faults.proxy import REPLY, FaultProxy, Trigger
from tests.faults.scenario import comparable_state, connect, counters_off, deployment_state
from tests.figures import report_figures
from tests.helpers import database_resources, run_kill_zombies, step_failure_messages, workload
from tests.servers import LocalServer, running_server
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import DEFAULT_EVENTS_COLLECTION, Event, EventState
from zombie_pipeline.queue.cache import CACHE_METRICS_COLLECTION, DEFAULT_CACHE_COLLECTION
from zombie_pipeline.queue.connections import close_clients
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION
from zombie_pipeline.queue.jobs import DEFAULT_JOBS_COLLECTION, ID
from zombie_pipeline.queue.locks import LOCKS_COLLECTION
from zombie_pipeline.queue.past_jobs import PAST_JOBS_COLLECTION
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.simulator import simulate

pytestmark = [pytest.mark.fault, pytest.mark.filterwarnings("ignore::UserWarning")]

USER = "cleaner"
PASSWORD = "Zq7-s3cr3t@:/?#[]%2F+ &='\"-P4ss"
URL_ENV = "ZOMBIE_LOST_REPLY_URL"
KEPT = "2023-07"  # finished jobs kept as error; locks, jobTotalMetric, cacheTotalMetric; the cleanup enqueues retries
DELETED = "2026-05"  # finished jobs deleted; locks, pastJobs, blockages, every counter
#: Batches of 8 over some 30 zombies: the reply lost is the second of its kind, a batch in the middle of the run.
POLICY = ZombiePolicy(batch_size=8, min_started_for_brake=1_000)
TIMEOUT_MS = 3_000


def _sets_state_done(command: dict[str, Any]) -> bool:
    """An update of events that completes them (not the take-over's, not a lease renewal)."""
    return any(
        (update.get("u") or {}).get("$set", {}).get(Event.STATE) == EventState.DONE
        for update in command.get("updates", [])
        if isinstance(update.get("u"), dict)
    )


@dataclass(frozen=True)
class WriteKind:
    """One kind of write a cleanup sends: the command, its collection, and which of them it is."""

    command: str | tuple[str, ...]
    collection: str | None  # None: a command that names no collection
    generations: tuple[str, ...] = (KEPT, DELETED)
    where: Callable[[dict], bool] | None = None

    def trigger(self) -> Trigger:
        return Trigger(self.command, self.collection, nth=2, phase=REPLY, where=self.where)


WRITE_KINDS = {
    "claim insert": WriteKind("insert", DEFAULT_EVENTS_COLLECTION),
    "cache write": WriteKind(("insert", "update"), DEFAULT_CACHE_COLLECTION),
    "job finish (set to error)": WriteKind("update", DEFAULT_JOBS_COLLECTION, (KEPT,)),
    "job deletion": WriteKind("delete", DEFAULT_JOBS_COLLECTION, (DELETED,)),
    "jobTotalMetric update": WriteKind("update", JOB_METRICS_COLLECTION),
    "cacheTotalMetric update": WriteKind("update", CACHE_METRICS_COLLECTION),
    "lock release": WriteKind("update", LOCKS_COLLECTION),
    "pastJobs insert": WriteKind("insert", PAST_JOBS_COLLECTION, (DELETED,)),
    "retry insert": WriteKind("insert", DEFAULT_JOBS_COLLECTION, (KEPT,)),
    "event completion": WriteKind("update", DEFAULT_EVENTS_COLLECTION, where=_sets_state_done),
}
#: With transactions, the commit of a batch's transaction is a write of its own whose reply may be lost.
COMMIT = WriteKind("commitTransaction", None)


def _cases() -> Iterator[Any]:
    for transactions in (False, True):
        for generation in (KEPT, DELETED):
            kinds = dict(WRITE_KINDS, **({"transaction commit": COMMIT} if transactions else {}))
            for name, kind in kinds.items():
                if generation in kind.generations:
                    label = f"{generation}{', transactions' if transactions else ''}: {name}"
                    yield pytest.param(generation, transactions, kind, id=label)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    with running_server(tmp_path_factory.mktemp("lost-replies"), users={USER: PASSWORD}) as server:
        yield server


@pytest.fixture(scope="module")
def admin(secured: LocalServer) -> Iterator[MongoClient]:
    """Straight to the server, never through the proxy: to build the queues and read what the cleanups left."""
    client = connect(
        f"mongodb://{quote_plus(USER)}:{quote_plus(PASSWORD)}@127.0.0.1:{secured.port}/?directConnection=true",
        timeout_ms=15_000,
    )
    yield client
    client.close()


def _queue(admin: MongoClient, name: str, generation: str, now: dt.datetime) -> tuple[Store, list, dict]:
    """A simulated queue of ``generation`` at ``now`` (always the same seed); its zombies and every job as written."""
    store = Store.of(admin[f"q_{name}"], admin[f"c_{name}"])
    store.ensure_indexes()
    queue = workload(
        generation=generation,
        finished=20,
        crashed=20,
        never_heartbeated=3,
        terminated=3 if QUEUE_GENERATIONS[generation].declares("terminated_at") else 0,
        overdue=3,
        running=10,
        waiting=5,
        seed=27,
    )
    simulation = simulate(store, queue, now=now)
    return store, simulation.zombie_ids, {job[ID]: job for job in store.jobs.find()}


def _final_state(store: Store, original_ids: set, generation: str) -> dict[str, Any]:
    """What must equal the uninterrupted cleanup's, each event's recorded policy aside (the run's own)."""
    state = {**comparable_state(store, original_ids), **deployment_state(store, QUEUE_GENERATIONS[generation])}
    for event in state["events"].values():
        event.pop(Event.POLICY, None)
    return state


@pytest.mark.parametrize("generation, transactions, kind", list(_cases()))
def test_a_write_whose_reply_is_lost_is_completed_by_the_step_retry_as_an_uninterrupted_cleanup(
    admin: MongoClient, secured: LocalServer, monkeypatch, request, generation: str, transactions: bool, kind: WriteKind
):
    now = utc_now()
    policy = POLICY.model_copy(update={"transactions": transactions})
    name = uuid.uuid4().hex[:8]
    control, _, _ = _queue(admin, f"control_{name}", generation, now)
    run_cleanup(control, policy, "uninterrupted", now=now, override_brake=True)
    store, zombies, before = _queue(admin, f"lost_{name}", generation, now)

    with FaultProxy(secured.port) as proxy:
        lost = proxy.on(kind.trigger(), proxy.reset)
        credentials = f"{quote_plus(USER)}:{quote_plus(PASSWORD)}"
        monkeypatch.setenv(URL_ENV, proxy.url(credentials))
        resources = {
            **database_resources(store, URL_ENV, timeout_ms=TIMEOUT_MS),
            "zombie_policy": ZombiePolicyResource(**policy.model_dump()),
        }
        result = run_kill_zombies(resources, override_brake=True)
        close_clients(proxy.url(credentials))

    assert lost.fired_at is not None, "no such write was sent twice: the scenario did not happen"
    assert result.success, step_failure_messages(result)
    retried = [
        log for log in result.logs if log.dagster_event and log.dagster_event.event_type_value == "STEP_UP_FOR_RETRY"
    ]
    # the lost reply failed the step once, and its retry completed the run; a commit whose reply is lost is
    # retried by the driver itself (commitTransaction is retryable, and the server knows the transaction committed)
    assert len(retried) == (0 if kind is COMMIT else 1)

    original_ids = set(before)
    events = list(store.events.find())
    assert sorted(event[ID] for event in events) == sorted(zombies), "each zombie has exactly one event"
    assert {event[Event.STATE] for event in events} == {EventState.DONE}
    bystanders = {job[ID]: job for job in store.jobs.find({ID: {"$in": sorted(original_ids - set(zombies))}})}
    assert bystanders == {job_id: before[job_id] for job_id in original_ids - set(zombies)}, "a bystander was touched"
    assert set(counters_off(store, QUEUE_GENERATIONS[generation]).values()) <= {0}, "a counter is off its recount"
    expected, actual = _final_state(control, original_ids, generation), _final_state(store, original_ids, generation)
    for part in expected:
        assert actual[part] == expected[part], part
    report_figures(
        f"lost_reply:{request.node.callspec.id}",
        {"lost": f"reply to the 2nd {kind.command} on {kind.collection}", "step_retries": len(retried)},
    )
