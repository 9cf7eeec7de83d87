"""Contenders (b)-(d): this pipeline's real cleanup on a virtual clock, against the trace's workers.

The queue is a database (the embedded server, or any MongoDB) holding today's
generation (2026-05) exactly as the deployment stores it (``simulation.shapes``),
so the cleanup decides the generation from what it reads. The trace's workers
(:class:`QueueWorkers`) write into it only what a cleanup or the sensor could see:
before each look at virtual time ``t`` they insert the jobs started by then and
still running, delete the ones their worker finished (normally, or by
``kill_long_job``), set ``terminated_at``, and write a job's last heartbeat when
the one stored would look stale at ``t`` (or always, for a job about to be
compare-and-set, or SIGTERMed). A job that starts and ends between two looks is
never written: no look could have seen it. The cleanup then sees, at ``t``, the
same verdicts as if every heartbeat had been written (its rules read a heartbeat
only to compare it with ``t`` minus the timeout), for a fraction of the commands.

Dagster is modelled, not run: ``kill_zombies_schedule`` ticks every 10 minutes,
``stale_jobs_sensor`` (contender c, d) every ``sensor_tick_seconds`` with the
sensor's own decision (``monitoring.stale_state``: a count, a run key made from
the stale jobs' ids, never the same key twice, nothing while a cleanup is in
flight), and a run starts ``run start latency`` after it is queued, then runs
``kill_zombies_job``'s steps a few seconds apart (:func:`run_cleanup_at`, the one
function that calls the cleanup). Only the deployment's ``kill_long_job`` stops a
process; ``kill_stuck_jobs`` is off (the pipeline replaces it).

The cleanup stamps ``finalized_at``, the cache entry's ``updated_at`` and
``duration`` and the ``pastJobs`` record with the wall clock
(``events.claim``, ``strategies.finish``, ``finalize._finalize_batch``), not the
``now`` it is given: detection is measured by the virtual time of the step that
finalized each job, never read back from those fields.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from bson import ObjectId
from pymongo import DeleteOne, InsertOne, MongoClient, UpdateOne

from benchmarks.harness import CommandCounter, new_client
from benchmarks.replay_trace import (
    EPOCH,
    Actor,
    Ending,
    Finalization,
    Job,
    Lifecycle,
    MaxDuration,
    Outcome,
    Trace,
    lifecycle,
    moment,
)
from zombie_pipeline import monitoring
from zombie_pipeline.cleanup import run
from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.documents import (
    ID,
    CacheOutcome,
    Cause,
    Event,
    EventState,
    JobDocument,
    Reason,
    Status,
    ZombieEvent,
)
from zombie_pipeline.queue.documents import Job as JobField
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.shapes import job_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload

GENERATION = "2026-05"


@dataclass(frozen=True)
class RunStart:
    """Seconds from a run's request to its first step: ``minimum`` + a log-normal of median ``median - minimum``,
    capped at ``maximum``. The default fits issue 29's measure (PostgreSQL + dagster-daemon on a loaded 2-core
    host: 20-103 s from queued to started, a median detection of 361 s = 300 s + a ~30 s tick wait + ~30 s)."""

    minimum: float = 20.0
    median: float = 30.0
    maximum: float = 103.0
    sigma: float = 1.0

    def draw(self, rng: random.Random) -> float:
        above = max(self.median - self.minimum, 0.0)
        value = self.minimum + (above * math.exp(rng.gauss(0.0, self.sigma)) if above else 0.0)
        return min(value, self.maximum)


@dataclass(frozen=True)
class PipelineSettings:
    """One contender built on the cleanup: its policy, its triggers and the deployment's kill_long_job beside it."""

    name: str
    label: str
    heartbeat_timeout_seconds: int = 300
    max_duration_seconds: int = 2400  # the cleanup's T2 for every type: the chart's maxJobDurationSeconds
    #: Per-type T2 of the cleanup, in force from ``t2_from_seconds`` (d: the statistics' suggestions).
    max_duration_seconds_by_type: tuple[tuple[str, int], ...] = ()
    t2_from_seconds: float = 0.0
    kill_long_job_seconds: float = 2400.0  # the deployment's executors stop a job past this...
    kill_long_job_seconds_later: float | None = None  # ... and past this from t2_from_seconds (d)
    schedule_seconds: float | None = 600.0  # kill_zombies_schedule (*/10): None, off
    sensor_tick_seconds: float | None = None  # stale_jobs_sensor: None, off
    run_start: RunStart = field(default_factory=RunStart)
    #: kill_zombies_job's steps run in one process (in_process_executor): find this long after the run started,
    #: finalize this long after find, the run done (compensate, summarize) this long after finalize.
    find_after_start_seconds: float = 2.0
    finalize_after_find_seconds: float = 1.0
    done_after_finalize_seconds: float = 2.0
    #: Any other ZombiePolicy field (e.g. a SIGTERM rule, once the policy has one), as (name, value) pairs.
    policy_overrides: tuple[tuple[str, Any], ...] = ()
    #: A stored heartbeat older than this is rewritten before a look (default: the shortest window the policy's
    #: rules read it with, the heartbeat timeout or the SIGTERM rule's silence).
    exact_heartbeats_within_seconds: float | None = None
    seed: int = 29

    def policy(self, per_type: bool) -> ZombiePolicy:
        """The cleanup's policy before (``per_type`` False) and after (True) (d)'s suggestions are in force; it knows
        the executors' maximum duration in force then, as an operator sets it."""
        later = self.kill_long_job_seconds_later if per_type else None
        executors = later if later is not None else self.kill_long_job_seconds
        fields: dict[str, Any] = {"deployment_max_job_duration_seconds": math.ceil(executors)}
        policy = ZombiePolicy(
            heartbeat_timeout_seconds=self.heartbeat_timeout_seconds,
            max_duration_seconds=self.max_duration_seconds,
            **{**fields, **dict(self.policy_overrides)},
        )
        return policy.with_max_durations(dict(self.max_duration_seconds_by_type)) if per_type else policy

    def heartbeat_window_seconds(self) -> float:
        policy = self.policy(per_type=False)
        windows = [policy.heartbeat_timeout_seconds]
        if policy.termination_grace_seconds is not None:
            windows.append(policy.termination_silence_seconds())
        return float(min(windows))

    def policy_at(self, seconds: float) -> ZombiePolicy:
        return self.policy(per_type=bool(self.max_duration_seconds_by_type) and seconds >= self.t2_from_seconds)

    @property
    def kill_long_job(self) -> MaxDuration:
        later = self.kill_long_job_seconds_later
        if later is None or later == self.kill_long_job_seconds:
            return MaxDuration(((0.0, self.kill_long_job_seconds),))
        return MaxDuration(((0.0, self.kill_long_job_seconds), (self.t2_from_seconds, later)))

    def described(self) -> dict[str, Any]:
        described = asdict(self)
        described["max_duration_seconds_by_type"] = dict(self.max_duration_seconds_by_type)
        described["policy_overrides"] = dict(self.policy_overrides)
        return described


