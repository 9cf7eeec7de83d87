"""What many suites build or read alike: jobs of a given age, the commands a client sends, a cleanup run in process."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import dagster as dg
import numpy as np
from dagster._core.events.log import EventLogEntry
from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster_shared.error import SerializableErrorInfo
from pymongo import MongoClient, monitoring
from pymongo.collection import Collection

from zombie_pipeline.cleanup import compensations, run
from zombie_pipeline.cleanup.detection import Detection
from zombie_pipeline.cleanup.finalizer import Finalizer
from zombie_pipeline.cleanup.plan import CleanupOptions, CleanupPlan
from zombie_pipeline.cleanup.results import StepResult
from zombie_pipeline.config import CACHE_URL_ENV, QUEUE_URL_ENV
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.pushgateway import MetricsGateway
from zombie_pipeline.defs.resources import Databases
from zombie_pipeline.defs.tags import JOB_TYPE_PARTITIONS, QUEUE_DATABASE_TAG
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.evidence import detect_cache_generation
from zombie_pipeline.queue.generations import (
    NEWEST_CACHE_GENERATION,
    OLDEST_QUEUE_GENERATION,
    QUEUE_GENERATIONS,
    CacheGeneration,
)
from zombie_pipeline.queue.jobs import ID, JobDocument
from zombie_pipeline.queue.store import Document, Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation import shapes
from zombie_pipeline.simulation.workload import Workload
from zombie_pipeline.statistics.analysis import DurationReport, analyze
from zombie_pipeline.statistics.tallies import Period, Tally

#: Dagster's console logger at ERROR: a run's debug lines would drown the test output.
QUIET_LOGGERS = {"console": {"config": {"log_level": "ERROR"}}}


# --- jobs ---------------------------------------------------------------------------------------------

#: The queue the suites are written for unless they say otherwise: early 2023, where a finished job is kept
#: with its status (``generations.QUEUE_GENERATIONS``), beside the newest cache. The simulator's default is
#: the newest queue, whose finished jobs are deleted.
QUEUE_GENERATION = OLDEST_QUEUE_GENERATION
CACHE_GENERATION = NEWEST_CACHE_GENERATION


def job_document(*args: Any, **fields: Any) -> JobDocument:
    """``simulator.job_document`` in :data:`QUEUE_GENERATION` unless ``generation`` says otherwise."""
    return shapes.job_document(*args, **{"generation": QUEUE_GENERATION, **fields})


def workload(**fields: Any) -> Workload:
    """``simulator.Workload`` in :data:`QUEUE_GENERATION` and :data:`CACHE_GENERATION` unless told otherwise."""
    return Workload(**{"generation": QUEUE_GENERATION, "cache_generation": CACHE_GENERATION, **fields})


T = TypeVar("T")


def found(value: T | None) -> T:
    """A document (or any value) the test knows is there: ``find_one``'s None would fail the test anyway."""
    assert value is not None
    return value


def raw(collection: Collection[Any]) -> Collection[Mapping[str, Any]]:
    """``collection`` written and read as documents of any shape: the malformed ones a test writes on purpose, which
    the collection's shape does not describe."""
    return cast("Collection[Mapping[str, Any]]", collection)


def text(value: dg.MetadataValue[Any]) -> str:
    """A metadata value that holds text (markdown, a path, a text): Dagster types ``.value`` as any value metadata
    may hold."""
    assert isinstance(value.value, str)
    return value.value


def ago(seconds: float) -> dt.datetime:
    return utc_now() - dt.timedelta(seconds=seconds)


def crashed_job(dataset: str = "user/crashed", job_type: str = "/splits", **fields: Any) -> JobDocument:
    """Started 15 minutes ago, its worker silent for 800 s: a zombie under the default policy (300 s timeout)."""
    return job_document(job_type=job_type, dataset=dataset, started_at=ago(900), last_heartbeat=ago(800), **fields)


def healthy_job(dataset: str = "user/healthy", job_type: str = "/splits", **fields: Any) -> JobDocument:
    """Started two minutes ago, beating every minute."""
    return job_document(job_type=job_type, dataset=dataset, started_at=ago(120), last_heartbeat=ago(30), **fields)


