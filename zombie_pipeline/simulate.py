"""A workload simulator: a queue and a cache that look like a real deployment's.

Finished history spread over days with heavy-tailed, type-specific durations,
workers heartbeating every minute, and every kind of started job the pipeline
must tell apart: healthy, crashed (stale heartbeat), never heartbeated, and
running past its type's maximum duration. Seeded, so a test, the demo and a
benchmark get the same queue every time; written with bulk inserts.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from bson import ObjectId

from zombie_pipeline.cache_entries import key_of
from zombie_pipeline.documents import (
    DEFAULT_ZOMBIE_HTTP_STATUS,
    HTTP_OK,
    Cache,
    ErrorCode,
    Job,
    Priority,
    Status,
    namespace_of,
    truncate_ms,
    unicity_id,
    utc_now,
    without_none,
)
from zombie_pipeline.generations import CACHE_GENERATIONS, NEWEST_CACHE_GENERATION
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.store import Store

HEARTBEAT_INTERVAL_SECONDS = 60
INSERT_BATCH_SIZE = 5_000


@dataclass(frozen=True)
class JobType:
    """A processing step with its own duration law (log-normal: a long right tail)."""

    name: str
    level: str  # "dataset", "config" or "split": which of config/split the job carries
    median_seconds: float
    sigma: float
    error_rate: float


JOB_TYPES: tuple[JobType, ...] = (
    JobType("/config-names", "dataset", 4, 0.7, 0.05),
    JobType("/split-names-from-streaming", "config", 25, 1.0, 0.10),
    JobType("/splits", "dataset", 30, 1.1, 0.08),
    JobType("/first-rows", "split", 70, 1.2, 0.12),
    JobType("/parquet-and-dataset-info", "dataset", 280, 1.0, 0.15),
    JobType("/parquet", "dataset", 3, 0.6, 0.02),  # sigma >= 0.6: p99/p50 = exp(2.33 sigma) > 4
    JobType("/dataset-info", "dataset", 3, 0.6, 0.02),
    JobType("/sizes", "dataset", 2, 0.6, 0.01),
    JobType("/split-names-from-dataset-info", "config", 5, 0.6, 0.03),
)


@dataclass(frozen=True)
class Workload:
    """How many jobs of each kind to create."""

    finished: int = 2_000
    crashed: int = 20  # started, heartbeat stopped long ago
    never_heartbeated: int = 5  # started, no heartbeat at all
    overdue: int = 5  # started, alive, but past its type's maximum duration
    running: int = 50  # started, healthy
    waiting: int = 50
    days: float = 7.0
    seed: int = 0
    policy: ZombiePolicy = field(default_factory=ZombiePolicy)  # the thresholds the simulated zombies break
    cache_generation: str = NEWEST_CACHE_GENERATION
    job_types: tuple[JobType, ...] = JOB_TYPES

    @classmethod
    def from_fractions(
        cls,
        jobs: int,
        crashed_fraction: float = 0.01,
        never_heartbeated_fraction: float = 0.002,
        overdue_fraction: float = 0.002,
        running_fraction: float = 0.02,
        waiting_fraction: float = 0.02,
        **options: Any,
    ) -> "Workload":
        """``jobs`` in all; the fractions say which share of them is in which state."""
        counts = {
            "crashed": round(jobs * crashed_fraction),
            "never_heartbeated": round(jobs * never_heartbeated_fraction),
            "overdue": round(jobs * overdue_fraction),
            "running": round(jobs * running_fraction),
            "waiting": round(jobs * waiting_fraction),
        }
        finished = jobs - sum(counts.values())
        if finished < 0:
            raise ValueError("the fractions add up to more than 1")
        return cls(finished=finished, **counts, **options)

    @property
    def total(self) -> int:
        return self.finished + self.crashed + self.never_heartbeated + self.overdue + self.running + self.waiting



@dataclass
class Simulation:
    """What was written: counts, and the ids of the started jobs by kind, for checks."""

    now: dt.datetime
    jobs_by_status: Counter = field(default_factory=Counter)
    jobs_by_type: Counter = field(default_factory=Counter)
    cache_entries: int = 0
    crashed_ids: list[ObjectId] = field(default_factory=list)
    never_heartbeated_ids: list[ObjectId] = field(default_factory=list)
    overdue_ids: list[ObjectId] = field(default_factory=list)
    running_ids: list[ObjectId] = field(default_factory=list)
    insert_commands: int = 0

    @property
    def zombie_ids(self) -> list[ObjectId]:
        return self.crashed_ids + self.never_heartbeated_ids + self.overdue_ids


class _Generator:
    def __init__(self, workload: Workload, now: dt.datetime) -> None:
        self.workload = workload
        self.now = now
        self.rng = random.Random(workload.seed)
        self.serial = 0

    def seconds_ago(self, seconds: float) -> dt.datetime:
        return truncate_ms(self.now - dt.timedelta(seconds=seconds))

    def object_id(self, moment: dt.datetime) -> ObjectId:
        """ObjectIds ordered by creation time, unique and reproducible for a seed."""
        self.serial += 1
        stamp = int(moment.timestamp()).to_bytes(4, "big")
        return ObjectId(stamp + self.workload.seed.to_bytes(4, "big", signed=False)[-4:] + self.serial.to_bytes(4, "big"))

    def target(self, job_type: JobType, unique: bool) -> tuple[str, str | None, str | None]:
        """A dataset, config and split for a job; ``unique`` ones never share a unicity id."""
        if unique:
            self.serial += 1
            dataset = f"user{self.rng.randrange(200)}/live-{self.serial}"
        else:
            dataset = f"user{self.rng.randrange(200)}/dataset-{self.rng.randrange(2_000)}"
        config = None if job_type.level == "dataset" else self.rng.choice(["default", "en", "fr"])
        split = None if job_type.level != "split" else self.rng.choice(["train", "test", "validation"])
        return dataset, config, split

    def job(self, job_type: JobType, status: str, unique: bool = False, **dates: dt.datetime | None) -> dict[str, Any]:
        dataset, config, split = self.target(job_type, unique)
        created_at = dates.pop("created_at")
        document = {
            "_id": self.object_id(created_at),
            Job.TYPE: job_type.name,
            Job.DATASET: dataset,
            Job.CONFIG: config,
            Job.SPLIT: split,
            Job.UNICITY_ID: unicity_id(job_type.name, dataset, config, split),
            Job.NAMESPACE: namespace_of(dataset),
            Job.FORCE: self.rng.random() < 0.1,
            Job.PRIORITY: Priority.LOW if self.rng.random() < 0.2 else Priority.NORMAL,
            Job.STATUS: status,
            Job.CREATED_AT: created_at,
            **{name: value for name, value in dates.items()},
        }
        return without_none(document)

    def duration(self, job_type: JobType) -> float:
        return job_type.median_seconds * math.exp(self.rng.gauss(0.0, job_type.sigma))

    def last_beat(self, started_at: dt.datetime, until: dt.datetime) -> dt.datetime | None:
        """The last minute-tick heartbeat a worker wrote between start and ``until``."""
        beats = int((until - started_at).total_seconds() // HEARTBEAT_INTERVAL_SECONDS)
        if beats < 1:
            return None
        return started_at + dt.timedelta(seconds=beats * HEARTBEAT_INTERVAL_SECONDS)

    def finished_jobs(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
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
        self, job: dict[str, Any], updated_at: dt.datetime, duration: float, error_code: str | None
    ) -> dict[str, Any]:
        generation = CACHE_GENERATIONS[self.workload.cache_generation]
        failed = error_code is not None
        entry = {
            Cache.KIND: job[Job.TYPE],
            Cache.DATASET: job[Job.DATASET],
            Cache.CONFIG: job.get(Job.CONFIG),
            Cache.SPLIT: job.get(Job.SPLIT),
            Cache.HTTP_STATUS: DEFAULT_ZOMBIE_HTTP_STATUS if failed else HTTP_OK,
            Cache.ERROR_CODE: error_code,
            Cache.CONTENT: {"error": "simulated failure"} if failed else {"rows": self.rng.randrange(1000)},
            Cache.DETAILS: {"error": "simulated failure"} if failed else {},
            Cache.WORKER_VERSION: "1.0.0",
            Cache.JOB_RUNNER_VERSION: 1,
            Cache.DATASET_GIT_REVISION: f"{self.rng.getrandbits(40):010x}",
            Cache.PROGRESS: 1.0,
            Cache.UPDATED_AT: updated_at,
            Cache.DURATION: round(duration, 3),
            Cache.FAILED_RUNS: 1 if failed else 0,
        }
        return generation.keep_declared(entry)

    def started_job(self, kind: str) -> dict[str, Any]:
        w = self.workload
        job_type = self.rng.choice(w.job_types)
        limit = w.policy.max_duration_of(job_type.name)
        timeout = w.policy.heartbeat_timeout_seconds
        if kind == "overdue":  # alive and beating, but far too long
            age = self.rng.uniform(1.2, 3.0) * limit
            last_beat_age = self.rng.uniform(0, HEARTBEAT_INTERVAL_SECONDS)
        elif kind == "running":
            age = self.rng.uniform(0, 0.8 * min(limit, 10 * timeout))
            last_beat_age = min(age, self.rng.uniform(0, HEARTBEAT_INTERVAL_SECONDS))
        else:  # crashed or never heartbeated: dead for more than twice the timeout, not yet overdue
            low = 2 * timeout + 2 * HEARTBEAT_INTERVAL_SECONDS
            age = self.rng.uniform(low, max(low, 0.9 * limit))
            last_beat_age = self.rng.uniform(2 * timeout, age - HEARTBEAT_INTERVAL_SECONDS)
        started_at = self.seconds_ago(age)
        last_heartbeat = None
        if kind != "never_heartbeated" and age - last_beat_age >= HEARTBEAT_INTERVAL_SECONDS:
            last_heartbeat = self.seconds_ago(last_beat_age)
        job = self.job(
            job_type,
            Status.STARTED,
            unique=True,
            created_at=self.seconds_ago(age + self.rng.uniform(0, 300)),
            started_at=started_at,
            last_heartbeat=last_heartbeat,
        )
        if kind == "never_heartbeated" and self.rng.random() < 0.5:
            job[Job.LAST_HEARTBEAT] = None  # some writers store an explicit null
        return job

    def waiting_job(self) -> dict[str, Any]:
        job_type = self.rng.choice(self.workload.job_types)
        return self.job(job_type, Status.WAITING, created_at=self.seconds_ago(self.rng.uniform(0, 3_600)))


def simulate(store: Store, workload: Workload = Workload(), now: dt.datetime | None = None) -> Simulation:
    """Write ``workload`` into the store's jobs and cache and say what was written."""
    if workload.cache_generation not in CACHE_GENERATIONS:
        raise ValueError(f"cache_generation must be one of {sorted(CACHE_GENERATIONS)}")
    now = truncate_ms(now or utc_now())
    generator = _Generator(workload, now)
    result = Simulation(now=now)
    jobs, cache = store.jobs, store.cache

    job_batch: list[dict[str, Any]] = []
    latest_entries: dict[tuple, dict[str, Any]] = {}

    def flush_jobs() -> None:
        if job_batch:
            jobs.insert_many(job_batch, ordered=False)
            result.insert_commands += 1
            job_batch.clear()

    def add(job: dict[str, Any]) -> None:
        job_batch.append(job)
        result.jobs_by_status[job[Job.STATUS]] += 1
        result.jobs_by_type[job[Job.TYPE]] += 1
        if len(job_batch) >= INSERT_BATCH_SIZE:
            flush_jobs()

    for job, entry in generator.finished_jobs():
        add(job)
        key = key_of(entry)
        if key not in latest_entries or latest_entries[key][Cache.UPDATED_AT] < entry[Cache.UPDATED_AT]:
            latest_entries[key] = entry
    for kind, ids, count in (
        ("crashed", result.crashed_ids, workload.crashed),
        ("never_heartbeated", result.never_heartbeated_ids, workload.never_heartbeated),
        ("overdue", result.overdue_ids, workload.overdue),
        ("running", result.running_ids, workload.running),
    ):
        for _ in range(count):
            job = generator.started_job(kind)
            ids.append(job["_id"])
            add(job)
            if generator.rng.random() < 0.5:  # an older result of the same step, from an earlier run
                updated_at = job[Job.STARTED_AT] - dt.timedelta(days=generator.rng.uniform(1, 30))
                entry = generator.cache_entry(job, truncate_ms(updated_at), 10.0, None)
                latest_entries[key_of(entry)] = entry
    for _ in range(workload.waiting):
        add(generator.waiting_job())
    flush_jobs()

    entries = list(latest_entries.values())
    for start in range(0, len(entries), INSERT_BATCH_SIZE):
        cache.insert_many(entries[start : start + INSERT_BATCH_SIZE], ordered=False)
        result.insert_commands += 1
    result.cache_entries = len(entries)
    return result