# --- the trace's workers, as the queue sees them ------------------------------------------------------------


@dataclass
class _Stored:
    """What the queue holds of a job (None: not written yet)."""

    written: bool = False
    beat: float | None = None
    terminated_at: float | None = None
    dirty: bool = False


class QueueWorkers:
    """The trace's workers writing into the queue: only what the next look at the queue can see, batched."""

    START, SIGTERM, REMOVE = 0, 1, 2

    def __init__(
        self,
        store: Store,
        trace: Trace,
        lives: list[Lifecycle],
        outcome: Outcome,
        exact_within_seconds: float,
    ) -> None:
        self.store, self.trace, self.lives, self.outcome = store, trace, lives, outcome
        self.exact_within = exact_within_seconds
        self.ids = [_object_id(job) for job in trace.jobs]
        self.index_of = {oid: job.index for oid, job in zip(self.ids, trace.jobs, strict=True)}
        changes: list[tuple[float, int, int]] = []
        for job, life in zip(trace.jobs, lives, strict=True):
            changes.append((job.start, self.START, job.index))
            if job.sigterm_at is not None and (life.removed_at is None or job.sigterm_at < life.removed_at):
                changes.append((job.sigterm_at, self.SIGTERM, job.index))
            if life.removed_at is not None:
                changes.append((life.removed_at, self.REMOVE, job.index))
        changes.sort()
        self.changes = changes
        self.position = 0
        self.present: dict[int, _Stored] = {}
        self.commands = 0
        self.documents = 0

    def sync(self, t: float, watch: Collection[int] = ()) -> None:
        """Bring the queue to virtual time ``t``: at most one insert, one update and one delete command."""
        deletes = []
        while self.position < len(self.changes) and self.changes[self.position][0] <= t:
            at, kind, index = self.changes[self.position]
            self.position += 1
            if kind == self.START:
                self.present[index] = _Stored()
            elif kind == self.SIGTERM and index in self.present:
                stored = self.present[index]
                stored.terminated_at, stored.dirty = at, True
            elif kind == self.REMOVE:
                if self.lives[index].ending is Ending.KILL_LONG:  # the worker writes its error, whoever came first
                    stopped = Finalization(at, Actor.KILL_LONG, Reason.EXCEEDED_MAX_DURATION, Cause.TIMEOUT)
                    self.outcome.add(index, stopped)
                gone = self.present.pop(index, None)
                if gone is not None and gone.written:
                    deletes.append(DeleteOne({ID: self.ids[index]}))
        inserts: list[InsertOne[JobDocument]] = []
        updates: list[UpdateOne] = []
        for index, stored in self.present.items():
            job, life = self.trace.jobs[index], self.lives[index]
            stale_at = t - self.exact_within
            if (
                stored.terminated_at is not None
                or index in watch
                or not stored.written
                or ((stored.beat if stored.beat is not None else job.start) < stale_at)
            ):
                beat = job.beats.last_before(min(t, life.process_end))
                if beat != stored.beat:
                    stored.beat, stored.dirty = beat, True
            if not stored.written:
                stored.written, stored.dirty = True, False
                inserts.append(InsertOne(self._document(job, stored)))
            elif stored.dirty:
                stored.dirty = False
                values = {
                    JobField.LAST_HEARTBEAT: _stored(stored.beat),
                    JobField.TERMINATED_AT: _stored(stored.terminated_at),
                }
                updates.append(
                    UpdateOne({ID: self.ids[index]}, {"$set": {k: v for k, v in values.items() if v is not None}})
                )
        operations = inserts + updates + deletes
        if operations:
            self.store.jobs.bulk_write(operations, ordered=False)
            self.commands += bool(inserts) + bool(updates) + bool(deletes)
            self.documents += len(operations)

    def finalized(self, indices: Collection[int]) -> None:
        """The cleanup deleted these jobs: their workers' later writes would match nothing."""
        for index in indices:
            self.present.pop(index, None)

    def _document(self, job: Job, stored: _Stored) -> JobDocument:
        return job_document(
            job.job_type,
            job.dataset,
            job.config,
            job.split,
            status=Status.STARTED,
            generation=GENERATION,
            revision=job.revision,
            difficulty=job.difficulty,
            created_at=moment(job.created),
            started_at=moment(job.start),
            last_heartbeat=_stored(stored.beat),
            terminated_at=_stored(stored.terminated_at),
            _id=self.ids[job.index],
        )