def documents(store: Store) -> dict[str, list]:
    """Every job, cache entry and event, in a stable order: equal before and after means nothing was written."""
    return {
        collection.full_name: sorted(collection.find(), key=lambda doc: str(doc[ID]))
        for collection in (store.jobs, store.cache, store.events)
    }


def opcounters(client: MongoClient) -> dict[str, int]:
    """The server's own count of operations: unchanged means no client of any process read or wrote."""
    counters = client.admin.command("serverStatus").get("opcounters", {})
    return {name: counters.get(name) for name in ("insert", "query", "update", "delete", "getmore")}


def report_suggesting(
    by_type: dict[str, int], end: dt.datetime = dt.datetime(2024, 3, 8, tzinfo=dt.UTC)
) -> DurationReport:
    """The statistics of a week whose 400 successes per type suggest exactly ``by_type`` (p99 x 1.5, on the readable steps).

    400: enough runs for the p99 to have an upper bound, which a T2 lowered below the current one needs.
    """
    tallies = {
        job_type: Tally(success=np.full(400, seconds / 1.5, dtype=np.float32)) for job_type, seconds in by_type.items()
    }
    report = analyze(
        Period(start=end - dt.timedelta(days=7), end=end, tallies=tallies), ZombiePolicy(), computed_at=end
    )
    assert report.suggested_max_durations() == by_type, "not a suggestion these durations can make"
    return report


# --- the cleanup's steps one at a time, as a run that dies between them leaves its work ----------------------


def plan_for(store: Store, policy: ZombiePolicy, run_id: str = "run", **options: Any) -> CleanupPlan:
    """A run's plan, as its first step makes it (``run.prepare``)."""
    return run.prepare(store, policy, run_id, CleanupOptions(**options)).plan


def find(store: Store, policy: ZombiePolicy, **options: Any) -> Detection:
    """The zombies as a run's find step sees them now (the brake judged unless ``override_brake``)."""
    return run.find(store, plan_for(store, policy, **options))


def cleanup_at(store: Store, policy: ZombiePolicy, at: dt.datetime, run_id: str = "run") -> StepResult:
    """A cleanup as if it ran at ``at`` (the brake overridden): the run's own steps, and every stamp a cleanup takes
    from the wall clock (``finalized_at``, the cache entry's ``updated_at``, the completion) at that moment. What its
    finalize step counted."""
    plan = plan_for(store, policy, run_id, override_brake=True)
    run.reconcile(store, plan, at)
    detection = run.find(store, plan, at)
    generation, cache = plan.generations.required_queue(), plan.generations.cache
    actions = compensations.registry(policy)
    finalizer = Finalizer.build(store, run_id, policy, generation, cache, actions, clock=lambda: at)
    claims = finalizer.claim(detection.candidates, at)
    return StepResult(claims.counts).merge(finalizer.finalize(fresh=claims.ids))


def cache_generation(store: Store) -> CacheGeneration:
    """The cache's generation as a run decides it, in a queue of :data:`QUEUE_GENERATION`."""
    return detect_cache_generation(store.cache, None, QUEUE_GENERATIONS[QUEUE_GENERATION]).generation


def finalizer_for(store: Store, policy: ZombiePolicy, run_id: str = "run") -> Finalizer:
    """The :class:`Finalizer` a run's finalize step builds, for a queue of :data:`QUEUE_GENERATION`.

    ``claim`` then ``finalize()`` are a finalize step; ``finalize(fresh=claims.ids)`` as the step calls it. In
    :data:`QUEUE_GENERATION` a batch of fresh claims costs four writes: the jobs, the cache entries, the retries,
    the events.
    """
    generation = QUEUE_GENERATIONS[QUEUE_GENERATION]
    actions = compensations.registry(policy)
    return Finalizer.build(store, run_id, policy, generation, cache_generation(store), actions)


# --- the commands a client sends ----------------------------------------------------------------------------


#: What a client sends around the commands of the code: handshakes, authentication, ending its sessions.
HANDSHAKES = frozenset(
    {"hello", "ismaster", "isMaster", "ping", "saslStart", "saslContinue", "endSessions", "buildInfo"}
)