def job_document(
    job_type: str = "/splits",
    dataset: str = "user/dataset",
    config: str | None = None,
    split: str | None = None,
    status: str = Status.STARTED,
    created_at: dt.datetime | None = None,
    started_at: dt.datetime | None = None,
    finished_at: dt.datetime | None = None,
    last_heartbeat: dt.datetime | None = None,
    priority: str = Priority.NORMAL,
    **extra: Any,
) -> dict[str, Any]:
    """One job in the deployment's own shape, for scenarios that need exact dates."""
    created_at = truncate_ms(created_at or started_at or utc_now())
    document = {
        "_id": ObjectId(),
        Job.TYPE: job_type,
        Job.DATASET: dataset,
        Job.CONFIG: config,
        Job.SPLIT: split,
        Job.UNICITY_ID: unicity_id(job_type, dataset, config, split),
        Job.NAMESPACE: namespace_of(dataset),
        Job.FORCE: False,
        Job.PRIORITY: priority,
        Job.STATUS: status,
        Job.CREATED_AT: created_at,
        Job.STARTED_AT: truncate_ms(started_at) if started_at else None,
        Job.FINISHED_AT: truncate_ms(finished_at) if finished_at else None,
        Job.LAST_HEARTBEAT: truncate_ms(last_heartbeat) if last_heartbeat else None,
        **extra,
    }
    return without_none(document)


