"""The data the benchmarks run on: simulated queues, a fast finished-history generator, and a reset.

* :func:`cleanup_workload`: a queue of ``jobs`` with ``zombies`` zombies, for the simulator,
  in a given queue generation and with a given number of job types (:func:`job_types`).
* :func:`build_cleanup_queue`: writes it (indexes first) and says what was written; the
  benchmark runs it once per case into a server whose storage then serves every run.
* :func:`add_finished_history`: finished jobs only, inserted with large ``insert_many``
  batches, with the simulator's job types and duration laws (log-normal per type,
  killed at the maximum duration, the type's error rate). Much faster than the
  simulator for a million jobs: no cache entries, no per-job bookkeeping.
* :class:`Snapshot`: what a cleanup may change (the zombies, their cache entries,
  the audit and the retries it enqueues), saved once and put back before every
  run, so each contender and each repetition starts from the same data without
  re-inserting the queue.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId
from pymongo import DeleteOne, InsertOne, ReplaceOne
from pymongo.collection import Collection

from zombie_pipeline.queue.audit_documents import Event
from zombie_pipeline.queue.cache import CACHE_KEY, Cache, CacheEntry, cache_key_of_job
from zombie_pipeline.queue.generations import (
    NEWEST_CACHE_GENERATION,
    NEWEST_QUEUE_GENERATION,
    OLDEST_QUEUE_GENERATION,
    QUEUE_GENERATIONS,
)
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Priority, Status, namespace_of, without_none
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms
from zombie_pipeline.simulation.simulator import HEARTBEAT_INTERVAL_SECONDS, Simulation, simulate
from zombie_pipeline.simulation.workload import JOB_TYPES, JobType, Workload

#: The queue the 2023 killer (``baseline_2023``) ran on: early 2023, finished jobs kept with their status.
QUEUE_GENERATION = OLDEST_QUEUE_GENERATION
#: Today's queue: finished jobs deleted, ``pastJobs``, blockages, locks and counters kept in step.
TODAY_GENERATION = NEWEST_QUEUE_GENERATION
#: Running (healthy) started jobs beside the zombies: every started job is loaded by the baseline.
RUNNING_JOBS = 200
HISTORY_INSERT_BATCH = 20_000


def job_types(count: int | None) -> tuple[JobType, ...]:
    """``count`` job types: the simulator's own (9), fewer of them, or more, each extra one a copy of one of
    the simulator's (its level and duration law) under a name of its own (``/splits-2`` ...).

    The deployment has about 30: a batch of zombies then spans about 30 types.
    """
    if count is None or count == len(JOB_TYPES):
        return JOB_TYPES
    if count < 1:
        raise ValueError("at least one job type")
    if count <= len(JOB_TYPES):
        return JOB_TYPES[:count]
    extra = [
        JobType(
            f"{base.name}-{2 + index // len(JOB_TYPES)}",
            base.level,
            base.median_seconds,
            base.sigma,
            base.error_rate,
            base.difficulty,
        )
        for index, base in ((i, JOB_TYPES[i % len(JOB_TYPES)]) for i in range(count - len(JOB_TYPES)))
    ]
    return JOB_TYPES + tuple(extra)


def cleanup_workload(
    jobs: int,
    zombies: int,
    seed: int = 2023,
    running: int = RUNNING_JOBS,
    generation: str = QUEUE_GENERATION,
    types: int | None = None,
) -> Workload:
    """``jobs`` in all, ``zombies`` of them dead: 80 % crashed, 10 % never beat, 10 % past T2.

    Where finished jobs are deleted (2023-12 on), the finished ones are not in the jobs
    collection: the deployment keeps their results in the cache and the last hour of
    their runs in ``pastJobs``, and so does the simulator.
    """
    never = zombies // 10
    overdue = zombies // 10
    crashed = zombies - never - overdue
    waiting = max(10, jobs // 100)
    finished = jobs - zombies - running - waiting
    if finished < 0:
        raise ValueError(f"a queue of {jobs} jobs cannot hold {zombies} zombies and {running + waiting} live jobs")
    return Workload(
        finished=finished,
        crashed=crashed,
        never_heartbeated=never,
        overdue=overdue,
        running=running,
        waiting=waiting,
        seed=seed,
        generation=generation,
        # the first benchmark's pairing for the 2023 queue, kept so that its figures compare; else the generation's own
        cache_generation=NEWEST_CACHE_GENERATION if generation == QUEUE_GENERATION else None,
        terminated=0,
        job_types=job_types(types),
    )


def build_cleanup_queue(
    client: Any, queue_db: str, cache_db: str, workload: Workload, now: dt.datetime | None = None
) -> dict[str, Any]:
    """Write ``workload`` into fresh databases (indexes first: building them afterwards is far slower on the
    embedded server) and say what is there: the facts every run of the case is checked against."""
    store = Store.of(client[queue_db], client[cache_db])
    store.ensure_indexes()
    simulation = simulate(store, workload, now=now)
    started = store.jobs.count_documents({Job.STATUS: Status.STARTED})
    return {
        "now": simulation.now,
        "zombies": len(simulation.zombie_ids),
        "started": started,
        "jobs_in_collection": store.jobs.estimated_document_count(),
        "cache_entries": simulation.cache_entries,
        "past_jobs": simulation.past_jobs,
        "generation": workload.generation,
        "finish": QUEUE_GENERATIONS[workload.generation].finish.value,
        "job_types": len(workload.job_types),
        "started_job_types": len(
            {job[Job.TYPE] for job in store.jobs.find({Job.STATUS: Status.STARTED}, {Job.TYPE: 1})}
        ),
    }


# --- finished history -------------------------------------------------------------------


@dataclass
class History:
    """Finished jobs added so far, and how many finished on each UTC day."""

    first_day: dt.datetime
    days: int
    total: int = 0
    by_day: Counter = field(default_factory=Counter)  # ISO date -> jobs finished that day
    chunks: int = 0

    @property
    def window(self) -> tuple[dt.datetime, dt.datetime]:
        return self.first_day, self.first_day + dt.timedelta(days=self.days)


def history_for(now: dt.datetime, days: int = 7) -> History:
    """History over the ``days`` full UTC days before ``now``'s day."""
    today = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return History(first_day=today - dt.timedelta(days=days), days=days)


