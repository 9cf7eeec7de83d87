"""A workload simulator: a queue and a cache as a deployment of any generation leaves them.

Finished history spread over days with heavy-tailed, type-specific durations,
workers heartbeating every minute, and every kind of started job the pipeline
must tell apart: healthy, crashed (stale heartbeat), never heartbeated,
terminated (SIGTERM, then silence) and running past its type's maximum
duration. Each document has exactly the fields of its generation; where
finished jobs are deleted, the history lives in the cache entries (and the
last hour in ``pastJobs``); the locks, counters and indexes are the ones that
generation's deployment keeps. Seeded, so a test, the demo and a benchmark get
the same queue every time; written with bulk inserts.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId

from zombie_pipeline.queue.cache import (
    CACHE_CONTENT_ERROR,
    DEFAULT_ZOMBIE_HTTP_STATUS,
    HTTP_OK,
    Cache,
    CacheEntry,
    ErrorCode,
)
from zombie_pipeline.queue.cache_entries import key_of
from zombie_pipeline.queue.generations import DurationsSource, QueueGeneration
from zombie_pipeline.queue.indexes import CACHE_UPDATED_INDEX
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Priority, Status
from zombie_pipeline.queue.locks import GIT_BRANCH_LOCK_TTL_SECONDS, START_LOCK_TTL_SECONDS, Lock
from zombie_pipeline.queue.past_jobs import PAST_JOB_MIN_SECONDS, PAST_JOBS_TTL, PastJob
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms, utc_now
from zombie_pipeline.simulation.deployment_writes import DeploymentWrites
from zombie_pipeline.simulation.history import OFFENDER, PastCleanups, clean_past_days
from zombie_pipeline.simulation.marks import SimulationMark, marks, simulated_generation
from zombie_pipeline.simulation.ownership import NotOurs, check_ours
from zombie_pipeline.simulation.shapes import cache_document, job_document
from zombie_pipeline.simulation.workload import STARTED_KINDS, JobType, Workload

HEARTBEAT_INTERVAL_SECONDS = 60
INSERT_BATCH_SIZE = 5_000
#: The kinds of started jobs whose worker is dead: today's die one at a time (``Generator.started_job``'s slot).
DEAD_KINDS = frozenset({"crashed", "never_heartbeated", "terminated"})


@dataclass
class Simulation:
    """What was written: counts, and the ids of the started jobs by kind, for checks."""

    now: dt.datetime
    generation: str
    jobs_by_status: Counter[Any] = field(default_factory=Counter)
    jobs_by_type: Counter[Any] = field(default_factory=Counter)
    cache_entries: int = 0
    past_jobs: int = 0
    ids: dict[str, list[ObjectId]] = field(default_factory=lambda: {kind: [] for kind in STARTED_KINDS})
    insert_commands: int = 0
    past: PastCleanups | None = None  # the past days' cleanups, when the workload asked for them

    @property
    def crashed_ids(self) -> list[ObjectId]:
        return self.ids["crashed"]

    @property
    def never_heartbeated_ids(self) -> list[ObjectId]:
        return self.ids["never_heartbeated"]

    @property
    def terminated_ids(self) -> list[ObjectId]:
        return self.ids["terminated"]

    @property
    def overdue_ids(self) -> list[ObjectId]:
        return self.ids["overdue"]

    @property
    def running_ids(self) -> list[ObjectId]:
        return self.ids["running"]

    @property
    def zombie_ids(self) -> list[ObjectId]:
        return self.crashed_ids + self.never_heartbeated_ids + self.terminated_ids + self.overdue_ids


class _Generator:
    def __init__(self, workload: Workload, now: dt.datetime, run: int = 0) -> None:
        self.workload = workload
        self.generation = workload.queue_generation
        self.now = now
        self.rng = random.Random(workload.seed)
        self.serial = 0
        self.run = run  # the how-manieth simulation into these databases: ids never collide with an earlier one

    def seconds_ago(self, seconds: float) -> dt.datetime:
        return truncate_ms(self.now - dt.timedelta(seconds=seconds))

    def object_id(self, moment: dt.datetime) -> ObjectId:
        """ObjectIds ordered by creation time, unique and reproducible for a seed."""
        self.serial += 1
        stamp = int(moment.timestamp()).to_bytes(4, "big")
        origin = (self.workload.seed % 65_536).to_bytes(2, "big") + (self.run % 65_536).to_bytes(2, "big")
        return ObjectId(stamp + origin + self.serial.to_bytes(4, "big"))

    def target(self, job_type: JobType, unique: bool) -> tuple[str, str | None, str | None]:
        """A dataset, config and split for a job; ``unique`` ones never share a unicity id."""
        if unique:
            self.serial += 1
            serial = f"{self.run}-{self.serial}" if self.run else str(self.serial)  # not a name an earlier run gave
            dataset = f"user{self.rng.randrange(200)}/live-{serial}"
        else:
            dataset = f"user{self.rng.randrange(200)}/dataset-{self.rng.randrange(2_000)}"
        config = None if job_type.level == "dataset" else self.rng.choice(["default", "en", "fr"])
        split = None if job_type.level != "split" else self.rng.choice(["train", "test", "validation"])
        return dataset, config, split

    def job(self, job_type: JobType, status: str, unique: bool = False, **dates: dt.datetime | None) -> JobDocument:
        dataset, config, split = self.target(job_type, unique)
        created_at = dates.pop("created_at")
        assert created_at is not None, "a simulated job is always created at some time"
        return job_document(
            job_type.name,
            dataset,
            config,
            split,
            status=status,
            generation=self.generation,
            revision=f"{self.rng.getrandbits(40):010x}",
            difficulty=job_type.difficulty,
            force=self.rng.random() < 0.1,
            priority=Priority.LOW if self.rng.random() < 0.2 else Priority.NORMAL,
            created_at=created_at,
            _id=self.object_id(created_at),
            **dates,
        )

    def duration(self, job_type: JobType) -> float:
        return job_type.median_seconds * math.exp(self.rng.gauss(0.0, job_type.sigma))

    def last_beat(self, started_at: dt.datetime, until: dt.datetime) -> dt.datetime | None:
        """The last minute-tick heartbeat a worker wrote between start and ``until``."""
        beats = int((until - started_at).total_seconds() // HEARTBEAT_INTERVAL_SECONDS)
        if beats < 1:
            return None
        return started_at + dt.timedelta(seconds=beats * HEARTBEAT_INTERVAL_SECONDS)

    def finished_jobs(self) -> Iterator[tuple[JobDocument, CacheEntry]]:
        """Finished jobs, each with the cache entry it wrote."""
        w = self.workload
        span = w.days * 86_400
        for _ in range(w.finished):
            job_type = self.rng.choice(w.job_types)
            finished_ago = self.rng.uniform(60, span)  # history is in the past, however long the job ran
            duration = self.duration(job_type)
            limit = w.policy.max_duration_of(job_type.name)
            killed = duration > limit  # the history's own killer stopped it: a censored duration
            duration = min(duration, limit)
            started_at = self.seconds_ago(finished_ago + duration)
            finished_at = truncate_ms(started_at + dt.timedelta(seconds=duration))
            failed = killed or self.rng.random() < job_type.error_rate
            job = self.job(
                job_type,
                Status.ERROR if failed else Status.SUCCESS,
                created_at=self.seconds_ago((self.now - started_at).total_seconds() + self.rng.uniform(0, 120)),
                started_at=started_at,
                finished_at=finished_at,
                last_heartbeat=self.last_beat(started_at, finished_at),
            )
            error_code = ErrorCode.EXCEEDED_MAX_DURATION if killed else ("UnexpectedError" if failed else None)
            yield job, self.cache_entry(job, finished_at, duration, error_code)

    def cache_entry(
        self, job: JobDocument, updated_at: dt.datetime, duration: float, error_code: str | None
    ) -> CacheEntry:
        failed = error_code is not None
        return cache_document(
            job,
            updated_at,
            http_status=DEFAULT_ZOMBIE_HTTP_STATUS if failed else HTTP_OK,
            error_code=error_code,
            generation=self.workload.cache.name,
            failed_runs=1 if failed else 0,
            duration=round(duration, 3),
            content={CACHE_CONTENT_ERROR: "simulated failure"} if failed else {"rows": self.rng.randrange(1000)},
        )

    def started_job_at(self, kind: str, moment: dt.datetime) -> JobDocument:
        """A started job of ``kind`` as it stands at ``moment`` (a past day's zombie)."""
        present, self.now = self.now, moment
        try:
            return self.started_job(kind)
        finally:
            self.now = present

    def offender_job(self, moment: dt.datetime) -> JobDocument:
        """The repeat offender's job of a day: started 15 minutes before ``moment``, silent for the last 10."""
        job_type, dataset, config, split = OFFENDER
        created_at = truncate_ms(moment - dt.timedelta(minutes=17))
        return job_document(
            job_type,
            dataset,
            config,
            split,
            status=Status.STARTED,
            generation=self.generation,
            revision=f"{self.rng.getrandbits(40):010x}",
            difficulty=next((t.difficulty for t in self.workload.job_types if t.name == job_type), 50),
            created_at=created_at,
            started_at=truncate_ms(moment - dt.timedelta(minutes=15)),
            last_heartbeat=truncate_ms(moment - dt.timedelta(minutes=10)),
            _id=self.object_id(created_at),
        )

    def started_job(self, kind: str, slot: tuple[int, int] | None = None) -> JobDocument:
        """A started job of ``kind`` now. ``slot`` (k of n): a dead job's last sign of life (its last heartbeat, or
        its start) in the k-th of n equal spans of the range dead jobs die in, so that today's dead workers died one
        at a time, never in a wave the cleanup would take for a deploy (``cleanup.causes``)."""
        w = self.workload
        job_type = self.rng.choice(w.job_types)
        limit = w.policy.max_duration_of(job_type.name)
        timeout = w.policy.heartbeat_timeout_seconds
        beat = min(HEARTBEAT_INTERVAL_SECONDS, timeout / 3)  # workers beat well within the timeout, however short
        terminated_at = None
        if kind == "overdue":  # alive and beating, but far too long
            age = self.rng.uniform(1.2, 3.0) * limit
            last_beat_age = self.rng.uniform(0, beat)
        elif kind == "running":
            age = self.rng.uniform(0, 0.8 * min(limit, 10 * timeout))
            last_beat_age = min(age, self.rng.uniform(0, beat))
        else:  # crashed, never heartbeated or terminated: dead for more than twice the timeout, not yet overdue
            low = 2 * timeout + 2 * beat
            high = max(low, 0.9 * limit)
            age = self.rng.uniform(low, high)
            last_beat_age = self.rng.uniform(2 * timeout, age - beat)
            if slot is not None:
                k, n = slot
                if kind == "never_heartbeated":  # its sign of life is its start
                    age = low + (k + (age - low) / max(high - low, 1e-9)) * (high - low) / n
                else:
                    last_low, last_high = 2 * timeout, high - beat
                    share = (last_beat_age - last_low) / max(age - beat - last_low, 1e-9)
                    last_beat_age = last_low + (k + share) * (last_high - last_low) / n
                    age = max(age, last_beat_age + beat)
            if kind == "terminated":
                terminated_at = self.seconds_ago(last_beat_age - self.rng.uniform(0, beat))
        started_at = self.seconds_ago(age)
        last_heartbeat = None
        if (
            kind != "never_heartbeated" and age - last_beat_age >= beat - 1e-6
        ):  # a slot's age is its beat + one interval
            last_heartbeat = self.seconds_ago(last_beat_age)
        job = self.job(
            job_type,
            Status.STARTED,
            unique=True,
            created_at=self.seconds_ago(age + self.rng.uniform(0, 300)),
            started_at=started_at,
            last_heartbeat=last_heartbeat,
            terminated_at=terminated_at,
        )
        if kind == "never_heartbeated" and self.rng.random() < 0.5 and self.generation.null_heartbeats:
            job[Job.LAST_HEARTBEAT] = None  # an explicit null, as an update that set None writes it
        return job

    def waiting_job(self) -> JobDocument:
        job_type = self.rng.choice(self.workload.job_types)
        return self.job(job_type, Status.WAITING, created_at=self.seconds_ago(self.rng.uniform(0, 3_600)))

    def start_lock(self, job: JobDocument) -> dict[str, Any] | None:
        """The lock a start leaves behind: released as soon as the job started (2023-06-26 on)."""
        fields = self.generation.lock_fields
        if Lock.OWNER not in fields:
            return None
        lock: dict[str, Any] = {ID: job[Job.UNICITY_ID], Lock.OWNER: None, Lock.UPDATED_AT: job[Job.STARTED_AT]}
        if Lock.TTL in fields:
            lock[Lock.TTL] = START_LOCK_TTL_SECONDS
        return lock

    def git_branch_lock(self, job: JobDocument) -> dict[str, Any]:
        """A lock a job holds while it writes to its dataset's git branch (a crashed job never frees it)."""
        fields = self.generation.lock_fields
        owner = Lock.OWNER if Lock.OWNER in fields else Lock.JOB_ID
        lock: dict[str, Any] = {
            ID: f'{{"dataset": "{job[Job.DATASET]}", "branch": "refs/convert/parquet"}}',
            owner: str(job[ID]),
        }
        lock[Lock.UPDATED_AT] = job[Job.STARTED_AT]
        if Lock.TTL in fields:
            lock[Lock.TTL] = GIT_BRANCH_LOCK_TTL_SECONDS
        if Lock.CREATED_AT in fields and Lock.OWNER not in fields:
            lock[Lock.CREATED_AT] = job[Job.STARTED_AT]
        return lock


def simulate(
    store: Store,
    workload: Workload = Workload(),
    now: dt.datetime | None = None,
    overwrite: str | None = None,
    progress: Callable[[str], None] = lambda doing: None,
) -> Simulation:
    """Write ``workload`` into the store's collections, as its generation's deployment would, and say what was written.

    A database holding documents the simulator did not write is refused (:func:`check_ours`). ``progress`` is told
    each step, for a database error to name it. The marker goes first: a simulation cut short is still ours.
    """
    progress("reading what the databases hold")
    check_ours(store, overwrite)
    present = simulated_generation(store)
    if present is not None and present != workload.generation:
        raise NotOurs(
            f"these databases hold a simulated {present} queue; drop it first to simulate a {workload.generation} one (--drop)"
        )
    now = truncate_ms(now or utc_now())
    markers = marks(store)
    run = markers.count_documents({})
    progress("marking the databases as the simulator's")
    markers.insert_one(
        {
            ID: ObjectId(),
            SimulationMark.GENERATION: workload.generation,
            SimulationMark.SEED: workload.seed,
            SimulationMark.AT: now,
        }
    )
    generator = _Generator(workload, now, run)
    generation = workload.queue_generation
    result = Simulation(now=now, generation=generation.name, insert_commands=1)
    job_batch: list[JobDocument] = []
    latest_entries: dict[tuple[Any, ...], CacheEntry] = {}
    past_jobs: list[dict[str, Any]] = []
    locks: list[dict[str, Any]] = []
    holder: JobDocument | None = None  # a crashed job that dies holding a git-branch lock

    def flush_jobs() -> None:
        if job_batch:
            store.jobs.insert_many(job_batch, ordered=False)
            result.insert_commands += 1
            job_batch.clear()

    def add(job: JobDocument) -> None:
        job_batch.append(job)
        result.jobs_by_status[job[Job.STATUS]] += 1
        result.jobs_by_type[job[Job.TYPE]] += 1
        if len(job_batch) >= INSERT_BATCH_SIZE:
            flush_jobs()

    progress(f"writing the finished history ({workload.finished} jobs)")
    for job, entry in generator.finished_jobs():
        if generation.durations_source is DurationsSource.FINISHED_JOBS:  # the queue keeps its history
            add(job)
        else:
            past_jobs += _past_job(job, entry[Cache.UPDATED_AT], now)
        key = key_of(entry)
        if key not in latest_entries or latest_entries[key][Cache.UPDATED_AT] < entry[Cache.UPDATED_AT]:
            latest_entries[key] = entry
    if workload.past_cleanups:  # the cleanups of the past days, by the cleanup's own code, before today's jobs
        flush_jobs()
        progress(f"cleaning the {workload.past_cleanups} days before today, as their daily cleanups did")
        _create_side(store, generation)
        result.past = clean_past_days(
            store,
            generation,
            workload.cache,
            workload.policy,
            workload.past_cleanups,
            now,
            generator.started_job_at,
            generator.offender_job,
            generator.rng,
        )
    progress("writing today's started and waiting jobs")
    slots = _spread_slots(workload.crashed + workload.never_heartbeated + workload.terminated_jobs)
    for kind in STARTED_KINDS:
        count = workload.terminated_jobs if kind == "terminated" else getattr(workload, kind)
        for _ in range(count):
            job = generator.started_job(kind, next(slots) if kind in DEAD_KINDS else None)
            result.ids[kind].append(job[ID])
            holder = holder or (job if kind == "crashed" else None)
            add(job)
            lock = generator.start_lock(job)
            if lock is not None:
                locks.append(lock)
            if generator.rng.random() < 0.5:  # an older result of the same step, from an earlier run
                updated_at = job[Job.STARTED_AT] - dt.timedelta(days=generator.rng.uniform(1, 30))
                entry = generator.cache_entry(job, truncate_ms(updated_at), 10.0, None)
                latest_entries[key_of(entry)] = entry
    if holder is not None and generation.lock_fields:
        locks.append(generator.git_branch_lock(holder))
    for _ in range(workload.waiting):
        add(generator.waiting_job())
    flush_jobs()

    entries = list(latest_entries.values())
    if generation.cache_updated_index:  # before the entries: built on thousands of them, it took 20x longer under load
        progress(f"creating the cache's index {CACHE_UPDATED_INDEX.name}")
        CACHE_UPDATED_INDEX.create(store.cache)
    progress(f"writing {len(entries)} cache entries")
    for start in range(0, len(entries), INSERT_BATCH_SIZE):
        store.cache.insert_many(entries[start : start + INSERT_BATCH_SIZE], ordered=False)
        result.insert_commands += 1
    result.cache_entries = len(entries)
    progress("writing the locks, pastJobs and counters")
    result.insert_commands += _write_side(store, generation, locks, past_jobs)
    result.past_jobs = len(past_jobs)
    return result


def _spread_slots(n: int) -> Iterator[tuple[int, int]]:
    """Slots (k of n) for n dead jobs made kind after kind, interleaved so that no kind dies all in one span: k steps
    by a stride coprime with n (about 0.618 n)."""
    stride = max(1, round(0.618 * n))
    while n > 1 and math.gcd(stride, n) != 1:
        stride += 1
    for index in range(n):
        yield (index * stride) % n, n


def _past_job(job: JobDocument, finished_at: dt.datetime, now: dt.datetime) -> list[dict[str, Any]]:
    """The ``pastJobs`` record of a run that finished within the last hour and lasted long enough."""
    seconds = int((finished_at - job[Job.STARTED_AT]).total_seconds())
    if now - finished_at > PAST_JOBS_TTL or seconds < PAST_JOB_MIN_SECONDS:
        return []
    return [
        {ID: ObjectId(), PastJob.DATASET: job[Job.DATASET], PastJob.DURATION: seconds, PastJob.FINISHED_AT: finished_at}
    ]


def _write_side(
    store: Store, generation: QueueGeneration, locks: list[dict[str, Any]], past_jobs: list[dict[str, Any]]
) -> int:
    """The deployment's collections around the queue: locks, rate limiter and counters.

    Returns the insert commands sent."""
    inserts = 0
    _create_side(store, generation)
    if locks:
        store.locks.insert_many(locks)
        inserts += 1
    if past_jobs and generation.keeps(store.past_jobs.name):
        store.past_jobs.insert_many(past_jobs)
        inserts += 1
    DeploymentWrites(store, generation).set_counters()
    return inserts


def _create_side(store: Store, generation: QueueGeneration) -> None:
    """The deployment's collections around the queue, empty, where they are missing."""
    existing = store.queue_collection_names()
    for name in generation.side_collections - existing - {store.cache_metrics.name}:
        store.jobs.database.create_collection(name)
    if generation.cache_metrics and not store.has_cache_metrics():
        store.cache.database.create_collection(store.cache_metrics.name)