class CommandLog(monitoring.CommandListener):
    """Every command a client sends while it listens, but the ``ignored`` ones."""

    WRITES = {"insert", "update", "delete"}

    def __init__(self, ignored: frozenset[str] = frozenset()) -> None:
        self.ignored = ignored
        self.commands: list[dict[str, Any]] = []
        self.names: list[str] = []
        self.written: Counter = Counter()  # collection -> documents the server says were written
        self._targets: dict[int, str] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in self.ignored:
            self.names.append(event.command_name)
            self.commands.append(dict(event.command))
        if event.command_name in self.WRITES:
            self._targets[event.request_id] = event.command[event.command_name]

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        collection = self._targets.pop(event.request_id, None)
        if collection is not None:
            reply = event.reply
            self.written[collection] += reply.get("nModified", reply.get("n", 0)) + len(reply.get("upserted", []))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def named(self, name: str) -> list[dict[str, Any]]:
        """The commands of one kind (``find``, ``insert`` ...), in the order sent."""
        return [command for command, sent in zip(self.commands, self.names) if sent == name]

    def clear(self) -> None:
        self.commands.clear()
        self.names.clear()


@contextlib.contextmanager
def logged_store(mongo_url: str, store: Store) -> Iterator[tuple[Store, CommandLog]]:
    """``store``'s collections through a client of their own whose every command is logged."""
    log = CommandLog()
    client: MongoClient[Document] = MongoClient(mongo_url, tz_aware=True, tzinfo=dt.UTC, event_listeners=[log])
    try:
        yield Store.of(client[store.jobs.database.name], client[store.cache.database.name]), log
    finally:
        client.close()


@contextlib.contextmanager
def logging_every_client(ignored: frozenset[str] = frozenset()) -> Iterator[CommandLog]:
    """A :class:`CommandLog` registered process-wide: it sees the clients Dagster's resources create too."""
    log = CommandLog(ignored)
    monitoring.register(log)
    try:
        yield log
    finally:
        unregister(log)


def unregister(listener: monitoring.CommandListener) -> None:
    """pymongo has no public way to take a process-wide listener back."""
    listeners = getattr(monitoring, "_LISTENERS", None)
    if listeners is not None and listener in listeners.command_listeners:
        listeners.command_listeners.remove(listener)


# --- kill_zombies_job in process ------------------------------------------------------------------------


#: The metrics resource without a gateway: nothing is pushed (tests/defs/test_pushgateway.py pushes to a real one).
METRICS_OFF = {"metrics_gateway": MetricsGateway()}


def databases_from_env(queue_database: str, cache_database: str, **options: Any) -> Databases:
    """The ``databases`` resource as the deployment builds it, its URLs from ``$QUEUE_MONGO_URL`` and
    ``$CACHE_MONGO_URL`` (``EnvVar``), on the given databases."""
    return Databases(
        queue_url=dg.EnvVar(QUEUE_URL_ENV),
        cache_url=dg.EnvVar(CACHE_URL_ENV),
        queue_database=queue_database,
        cache_database=cache_database,
        **options,
    )


def database_resources(store: Store, url_env: str, **options: Any) -> dict[str, Any]:
    """The ``databases`` resource of ``store``'s databases, both URLs from ``$url_env`` (an ``EnvVar``, as the deployment
    gives them); metrics off."""
    databases = Databases(
        queue_url=dg.EnvVar(url_env),
        cache_url=dg.EnvVar(url_env),
        queue_database=store.jobs.database.name,
        cache_database=store.cache.database.name,
        **options,
    )
    return {"databases": databases, **METRICS_OFF}


class LoggedResult(dg.ExecuteInProcessResult):
    """What :func:`run_kill_zombies` returns: ``execute_in_process``'s result, the run's log records attached as ``logs``
    (a type for the checker only: the object is Dagster's own result)."""

    logs: list[EventLogEntry]


def level(record: EventLogEntry) -> int:
    """A log record's level: Dagster stores the number (``coerce_valid_log_level``) where its type says ``str | int``."""
    return cast(int, record.level)