def _finished_jobs(
    count: int,
    history: History,
    seed: int,
    max_duration_seconds: int,
    job_types: tuple[JobType, ...] = JOB_TYPES,
) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    span = history.days * 86_400
    prefix = (0xBE000000 + seed % 0xFFFFFF).to_bytes(4, "big")
    for serial in range(count):
        job_type = rng.choice(job_types)
        duration = job_type.median_seconds * math.exp(rng.gauss(0.0, job_type.sigma))
        killed = duration > max_duration_seconds
        duration = min(duration, max_duration_seconds)
        finished_at = truncate_ms(history.first_day + dt.timedelta(seconds=rng.uniform(0, span)))
        started_at = truncate_ms(finished_at - dt.timedelta(seconds=duration))
        created_at = truncate_ms(started_at - dt.timedelta(seconds=rng.uniform(0, 120)))
        beats = int(duration // HEARTBEAT_INTERVAL_SECONDS)
        dataset = f"user{rng.randrange(200)}/dataset-{rng.randrange(2_000)}"
        config = None if job_type.level == "dataset" else rng.choice(("default", "en", "fr"))
        split = None if job_type.level != "split" else rng.choice(("train", "test", "validation"))
        failed = killed or rng.random() < job_type.error_rate
        history.by_day[finished_at.date().isoformat()] += 1
        yield without_none(
            {
                ID: ObjectId(int(created_at.timestamp()).to_bytes(4, "big") + prefix + serial.to_bytes(4, "big")),
                Job.TYPE: job_type.name,
                Job.DATASET: dataset,
                Job.CONFIG: config,
                Job.SPLIT: split,
                Job.UNICITY_ID: QUEUE_GENERATIONS[OLDEST_QUEUE_GENERATION].unicity_id(
                    job_type.name, dataset, None, config, split
                ),
                Job.NAMESPACE: namespace_of(dataset),
                Job.FORCE: rng.random() < 0.1,
                Job.PRIORITY: Priority.LOW if rng.random() < 0.2 else Priority.NORMAL,
                Job.STATUS: Status.ERROR if failed else Status.SUCCESS,
                Job.CREATED_AT: created_at,
                Job.STARTED_AT: started_at,
                Job.FINISHED_AT: finished_at,
                Job.LAST_HEARTBEAT: started_at + dt.timedelta(seconds=beats * HEARTBEAT_INTERVAL_SECONDS)
                if beats
                else None,
            }
        )


def add_finished_history(
    jobs: Collection,
    history: History,
    count: int,
    max_duration_seconds: int = 1200,
    batch: int = HISTORY_INSERT_BATCH,
) -> int:
    """Insert ``count`` more finished jobs (each call a new seed, so ids never collide)."""
    history.chunks += 1
    buffer: list[dict[str, Any]] = []
    for job in _finished_jobs(count, history, seed=1_000 + history.chunks, max_duration_seconds=max_duration_seconds):
        buffer.append(job)
        if len(buffer) >= batch:
            jobs.insert_many(buffer, ordered=False)
            buffer = []
    if buffer:
        jobs.insert_many(buffer, ordered=False)
    history.total += count
    return count


# --- reset between runs ----------------------------------------------------------------------


def _key_filter(key: dict[str, Any]) -> dict[str, Any]:
    return {name: key.get(name) for name in CACHE_KEY}  # None matches a missing config/split


@dataclass
class Snapshot:
    """The documents a cleanup may change, as they were before any contender ran."""

    zombie_jobs: list[JobDocument]
    cache_keys: list[dict[str, Any]]  # the cache key of every zombie
    cache_entries: list[CacheEntry]  # the entries that existed for those keys
    started: int  # started jobs before a run

    @classmethod
    def take(cls, store: Store, simulation: Simulation) -> Snapshot:
        zombie_ids = set(simulation.zombie_ids)
        # Zombies and running jobs were simulated with datasets of their own ("userN/live-M"):
        # one indexed read of the started jobs finds them, without a long $in.
        zombie_jobs = [job for job in store.jobs.find({Job.STATUS: Status.STARTED}) if job[ID] in zombie_ids]
        if len(zombie_jobs) != len(zombie_ids):
            raise RuntimeError(f"expected {len(zombie_ids)} zombies, found {len(zombie_jobs)} started")
        keys = [cache_key_of_job(job) for job in zombie_jobs]
        entries = []
        by_kind: dict[str, list[str]] = {}
        for key in keys:
            by_kind.setdefault(key[Cache.KIND], []).append(key[Cache.DATASET])
        wanted = {tuple(key.get(n) for n in CACHE_KEY) for key in keys}
        for kind, datasets in by_kind.items():  # equality on the first key field: an index scan on any server
            for start in range(0, len(datasets), 200):
                query = {Cache.KIND: kind, Cache.DATASET: {"$in": datasets[start : start + 200]}}
                for entry in store.cache.find(query):
                    if tuple(entry.get(n) for n in CACHE_KEY) in wanted:
                        entries.append(entry)
        started = store.jobs.count_documents({Job.STATUS: Status.STARTED})
        return cls(zombie_jobs=zombie_jobs, cache_keys=keys, cache_entries=entries, started=started)

    def restore(self, store: Store) -> None:
        """Put the zombies, their cache entries and an empty audit back; delete retries."""
        retry_ids = [
            event[Event.RETRY_JOB_ID]
            for event in store.events.find({}, {Event.RETRY_JOB_ID: 1})
            if Event.RETRY_JOB_ID in event
        ]
        operations: list[Any] = [DeleteOne({ID: retry_id}) for retry_id in retry_ids]
        operations += [ReplaceOne({ID: job[ID]}, job) for job in self.zombie_jobs]
        for start in range(0, len(operations), 5_000):
            store.jobs.bulk_write(operations[start : start + 5_000], ordered=True)
        cache_operations: list[Any] = [DeleteOne(_key_filter(key)) for key in self.cache_keys]
        cache_operations += [InsertOne(entry) for entry in self.cache_entries]
        for start in range(0, len(cache_operations), 5_000):
            store.cache.bulk_write(cache_operations[start : start + 5_000], ordered=True)
        store.events.delete_many({})
        started = store.jobs.count_documents({Job.STATUS: Status.STARTED})
        if started != self.started:
            raise RuntimeError(f"reset left {started} started jobs, expected {self.started}")

    def finalized_count(self, store: Store) -> int:
        """Zombies no longer started (the contender finalized them)."""
        return self.started - store.jobs.count_documents({Job.STATUS: Status.STARTED})
