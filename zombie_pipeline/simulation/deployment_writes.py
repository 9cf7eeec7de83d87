"""What a worker of the deployment writes when it starts and finishes a job, generation by generation.

The simulated workers book their jobs here, not through the cleanup's own bookkeeping
(``cleanup/effects.py``): a model written a second time, from dataset-viewer's ``libcommon`` of each era
(``Queue.start_job``, ``Queue.finish_job``, ``queue/metrics.py``, ``queue/past_jobs.py``,
``queue/lock.py``; docs/generations.md), so that a mistake in either shows against the other
(``tests/simulation/test_deployment_writes.py``) and against a recount of the counters. Only the document
shapes come from ``queue/``: field names, and which collections a generation keeps (its table).

By era, as its code does it:

- start (from 2023-07 a lock keyed by the job's ``unicity_id`` held while starting): status ``started``,
  ``started_at``; ``jobTotalMetric`` waiting -1, started +1; ``workerTypeJobCounts`` -1 for its size;
- finish: ``jobTotalMetric`` started -1 (and +1 under its final status where finished jobs are kept); a
  ``pastJobs`` record for a run of 30 s or more and, past the dataset's hourly limit, a blockage with its
  pending jobs' worker-size counts lowered; the job given its final status and ``finished_at``, or deleted;
  then the locks: every lock the job owns (2023-07 to 2024-08, ``release_locks(owner=job_id)``), else the
  start lock by its key (2024-08 on), none before 2023-07;
- insert: ``jobTotalMetric`` waiting +1; ``workerTypeJobCounts`` +1 unless the dataset is blocked.

The simulator, which writes a whole queue at once, sets the counters to what those moves add up to
(:meth:`DeploymentWrites.set_counters`).

The deployment writes one job at a time; the workers here write a batch in a few commands, the jobs first
and their counters after, as each of the deployment's starts does. Identifiers the deployment leaves to
MongoDB (a ``pastJobs`` record's, a blockage's) are new ObjectIds.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bson import ObjectId
from pymongo import InsertOne, ReturnDocument, UpdateOne
from pymongo.collection import Collection
from pymongo.errors import DuplicateKeyError

from zombie_pipeline.queue.blockages import BLOCKAGES_COLLECTION, Blockage
from zombie_pipeline.queue.cache import Cache, CacheMetric
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.job_metrics import DATASET_STATUS_NORMAL, JOB_METRICS_COLLECTION, JobMetric
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.locks import LOCKS_COLLECTION, Lock
from zombie_pipeline.queue.past_jobs import PAST_JOBS_COLLECTION, PastJob
from zombie_pipeline.queue.store import Store, aggregate_rows
from zombie_pipeline.queue.worker_type_counts import WORKER_SIZE_METRICS_COLLECTION, WorkerSizeMetric

#: ``lock.TTL.LOCK_TTL_SECONDS_TO_START_JOB``: the start lock's time to live, where locks have a ``ttl``.
START_LOCK_TTL_SECONDS = 600
#: ``past_jobs.JOB_DURATION_MIN_SECONDS``: a shorter run leaves no record.
RECORDED_FROM_SECONDS = 30
#: ``past_jobs.JOB_DURATION_CHECK_MIN_SECONDS``: only a longer run has its dataset's hour checked.
CHECKED_ABOVE_SECONDS = 30
#: ``past_jobs.DATASET_BLOCKAGE_THRESHOLD_SECONDS``: two machines for the hour of ``RATE_LIMIT_WINDOW_SECONDS``.
HOURLY_LIMIT_SECONDS = 2 * 3_600
#: ``past_jobs.ALLOWED_COMPUTE_MULTIPLIER``.
LIMIT_MULTIPLIERS = {"HuggingFaceFW/fineweb-2": 100}


def size_of(job: JobDocument) -> str:
    """``WorkerSizeJobsCountDocument.get_worker_size``: light up to 40, medium up to 70, else heavy."""
    difficulty = job.get(Job.DIFFICULTY)
    if not isinstance(difficulty, (int, float)):
        return "heavy"
    return "light" if difficulty <= 40 else "medium" if difficulty <= 70 else "heavy"


@dataclass(frozen=True)
class DeploymentWrites:
    """The writes of one generation's workers around a job's start, finish and insert."""

    store: Store
    generation: QueueGeneration

    def start(self, job: JobDocument, now: dt.datetime) -> JobDocument | None:
        """Start the waiting ``job``: the started document, or None if another worker holds its start lock or started
        it first (the lock document stays, freed)."""
        lock_fields = self.generation.lock_fields
        locked = self.generation.keeps(LOCKS_COLLECTION) and Lock.OWNER in lock_fields
        owner = str(uuid.uuid4())
        if locked:
            taken: dict[str, Any] = {Lock.OWNER: owner, Lock.UPDATED_AT: now}
            if Lock.TTL in lock_fields:
                taken[Lock.TTL] = START_LOCK_TTL_SECONDS
            try:
                self.store.locks.update_one(
                    {ID: job[Job.UNICITY_ID], Lock.OWNER: {"$in": [None, owner]}}, {"$set": taken}, upsert=True
                )
            except DuplicateKeyError:  # another worker holds it, starting the same step: this one looks further
                return None
        started = self.store.jobs.find_one_and_update(
            {ID: job[ID], Job.STATUS: Status.WAITING},
            {"$set": {Job.STATUS: Status.STARTED, Job.STARTED_AT: now}},
            return_document=ReturnDocument.AFTER,
        )
        if locked:
            self.store.locks.update_one(
                {ID: job[Job.UNICITY_ID], Lock.OWNER: owner}, {"$set": {Lock.OWNER: None, Lock.UPDATED_AT: now}}
            )
        if started is not None:
            self._move_totals(
                Counter({(started[Job.TYPE], Status.WAITING): -1, (started[Job.TYPE], Status.STARTED): 1})
            )
            self._move_sizes(Counter({size_of(started): -1}))
        return started

    def insert(self, jobs: Sequence[JobDocument]) -> None:
        """The counters of waiting jobs just inserted."""
        self._move_totals(Counter((job[Job.TYPE], Status.WAITING) for job in jobs))
        blocked = self._blocked({job[Job.DATASET] for job in jobs})
        self._move_sizes(Counter(size_of(job) for job in jobs if job[Job.DATASET] not in blocked))

    def count_started(self, jobs: Sequence[JobDocument]) -> None:
        """The counters of the started ones of ``jobs``, written already started: as their insert and start left them
        (started +1; the worker sizes their insert raised, their start lowered)."""
        self._move_totals(
            Counter((job[Job.TYPE], Status.STARTED) for job in jobs if job.get(Job.STATUS) == Status.STARTED)
        )

    def finish(self, finished: Sequence[tuple[JobDocument, str]], now: dt.datetime) -> None:
        """Finish each started job of ``finished`` with its status (``success`` or ``error``), at ``now``."""
        if not finished:
            return
        ids = [job[ID] for job, _ in finished]
        if self.generation.keeps_finished_jobs:
            self.store.jobs.bulk_write(
                [
                    UpdateOne({ID: job[ID]}, {"$set": {Job.STATUS: status, Job.FINISHED_AT: now}})
                    for job, status in finished
                ],
                ordered=False,
            )
        else:
            self.store.jobs.delete_many({ID: {"$in": ids}})
        totals: Counter[tuple[str, str]] = Counter()
        for job, status in finished:
            totals[(job[Job.TYPE], Status.STARTED)] -= 1
            if self.generation.keeps_finished_jobs:
                totals[(job[Job.TYPE], status)] += 1
        self._move_totals(totals)
        blocked = self._record_runs([job for job, _ in finished], now)
        self._free_locks([job for job, _ in finished], now)
        if blocked and self.generation.keeps(WORKER_SIZE_METRICS_COLLECTION):
            pending = self.store.jobs.find({Job.DATASET: {"$in": sorted(blocked)}}, {Job.DIFFICULTY: 1})
            self._move_sizes(Counter({size: -count for size, count in Counter(map(size_of, pending)).items()}))

    def set_counters(self) -> None:
        """Every counter the generation keeps set to what the moves above add up to from an empty queue, for a queue
        written all at once (the simulator's): jobs per type and status, waiting jobs of datasets not blocked per
        worker size, cache entries per kind, HTTP status and error code."""
        if self.generation.keeps(JOB_METRICS_COLLECTION):
            totals = aggregate_rows(
                self.store.jobs,
                [{"$group": {ID: {"type": f"${Job.TYPE}", "status": f"${Job.STATUS}"}, "n": {"$sum": 1}}}],
            )
            self._set(
                self.store.job_metrics,
                JobMetric.TOTAL,
                [(self._total_key(row[ID]["type"], row[ID]["status"]), row["n"]) for row in totals],
            )
        if self.generation.keeps(WORKER_SIZE_METRICS_COLLECTION):
            waiting = self.store.jobs.find({Job.STATUS: Status.WAITING}, {Job.DATASET: 1, Job.DIFFICULTY: 1})
            jobs = list(waiting)
            blocked = self._blocked({job[Job.DATASET] for job in jobs})
            sizes = Counter(size_of(job) for job in jobs if job[Job.DATASET] not in blocked)
            self._set(
                self.store.worker_size_metrics,
                WorkerSizeMetric.JOBS_COUNT,
                [({WorkerSizeMetric.WORKER_SIZE: size}, count) for size, count in sizes.items()],
            )
        if self.generation.cache_metrics:
            entries = aggregate_rows(
                self.store.cache,
                [
                    {
                        "$group": {
                            ID: {
                                "kind": f"${Cache.KIND}",
                                "http": f"${Cache.HTTP_STATUS}",
                                "code": f"${Cache.ERROR_CODE}",
                            },
                            "n": {"$sum": 1},
                        }
                    }
                ],
            )
            self._set(
                self.store.cache_metrics,
                CacheMetric.TOTAL,
                [
                    (
                        {
                            CacheMetric.KIND: row[ID]["kind"],
                            CacheMetric.HTTP_STATUS: row[ID]["http"],
                            CacheMetric.ERROR_CODE: row[ID].get("code"),
                        },
                        row["n"],
                    )
                    for row in entries
                ],
            )

    @staticmethod
    def _set(collection: Collection[Any], total: str, rows: list[tuple[dict[str, Any], int]]) -> None:
        if rows:
            collection.bulk_write([UpdateOne(key, {"$set": {total: n}}, upsert=True) for key, n in rows], ordered=False)

    def _record_runs(self, jobs: list[JobDocument], now: dt.datetime) -> set[str]:
        """``create_past_job`` for each run: its record, and the datasets it blocks (returned)."""
        if not self.generation.keeps(PAST_JOBS_COLLECTION):
            return set()
        runs = [(job[Job.DATASET], int((now - job[Job.STARTED_AT]).total_seconds())) for job in jobs]
        records = [
            InsertOne({ID: ObjectId(), PastJob.DATASET: dataset, PastJob.DURATION: seconds, PastJob.FINISHED_AT: now})
            for dataset, seconds in runs
            if seconds >= RECORDED_FROM_SECONDS
        ]
        if not records:
            return set()
        self.store.past_jobs.bulk_write(records)
        checked = {dataset for dataset, seconds in runs if seconds > CHECKED_ABOVE_SECONDS} - self._blocked(
            {dataset for dataset, _ in runs}
        )
        if not checked:
            return set()
        totals = self.store.past_jobs.aggregate(
            [
                {"$match": {PastJob.DATASET: {"$in": sorted(checked)}}},
                {"$group": {ID: f"${PastJob.DATASET}", "seconds": {"$sum": f"${PastJob.DURATION}"}}},
            ]
        )
        blocked = {
            row[ID] for row in totals if row["seconds"] > HOURLY_LIMIT_SECONDS * LIMIT_MULTIPLIERS.get(row[ID], 1)
        }
        if blocked and self.generation.keeps(BLOCKAGES_COLLECTION):
            self.store.blockages.insert_many(
                [{ID: ObjectId(), Blockage.DATASET: dataset, Blockage.BLOCKED_AT: now} for dataset in sorted(blocked)]
            )
        return blocked

    def _free_locks(self, jobs: list[JobDocument], now: dt.datetime) -> None:
        if not self.generation.keeps(LOCKS_COLLECTION) or Lock.OWNER not in self.generation.lock_fields:
            return
        freed = {"$set": {Lock.OWNER: None, Lock.UPDATED_AT: now}}
        if self.generation.frees_owned_locks:
            self.store.locks.update_many({Lock.OWNER: {"$in": sorted(str(job[ID]) for job in jobs)}}, freed)
        else:
            self.store.locks.update_many({ID: {"$in": sorted(job[Job.UNICITY_ID] for job in jobs)}}, freed)

    def _blocked(self, datasets: set[str]) -> set[str]:
        if not self.generation.keeps(BLOCKAGES_COLLECTION) or not datasets:
            return set()
        return set(self.store.blockages.distinct(Blockage.DATASET, {Blockage.DATASET: {"$in": sorted(datasets)}}))

    def _total_key(self, job_type: str, status: str) -> dict[str, str]:
        """A ``jobTotalMetric`` row's key; the rows the deployment moves are those of datasets not blocked."""
        key = {JobMetric.JOB_TYPE: job_type, JobMetric.STATUS: status}
        if self.generation.job_metrics_by_dataset_status:
            key[JobMetric.DATASET_STATUS] = DATASET_STATUS_NORMAL
        return key

    def _move_totals(self, changes: Counter[tuple[str, str]]) -> None:
        if not self.generation.keeps(JOB_METRICS_COLLECTION) or not any(changes.values()):
            return
        self.store.job_metrics.bulk_write(
            [
                UpdateOne(self._total_key(job_type, status), {"$inc": {JobMetric.TOTAL: change}}, upsert=True)
                for (job_type, status), change in sorted(changes.items())
                if change
            ],
            ordered=False,
        )

    def _move_sizes(self, changes: Counter[str]) -> None:
        if not self.generation.keeps(WORKER_SIZE_METRICS_COLLECTION) or not any(changes.values()):
            return
        self.store.worker_size_metrics.bulk_write(
            [
                UpdateOne(
                    {WorkerSizeMetric.WORKER_SIZE: size}, {"$inc": {WorkerSizeMetric.JOBS_COUNT: change}}, upsert=True
                )
                for size, change in sorted(changes.items())
                if change
            ],
            ordered=False,
        )