def _stored(seconds: float | None) -> dt.datetime | None:
    return moment(seconds) if seconds is not None else None


def _object_id(job: Job) -> ObjectId:
    """Ordered by creation like the deployment's ids, unique by the job's index."""
    stamp = int(moment(job.created).timestamp())
    return ObjectId(stamp.to_bytes(4, "big") + job.index.to_bytes(8, "big"))


# --- one cleanup run, each step at its virtual moment ---------------------------------------------------------


@dataclass(frozen=True)
class RunTimes:
    start: float
    find: float
    finalize: float
    done: float


@dataclass(frozen=True)
class Finalized:
    """What a run's event says of one job: its reason and cause, its retry, and whether it cost a failed run."""

    reason: str
    cause: str
    retry: str | None
    costs_run: bool


@dataclass
class RunResult:
    finalized: dict[ObjectId, Finalized] = field(default_factory=dict)  # job id -> its finalization
    candidates: int = 0
    brake: bool = False


def run_cleanup_at(
    store: Store, policy: ZombiePolicy, run_id: str, times: RunTimes, before: Callable[[float, Collection[Any]], None]
) -> RunResult:
    """The contender adapter: ``kill_zombies_job``'s steps (``cleanup.run``), each with ``now`` = its virtual moment,
    ``before(t, watched ids)`` bringing the workers' writes up to it first. What was finalized comes from the audit
    trail (this run's done events), not from the fields the cleanup stamps."""
    before(times.start, ())
    plan = run.prepare(store, policy, run_id).plan
    run.reconcile(store, plan, moment(times.start))
    before(times.find, ())
    detection = run.find(store, plan, moment(times.find))
    if detection.stopped_by_brake:  # the op fails the run: nothing is written
        return RunResult(candidates=len(detection.candidates), brake=True)
    before(times.finalize, [candidate.id for candidate in detection.candidates])
    run.finalize(store, plan, detection.candidates, moment(times.finalize))
    run.compensate(store, plan)
    fields = {ID: 1, Event.REASON: 1, Event.CAUSE: 1, Event.RETRY_OUTCOME: 1, Event.CACHE_OUTCOME: 1}
    done = store.events.find({Event.LEASE_OWNER: run_id, Event.STATE: EventState.DONE}, fields)
    return RunResult({event[ID]: _finalized(event, policy) for event in done}, len(detection.candidates))


