"""Simulated live workers: a queue that moves, as a deployment's workers move it.

Each worker takes the oldest waiting job whose user (namespace) runs nothing
yet, starts it as the deployment does (the start lock, a compare-and-set from
waiting, the counters), heartbeats every ``heartbeat_seconds``, and finishes it
after a duration drawn from its type's law: the cache entry first, then the job
finished as the generation finishes one (kept with its status, or deleted with
the counters, ``pastJobs`` and the lock). At the configured rates a worker
crashes (it stops heartbeating and never finishes: a zombie) or runs on past
its type's maximum duration. New waiting jobs arrive so the queue never dries up.

Time is real: heartbeats and thresholds are the policy's. ``speed`` shortens
the jobs' durations only, so a demo sees many finishes in a few seconds. The
pool reads time through ``clock`` (seconds, for its schedule) and ``now`` (the
dates it writes), so a test can drive it through minutes in a moment.
:meth:`WorkerPool.stop` finishes the jobs still in flight, so a pool that is
stopped leaves no false zombie behind.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pymongo import ReturnDocument

from zombie_pipeline.cleanup.effects import Finished, after_insert, worker_size
from zombie_pipeline.cleanup.strategies import strategy_for
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.cache_entries import failed_runs_after_crash, stored_failed_runs
from zombie_pipeline.queue.documents import (
    DEFAULT_ZOMBIE_HTTP_STATUS,
    HTTP_OK,
    ID,
    JOB_METRICS_COLLECTION,
    LOCKS_COLLECTION,
    WORKER_SIZE_METRICS_COLLECTION,
    Cache,
    CacheMetric,
    Job,
    JobMetric,
    Lock,
    Status,
    WorkerSizeMetric,
    cache_key_of_job,
    utc_now,
)
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, QueueGeneration
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.simulator import (
    JOB_TYPES,
    START_LOCK_TTL_SECONDS,
    JobType,
    WorkloadError,
    job_document,
)


@dataclass(frozen=True)
class WorkerRates:
    """How the simulated workers behave."""

    workers: int = 4
    crash_rate: float = 0.05  # share of jobs whose worker dies without a word
    overrun_rate: float = 0.02  # share of jobs that run past their type's maximum duration
    speed: float = 0.05  # job durations are the type's, times this
    heartbeat_seconds: float = 60.0
    waiting_target: int = 20  # new waiting jobs arrive to keep about this many

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.workers, int) or self.workers < 1:
            problems.append(f"workers must be a positive integer, got {self.workers!r}")
        for name in ("crash_rate", "overrun_rate"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if not self.speed > 0:
            problems.append(f"speed must be positive, got {self.speed!r}")
        if not self.heartbeat_seconds > 0:
            problems.append(f"heartbeat_seconds must be positive, got {self.heartbeat_seconds!r}")
        if problems:
            raise WorkloadError("invalid worker rates: " + "; ".join(problems))


@dataclass
class _Run:
    job: dict[str, Any]
    finish_at: float  # monotonic seconds
    next_beat: float
    crashed: bool
    failed: bool


@dataclass
class WorkerPool:
    """Workers sharing one queue; :meth:`tick` moves each of them one step."""

    store: Store
    generation: QueueGeneration
    policy: ZombiePolicy = field(default_factory=ZombiePolicy)
    rates: WorkerRates = field(default_factory=WorkerRates)
    seed: int = 0
    job_types: tuple[JobType, ...] = JOB_TYPES
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], dt.datetime] = utc_now
    counts: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.runs: list[_Run | None] = [None] * self.rates.workers
        self.strategy = strategy_for(self.store, self.generation)
        self.side = self.strategy.side
        self.cache_generation = CACHE_GENERATIONS[self.generation.cache_generation]
        self.types = {job_type.name: job_type for job_type in self.job_types}
        self._openings: tuple[set, set, list] | None = None

    def adopt_running(self) -> int:
        """Take over the started jobs that look alive (a recent heartbeat or start): their workers are ours now."""
        cutoff = self.now() - dt.timedelta(seconds=self.policy.heartbeat_timeout_seconds)
        alive = self.store.jobs.find(
            {
                Job.STATUS: Status.STARTED,
                Job.TERMINATED_AT: None,
                "$or": [
                    {Job.LAST_HEARTBEAT: {"$gte": cutoff}},
                    {Job.LAST_HEARTBEAT: None, Job.STARTED_AT: {"$gte": cutoff}},
                ],
            }
        )
        now = self.clock()
        adopted = 0
        for job in alive:
            limit = self.policy.max_duration_of(job[Job.TYPE])
            if (self.now() - job[Job.STARTED_AT]).total_seconds() >= limit:
                continue  # already past its maximum duration: a zombie to clean, not a job to run
            job_type = self.types.get(job[Job.TYPE], self.job_types[0])
            seconds = job_type.median_seconds * math.exp(self.rng.gauss(0.0, job_type.sigma)) * self.rates.speed
            self.runs.append(_Run(job, now + seconds, now, False, self.rng.random() < job_type.error_rate))
            adopted += 1
        self.counts["adopted"] += adopted
        return adopted

    # --- the loop ---------------------------------------------------------------------------------

    def tick(self) -> None:
        """One step of every worker: start, heartbeat or finish; then top the waiting jobs up."""
        now = self.clock()
        self._openings = None  # the waiting jobs and the busy users, read once a tick, when a worker looks for work
        beating = []
        for index, run in enumerate(self.runs):
            if index >= self.rates.workers and (run is None or run.crashed):
                self.runs[index] = None  # an adopted job's worker leaves once its job is done
            elif run is None or (run.crashed and now >= run.finish_at):
                self.runs[index] = self._start(now)  # a crashed worker's pod is replaced by a fresh one
            elif not run.crashed and now >= run.finish_at:
                self._finish(run)
                self.runs[index] = None
            elif not run.crashed and now >= run.next_beat:
                beating.append(run)
        self._beat(beating, now)
        self._top_up()

    def run(self, seconds: float, stop: Callable[[], bool] = lambda: False, interval: float = 0.5) -> Counter:
        """Tick for ``seconds`` (or until ``stop()``), then :meth:`stop`."""
        deadline = self.clock() + seconds
        while self.clock() < deadline and not stop():
            self.tick()
            time.sleep(interval)
        self.stop()
        return self.counts

    def stop(self) -> None:
        """Finish the jobs in flight (their workers shut down cleanly); crashed ones stay zombies."""
        for index, run in enumerate(self.runs):
            if run is not None and not run.crashed:
                self._finish(run)
            self.runs[index] = None

    # --- a job's life, as the deployment lives it ----------------------------------------------------

    def _start(self, now: float) -> _Run | None:
        job = self._take_waiting()
        if job is None:
            return None
        job_type = self.types.get(job[Job.TYPE], self.job_types[0])
        limit = self.policy.max_duration_of(job[Job.TYPE])
        seconds = job_type.median_seconds * math.exp(self.rng.gauss(0.0, job_type.sigma)) * self.rates.speed
        if self.rng.random() < self.rates.overrun_rate:
            seconds = limit * self.rng.uniform(1.2, 2.0)
            self.counts["overrunning"] += 1
        crashed = self.rng.random() < self.rates.crash_rate
        self.counts["crashed" if crashed else "started"] += 1
        # a crashed pod is replaced after the heartbeat timeout, as the deployment's would be
        finish_at = now + (2 * self.policy.heartbeat_timeout_seconds if crashed else seconds)
        return _Run(
            job, finish_at, now + self.rates.heartbeat_seconds, crashed, self.rng.random() < job_type.error_rate
        )

    def _take_waiting(self) -> dict[str, Any] | None:
        """The oldest waiting job whose user runs nothing and whose unicity id is not started, started; None if none."""
        if self._openings is None:
            self._openings = (
                set(self.store.jobs.distinct(Job.NAMESPACE, {Job.STATUS: Status.STARTED})),
                set(self.store.jobs.distinct(Job.UNICITY_ID, {Job.STATUS: Status.STARTED})),
                list(self.store.jobs.find({Job.STATUS: Status.WAITING}).sort(Job.CREATED_AT, 1).limit(50)),
            )
        busy, started_ids, waiting = self._openings
        while waiting:
            candidate = waiting.pop(0)
            if candidate.get(Job.NAMESPACE) in busy or candidate.get(Job.UNICITY_ID) in started_ids:
                continue
            started = self._start_one(candidate)
            if started is not None:
                busy.add(started.get(Job.NAMESPACE))
                started_ids.add(started.get(Job.UNICITY_ID))
                return started
        return None

    def _start_one(self, candidate: dict[str, Any]) -> dict[str, Any] | None:
        owner = str(uuid.uuid4())
        lock = self.generation.keeps(LOCKS_COLLECTION) and Lock.OWNER in self.generation.lock_fields
        if lock:  # held only while starting, then released: the lock document stays
            taken = {Lock.OWNER: owner, Lock.UPDATED_AT: self.now()}
            if Lock.TTL in self.generation.lock_fields:
                taken[Lock.TTL] = START_LOCK_TTL_SECONDS
            self.store.locks.update_one({ID: candidate[Job.UNICITY_ID], Lock.OWNER: None}, {"$set": taken}, upsert=True)
        started = self.store.jobs.find_one_and_update(
            {ID: candidate[ID], Job.STATUS: Status.WAITING},
            {"$set": {Job.STATUS: Status.STARTED, Job.STARTED_AT: self.now()}},
            return_document=ReturnDocument.AFTER,
        )
        if lock:
            self.store.locks.update_one(
                {ID: candidate[Job.UNICITY_ID], Lock.OWNER: owner},
                {"$set": {Lock.OWNER: None, Lock.UPDATED_AT: self.now()}},
            )
        if started is not None:
            self._count_job(started, Status.WAITING, -1)
            self._count_job(started, Status.STARTED, +1)
            if WORKER_SIZE_METRICS_COLLECTION in self.side:
                self.store.worker_size_metrics.update_one(
                    {WorkerSizeMetric.WORKER_SIZE: worker_size(started.get(Job.DIFFICULTY))},
                    {"$inc": {WorkerSizeMetric.JOBS_COUNT: -1}},
                    upsert=True,
                )
        return started

    def _beat(self, runs: list[_Run], now: float) -> None:
        """The heartbeat of each of ``runs`` (one command for all: each worker's own write, sent together)."""
        if runs:
            ids = [run.job[ID] for run in runs]
            self.store.jobs.update_many(
                {ID: {"$in": ids}, Job.STATUS: Status.STARTED}, {"$set": {Job.LAST_HEARTBEAT: self.now()}}
            )
        for run in runs:
            run.next_beat = now + self.rates.heartbeat_seconds

    def _finish(self, run: _Run) -> None:
        """The cache entry first, then the job finished as the generation finishes one (if it is still ours)."""
        current = self.store.jobs.find_one({ID: run.job[ID]})
        if current is None or current.get(Job.STATUS) != Status.STARTED:
            self.counts["finished_by_someone_else"] += 1  # the cleanup took it for a zombie
            return
        finished_at = self.now()
        self._write_result(current, finished_at, run.failed)
        status = Status.ERROR if run.failed else Status.SUCCESS
        self.strategy.worker_finish(current, status, finished_at)
        self.strategy.after_finish([Finished(current, finished_at, status)], finished_at)
        self.counts[f"finished_{status}"] += 1

    def _write_result(self, job: dict[str, Any], finished_at: dt.datetime, failed: bool) -> None:
        key = cache_key_of_job(job)
        previous = self.store.cache.find_one(key, {Cache.CONTENT: 0})
        failed_runs = failed_runs_after_crash(previous, job) if failed else stored_failed_runs(previous)
        entry = {
            **key,
            Cache.HTTP_STATUS: DEFAULT_ZOMBIE_HTTP_STATUS if failed else HTTP_OK,
            Cache.ERROR_CODE: "UnexpectedError" if failed else None,
            Cache.CONTENT: {"error": "simulated failure"} if failed else {"rows": self.rng.randrange(1_000)},
            Cache.DETAILS: {"error": "simulated failure"} if failed else {},
            Cache.WORKER_VERSION: "2.0.0",
            Cache.JOB_RUNNER_VERSION: 2,
            Cache.DATASET_GIT_REVISION: job.get(Job.REVISION, "main"),
            Cache.PROGRESS: 1.0,
            Cache.UPDATED_AT: finished_at,
            Cache.DURATION: round((finished_at - job[Job.STARTED_AT]).total_seconds(), 3),
            Cache.FAILED_RUNS: failed_runs,
        }
        document = self.cache_generation.keep_declared(entry)
        self.store.cache.replace_one(key, document, upsert=True)
        if self.side.cache_metrics:
            for old_or_new, change in ((previous, -1), (document, +1)):
                if old_or_new is not None:
                    self.store.cache_metrics.update_one(
                        {
                            CacheMetric.KIND: old_or_new[Cache.KIND],
                            CacheMetric.HTTP_STATUS: old_or_new[Cache.HTTP_STATUS],
                            CacheMetric.ERROR_CODE: old_or_new.get(Cache.ERROR_CODE),
                        },
                        {"$inc": {CacheMetric.TOTAL: change}},
                        upsert=True,
                    )

    def _top_up(self) -> None:
        missing = self.rates.waiting_target - self.store.jobs.count_documents({Job.STATUS: Status.WAITING})
        if missing <= 0:
            return
        new_jobs = []
        for _ in range(missing):
            job_type = self.rng.choice(self.job_types)
            dataset = f"user{self.rng.randrange(200)}/dataset-{self.rng.randrange(2_000)}"
            config = None if job_type.level == "dataset" else self.rng.choice(["default", "en"])
            split = None if job_type.level != "split" else self.rng.choice(["train", "test"])
            new_jobs.append(
                job_document(
                    job_type.name,
                    dataset,
                    config,
                    split,
                    status=Status.WAITING,
                    generation=self.generation,
                    difficulty=job_type.difficulty,
                    created_at=self.now(),
                )
            )
        self.store.jobs.insert_many(new_jobs)
        after_insert(self.store, self.side, new_jobs)
        self.counts["enqueued"] += len(new_jobs)

    def _count_job(self, job: dict[str, Any], status: str, change: int) -> None:
        if JOB_METRICS_COLLECTION in self.side:
            self.store.job_metrics.update_one(
                self.side.job_metric_key(job[Job.TYPE], status), {"$inc": {JobMetric.TOTAL: change}}, upsert=True
            )