def cache_document(
    job: dict[str, Any],
    updated_at: dt.datetime,
    http_status: int = HTTP_OK,
    error_code: str | None = None,
    generation: str = NEWEST_CACHE_GENERATION,
    failed_runs: int = 0,
) -> dict[str, Any]:
    """The cache entry a worker would have written for ``job``, in ``generation``'s fields."""
    entry = {
        Cache.KIND: job[Job.TYPE],
        Cache.DATASET: job[Job.DATASET],
        Cache.CONFIG: job.get(Job.CONFIG),
        Cache.SPLIT: job.get(Job.SPLIT),
        Cache.HTTP_STATUS: http_status,
        Cache.ERROR_CODE: error_code,
        Cache.CONTENT: {"result": "ok"} if http_status == HTTP_OK else {"error": "failed"},
        Cache.DETAILS: {} if http_status == HTTP_OK else {"error": "failed", Cache.FAILED_RUNS: failed_runs},
        Cache.WORKER_VERSION: "2.0.0",
        Cache.JOB_RUNNER_VERSION: 2,
        Cache.DATASET_GIT_REVISION: "abc123",
        Cache.PROGRESS: 1.0,
        Cache.UPDATED_AT: truncate_ms(updated_at),
        Cache.DURATION: 12.5,
        Cache.FAILED_RUNS: failed_runs,
    }
    return CACHE_GENERATIONS[generation].keep_declared(entry)