def _finalized(event: ZombieEvent, policy: ZombiePolicy) -> Finalized:
    """An event's finalization; its error entry counted a failed run where it was written and its cause costs one
    (``cache_errors``: a deploy death's keeps the count it had, under the default policy)."""
    cause = cause_of_event(event)
    written = event.get(Event.CACHE_OUTCOME) == CacheOutcome.WRITTEN
    return Finalized(
        event[Event.REASON], cause, event.get(Event.RETRY_OUTCOME), written and cause not in policy.costless_causes
    )


# --- the contender: triggers, runs, the workers between them -------------------------------------------------


def prepare_queue(client: MongoClient, queue_db: str, cache_db: str) -> Store:
    """An empty queue of today's generation as the deployment leaves it: its collections, counters and indexes."""
    store = Store.of(client[queue_db], client[cache_db])
    store.ensure_indexes()
    empty = Workload(
        finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0, waiting=0, generation=GENERATION
    )
    simulate(store, empty, now=EPOCH)
    return store


def replay_pipeline(
    trace: Trace,
    settings: PipelineSettings,
    url: str,
    queue_db: str = "replay_queue",
    cache_db: str = "replay_cache",
    log: Callable[[str], None] = lambda _line: None,
) -> Outcome:
    """Replay ``trace`` against the cleanup as ``settings`` runs it, in fresh databases ``queue_db``/``cache_db``."""
    started = time.perf_counter()
    kill_long = settings.kill_long_job
    outcome = Outcome(settings.name, kill_long, settings=settings.described())
    lives = [lifecycle(job, kill_long) for job in trace.jobs]
    counter = CommandCounter(measure_bytes=False)
    workers_client, cleanup_client = new_client(url), new_client(url, counter)
    try:
        prepare_queue(workers_client, queue_db, cache_db)
        workers_store = Store.of(workers_client[queue_db], workers_client[cache_db])
        store = Store.of(cleanup_client[queue_db], cleanup_client[cache_db])
        exact = settings.exact_heartbeats_within_seconds or settings.heartbeat_window_seconds()
        workers = QueueWorkers(workers_store, trace, lives, outcome, exact)
        counter.reset()
        counts = _drive(trace, settings, store, workers, outcome, log)
        counts.update(
            cleanup_commands=counter.total,
            worker_commands=workers.commands,
            worker_documents_written=workers.documents,
        )
        outcome.counts = counts
    finally:
        workers_client.close()
        cleanup_client.close()
    outcome.wall_seconds = time.perf_counter() - started
    return outcome