def run_kill_zombies(
    resources: dict[str, Any],
    partition_key: str | None = None,
    instance: dg.DagsterInstance | None = None,
    run_config: dict[str, Any] | None = None,
    **config: Any,
) -> LoggedResult:
    """kill_zombies_job in process, with ``config`` as the cleanup options, never raising.

    Without ``instance``, an in-memory one (0.1 s, where a temporary sqlite one takes 1.8 s); without a
    ``metrics_gateway`` resource, metrics off.
    """
    resources = {**METRICS_OFF, **resources}
    run_config = {"ops": {"plan_and_recover": {"config": config}}, "loggers": QUIET_LOGGERS, **(run_config or {})}
    with contextlib.ExitStack() as stack:
        if instance is None:
            instance = stack.enter_context(dg.DagsterInstance.ephemeral())
        if partition_key is not None:
            assert JOB_TYPE_PARTITIONS.name is not None
            instance.add_dynamic_partitions(JOB_TYPE_PARTITIONS.name, [partition_key])
        result = cast(
            LoggedResult,
            kill_zombies_job.execute_in_process(
                run_config=run_config,
                resources=resources,
                instance=instance,
                partition_key=partition_key,
                raise_on_error=False,
            ),
        )
        result.logs = list(instance.all_logs(result.run_id))
        return result


def recorded_cleanup_run(
    instance: dg.DagsterInstance, status: dg.DagsterRunStatus, queue_database: str | None = None, **tags: str
) -> dg.DagsterRun:
    """A kill_zombies_job run as the run queue holds it: the job's tags (its queue database), in ``status``."""
    run_tags = {**kill_zombies_job.tags, **tags}
    if queue_database is not None:
        run_tags[QUEUE_DATABASE_TAG] = queue_database
    # a queued run names the code location it will be launched from (here the one the deployment serves)
    location = GrpcServerCodeLocationOrigin(host="127.0.0.1", port=4000, location_name="zombie_pipeline")
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), kill_zombies_job.name)
    run = dg.DagsterRun(job_name=kill_zombies_job.name, status=status, tags=run_tags, remote_job_origin=origin)
    return instance.add_run(run)


def step_metadata(result: dg.ExecuteInProcessResult, step: str) -> dict[str, Any]:
    """The output metadata of one op, as plain values."""
    [event] = [e for e in result.events_for_node(step) if e.event_type_value == "STEP_OUTPUT"]
    return {key: value.value for key, value in event.step_output_data.metadata.items()}


def step_failure_messages(result: dg.ExecuteInProcessResult) -> list[str]:
    """The error message of each failed op, followed by the messages of the errors it was caused by (a step whose
    retries ran out fails with Dagster's "Exceeded max_retries", caused by the last attempt's error)."""
    messages = []
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data.error is not None:
            error: SerializableErrorInfo | None = event.step_failure_data.error
            chain: list[str] = []
            while error is not None:
                chain.append(error.message)
                error = error.cause or error.context
            messages.append("".join(chain))
    return messages


def error_text(result: dg.ExecuteInProcessResult) -> str:
    """Every error message of the run's events (op and resource failures, the run's own), with their causes."""
    messages = []
    for event in result.all_events:
        error = getattr(event.event_specific_data, "error", None)
        while error is not None:
            messages.append(error.message)
            error = getattr(error, "cause", None)
    return "\n".join(messages)


def failed_steps(result: dg.ExecuteInProcessResult) -> list[str]:
    return [found(event.step_key) for event in result.all_events if event.is_step_failure]


# --- a process that dies between two writes ---------------------------------------------------------------------


class Crash(Exception):
    """The cleanup process died here."""


@dataclass
class Budget:
    writes: int | None  # None: no crash

    def spend(self) -> None:
        if self.writes is not None:
            if self.writes <= 0:
                raise Crash()
            self.writes -= 1


class CrashingCollection:
    """A collection whose writes stop (the process dies) once the budget is spent."""

    WRITES = {
        "insert_one",
        "insert_many",
        "update_one",
        "update_many",
        "replace_one",
        "bulk_write",
        "delete_one",
        "delete_many",
    }

    def __init__(self, collection, budget: Budget) -> None:
        self._collection = collection
        self._budget = budget

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if name not in self.WRITES:
            return attribute

        def write(*args: Any, **kwargs: Any) -> Any:
            self._budget.spend()
            return attribute(*args, **kwargs)

        return write


def crashing(store: Store, writes: int | None) -> Store:
    """``store`` with every collection sharing one budget of writes."""
    budget = Budget(writes)
    return Store(
        **{
            part.name: cast("Collection[Any]", CrashingCollection(getattr(store, part.name), budget))
            for part in dataclasses.fields(Store)
        }
    )
