"""The witness: the real cleanup, through ``run_cleanup`` (the ops' steps in their order), on a database.

:mod:`.contenders` models when the sensor's cleanup runs finalize a job from :mod:`.rules`; here the same loop hands
the sensor's decision (``monitoring.stale_state``) and each run to the real code instead (:class:`DatabaseCleanup`),
against a queue (the embedded server, or any MongoDB) holding today's generation (2026-05) as the deployment
stores it (``simulation.shapes``). The trace's workers (:class:`QueueWorkers`) write into it only what a look could
see: before each step at virtual time ``t`` they insert the jobs started by then, delete the ones their worker
finished, set ``terminated_at``, and rewrite a job's last heartbeat when the stored one would look stale at ``t`` (or
always, for a job about to be compare-and-set). ``run_cleanup`` asks its step clock (``cleanup.run.StepClock``) for
each step's moment: the replay answers with the step's virtual time, after bringing the workers up to it; every
write of the run is stamped with it. What a run finalized is read from its audit trail (the events it completed),
with the cause each finalization told and what became of its retry.

The section compares the two on one seed (:func:`compare`): the same jobs finalized at the same moments, else the
rules model is wrong. The wall time of each run's finalize step (finalize and compensate) is kept: it is the
measured cost of a finalize batch the watcher's release lag model uses.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId
from pymongo import DeleteOne, InsertOne, MongoClient, UpdateOne

from benchmarks.harness import CommandCounter, new_client
from benchmarks.replay.trace import EPOCH, Job, Lifecycle, Outcome, Trace, moment
from zombie_pipeline.cleanup import run
from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.cleanup.detection import Candidate
from zombie_pipeline.observability import monitoring
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import CacheOutcome, Event, EventState
from zombie_pipeline.queue.jobs import ID, JobDocument, Status
from zombie_pipeline.queue.jobs import Job as JobField
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.shapes import job_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload

GENERATION = "2026-05"


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
        lives: Sequence[Lifecycle],
        exact_within_seconds: float,
    ) -> None:
        self.store, self.trace, self.lives = store, trace, lives
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


@dataclass(frozen=True)
class RunTimes:
    start: float
    find: float
    finalize: float
    done: float


@dataclass(frozen=True)
class Finalized:
    """What a run's audit trail says of one job: its reason and cause, its retry, and whether it cost a failed run."""

    reason: str
    cause: str
    retry: str | None
    costs_run: bool


@dataclass
class RunResult:
    finalized: dict[int, Finalized] = field(default_factory=dict)  # trace job index -> its finalization
    brake: bool = False


def prepare_queue(client: MongoClient, queue_db: str, cache_db: str) -> Store:
    """An empty queue of today's generation as the deployment leaves it: its collections, counters and indexes."""
    store = Store.of(client[queue_db], client[cache_db])
    store.ensure_indexes()
    empty = Workload(
        finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0, waiting=0, generation=GENERATION
    )
    simulate(store, empty, now=EPOCH)
    return store


class DatabaseCleanup:
    """The sensor's decision and its runs, by the real code, on a queue the trace's workers keep up to date."""

    def __init__(self, trace: Trace, lives: Sequence[Lifecycle], policy: ZombiePolicy, url: str, name: str) -> None:
        self.policy = policy
        self.counter = CommandCounter(measure_bytes=False)
        self.workers_client, self.cleanup_client = new_client(url), new_client(url, self.counter)
        self.queue_db, self.cache_db = f"replay_{name}_queue", f"replay_{name}_cache"
        prepare_queue(self.workers_client, self.queue_db, self.cache_db)
        self.store = Store.of(self.cleanup_client[self.queue_db], self.cleanup_client[self.cache_db])
        windows = [policy.heartbeat_timeout_seconds]
        if policy.termination_grace_seconds is not None:
            windows.append(policy.termination_silence_seconds())
        workers_store = Store.of(self.workers_client[self.queue_db], self.workers_client[self.cache_db])
        self.workers = QueueWorkers(workers_store, trace, lives, float(min(windows)))
        self.finalize_seconds: list[float] = []  # wall time of each run's finalize and compensate steps
        self.runs = 0
        self.counter.reset()

    def stale_key(self, t: float) -> str | None:
        """``stale_jobs_sensor``'s decision at ``t``: the run key of the stale jobs, None when there are none."""
        self.workers.sync(t)
        state = monitoring.stale_state(self.store.jobs, self.policy, moment(t))
        return state.run_key if state.count else None

    def run(self, times: RunTimes) -> RunResult:
        """One cleanup run through ``run.run_cleanup``, each step at its virtual moment."""
        self.runs += 1
        run_id = f"replay-{self.runs}-{uuid.uuid4().hex[:6]}"
        moments = {run.Step.RECONCILE: times.start, run.Step.FIND: times.find, run.Step.FINALIZE: times.finalize}
        walls: dict[run.Step, float] = {}

        def clock(step: run.Step, candidates: Sequence[Candidate]) -> dt.datetime:
            walls[step] = time.perf_counter()
            at = moments.get(step, times.done)
            self.workers.sync(at, [self.workers.index_of[candidate.id] for candidate in candidates])
            return moment(at)

        try:
            run.run_cleanup(self.store, self.policy, run_id, clock=clock)
        except run.BrakeEngaged:  # the op fails the run: nothing is written
            return RunResult(brake=True)
        if run.Step.FINALIZE in walls and run.Step.AUDIT in walls:
            self.finalize_seconds.append(walls[run.Step.AUDIT] - walls[run.Step.FINALIZE])
        finalized = {}
        done = self.store.events.find({Event.LEASE_OWNER: run_id, Event.STATE: EventState.DONE})
        for event in done:
            cause = cause_of_event(event)
            written = event.get(Event.CACHE_OUTCOME) == CacheOutcome.WRITTEN
            finalized[self.workers.index_of[event[ID]]] = Finalized(
                event[Event.REASON],
                cause,
                event.get(Event.RETRY_OUTCOME),
                written and cause not in self.policy.costless_causes,
            )
        self.workers.finalized(finalized)
        return RunResult(finalized)

    def counts(self) -> dict[str, Any]:
        return {
            "cleanup_commands": self.counter.total,
            "worker_commands": self.workers.commands,
            "worker_documents_written": self.workers.documents,
        }

    def close(self) -> None:
        self.workers_client.close()
        self.cleanup_client.close()


def compare(model: Outcome, witness: Outcome, tolerance: float = 1.0) -> dict[str, Any]:
    """The rules model's cleanup finalizations against the real cleanup's: jobs finalized by one only, and the
    largest difference in time of those both finalized."""

    def ours(outcome: Outcome) -> dict[int, float]:
        return {
            job: min(f.at for f in finals if f.actor.value == "cleanup")
            for job, finals in outcome.finalizations.items()
            if any(f.actor.value == "cleanup" for f in finals)
        }

    a, b = ours(model), ours(witness)
    both = set(a) & set(b)
    differences = sorted(abs(a[job] - b[job]) for job in both)
    return {
        "finalized_by_model": len(a),
        "finalized_by_real_cleanup": len(b),
        "model_only": sorted(set(a) - set(b))[:20],
        "real_only": sorted(set(b) - set(a))[:20],
        "same_moment": sum(d <= tolerance for d in differences),
        "largest_difference_seconds": differences[-1] if differences else 0.0,
    }