def _drive(
    trace: Trace,
    settings: PipelineSettings,
    store: Store,
    workers: QueueWorkers,
    outcome: Outcome,
    log: Callable[[str], None],
) -> dict[str, int]:
    """The schedule's and the sensor's ticks in virtual time; each run's steps at once, in flight until done."""
    rng = random.Random(settings.seed * 31)  # the same draws for every contender, as long as they launch alike
    end = trace.settings.end
    schedule = settings.schedule_seconds or math.inf
    tick = settings.sensor_tick_seconds
    next_tick = rng.uniform(0.0, tick) if tick else math.inf
    busy_until = -math.inf
    run_keys: set[str] = set()
    counts = {"runs": 0, "runs_by_schedule": 0, "runs_by_sensor": 0, "brake_engaged": 0, "sensor_ticks": 0}
    counts.update(candidates=0, finalized=0)
    progress = 0.0
    while True:
        t = min(schedule, next_tick)
        if t > end:
            break
        if t == schedule:
            schedule += settings.schedule_seconds or math.inf
            trigger = "schedule" if t >= busy_until else None
        else:
            next_tick += tick or math.inf
            trigger = None
            if t >= busy_until:  # the sensor counts first, then skips while a cleanup is in flight
                counts["sensor_ticks"] += 1
                workers.sync(t)
                state = monitoring.stale_state(store.jobs, settings.policy_at(t), moment(t))
                if state.count and state.run_key not in run_keys:
                    run_keys.add(state.run_key)
                    trigger = "sensor"
        if trigger is None:
            continue
        start = t + settings.run_start.draw(rng)
        find = start + settings.find_after_start_seconds
        finalize = find + settings.finalize_after_find_seconds
        times = RunTimes(start, find, finalize, finalize + settings.done_after_finalize_seconds)
        busy_until = times.done
        counts["runs"] += 1
        counts[f"runs_by_{trigger}"] += 1
        result = run_cleanup_at(
            store,
            settings.policy_at(start),
            f"replay-{settings.name}-{counts['runs']}",
            times,
            lambda at, ids: workers.sync(at, [workers.index_of[i] for i in ids]),
        )
        counts["candidates"] += result.candidates
        counts["brake_engaged"] += result.brake
        finalized = {workers.index_of[job_id]: done for job_id, done in result.finalized.items()}
        for index, done in finalized.items():
            outcome.add(
                index,
                Finalization(times.finalize, Actor.CLEANUP, done.reason, done.cause, done.retry, done.costs_run),
            )
        counts["finalized"] += len(finalized)
        workers.finalized(finalized)
        if t - progress >= 86_400:
            progress = t
            log(f"  ({settings.name}) day {t / 86_400:.0f}: {counts['runs']} runs, {counts['finalized']} finalized")
    return counts


def job_ids(trace: Trace) -> Mapping[ObjectId, int]:
    """The database id of every job of the trace (for tests)."""
    return {_object_id(job): job.index for job in trace.jobs}
