"""What the deployment does around a job's finish and a job's insert, done for the jobs the cleanup touches.

dataset-viewer keeps counters in step with its queue (``jobTotalMetric``,
``workerTypeJobCounts``), rate-limits datasets from the runs of the last hour
(``pastJobs``, ``datasetBlockages``) and frees locks when a job finishes. A zombie
never finishes, so its cleanup does all of that in its stead, in the collections
the queue's generation keeps (:mod:`.side_collections`). The rules and constants
are the deployment's (docs/generations.md).

Every write here is one command per batch, and takes the session of the
transaction the finish runs in, when the server has transactions.

A counter is moved with ``$inc``, which no write of ours can make idempotent:
the deployment's counter documents have no room for a mark of ours. So a move an
earlier pass may or may not have applied is never applied again, nor skipped:
its key is returned in doubt (``counters.CountersInDoubt``), and the pass sets
that counter to a recount of the documents it counts (``counters.repair``)
before it completes its events.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymongo.client_session import ClientSession

from zombie_pipeline.cleanup.counters import CountersInDoubt
from zombie_pipeline.cleanup.side_collections import SideCollections
from zombie_pipeline.queue.audit_documents import Effect
from zombie_pipeline.queue.blockages import BLOCKAGES_COLLECTION, block, blockages_of, over_the_limit
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION, add_to_totals
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, JobSnapshot, Status
from zombie_pipeline.queue.locks import LOCKS_COLLECTION, release_locks
from zombie_pipeline.queue.past_jobs import (
    PAST_JOB_MIN_SECONDS,
    PAST_JOBS_COLLECTION,
    record_runs,
    run_seconds,
    seconds_by_dataset,
)
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.worker_type_counts import WORKER_SIZE_METRICS_COLLECTION, add_to_counts, worker_size


@dataclass
class AppliedEffects:
    """What was done around a batch of finishes: per job id, the effects for its event; the counters in doubt."""

    by_job: dict[Any, list[str]]
    in_doubt: CountersInDoubt = field(default_factory=CountersInDoubt)

    def merge(self, other: AppliedEffects) -> AppliedEffects:
        for job_id, effects in other.by_job.items():
            self.by_job.setdefault(job_id, []).extend(effects)
        self.in_doubt.merge(other.in_doubt)
        return self


@dataclass(frozen=True)
class Finished:
    """A job just finished (by its worker, or by us for a zombie) and when: what the effects need."""

    job: JobSnapshot
    finished_at: dt.datetime
    status: str = Status.ERROR  # where finished jobs are kept, the status it was given
    #: Its worker is gone (every reason but a timeout, whose worker may still be running): the locks it owned are
    #: orphans, and a finish that frees a job's locks frees them.
    worker_gone: bool = True

    @property
    def id(self) -> Any:
        return self.job[ID]


@dataclass(frozen=True)
class DeploymentEffects:
    """The deployment's bookkeeping around a finish or an insert, in the collections of one queue generation."""

    store: Store
    side: SideCollections

    def after_finish(
        self, finished: list[Finished], now: dt.datetime, session: ClientSession | None = None, counted: bool = True
    ) -> AppliedEffects:
        """Counters, rate limiter and locks around the finish of each job of ``finished``; the effects per job id.

        ``counted=False``: these finishes were found done by an earlier pass, which may or may not have moved their
        counters, so they are not moved again but returned in doubt (within a transaction, the finish and its
        counters committed together: nothing is in doubt, and the caller knows it). Either way the event records
        ``job_metrics``: the counters are in step once the pass ends. A ``pastJobs`` record, a blockage and a lock
        are written so as to be found, never doubled. Where the queue keeps finished jobs, ``jobTotalMetric``
        counts them under their final status too.
        """
        effects = AppliedEffects({item.id: [] for item in finished})
        if not finished:
            return effects
        if JOB_METRICS_COLLECTION in self.side:
            changes: Counter[tuple[str, str]] = Counter()
            for item in finished:
                changes[(item.job[Job.TYPE], Status.STARTED)] -= 1
                if self.side.generation.keeps_finished_jobs:
                    changes[(item.job[Job.TYPE], item.status)] += 1
                effects.by_job[item.id].append(Effect.JOB_METRICS)
            if counted:
                self._add_to_job_metrics(changes, session)
            else:
                effects.in_doubt.job_metrics |= set(changes)
        if PAST_JOBS_COLLECTION in self.side:
            effects.merge(self._record_past_jobs(finished, now, session))
        if LOCKS_COLLECTION in self.side:
            self._release_locks(finished, now, session)
            for item in finished:
                effects.by_job[item.id].append(Effect.LOCKS_RELEASED)
        return effects

    def after_insert(self, jobs: Sequence[JobDocument], session: ClientSession | None = None) -> None:
        """The counters the deployment increments when it inserts waiting jobs (our retries)."""
        if not jobs:
            return
        if JOB_METRICS_COLLECTION in self.side:
            self._add_to_job_metrics(Counter((job[Job.TYPE], Status.WAITING) for job in jobs), session)
        if WORKER_SIZE_METRICS_COLLECTION in self.side:
            blocked = set(self._blockages({job[Job.DATASET] for job in jobs}, session))
            sizes = Counter(worker_size(job.get(Job.DIFFICULTY)) for job in jobs if job[Job.DATASET] not in blocked)
            self._add_to_worker_sizes(sizes, session)

    def inserted_before(self, jobs: Sequence[JobDocument]) -> CountersInDoubt:
        """The counters :meth:`after_insert` moves for ``jobs``, found inserted by an earlier pass: in doubt."""
        doubt = CountersInDoubt()
        if jobs and JOB_METRICS_COLLECTION in self.side:
            doubt.job_metrics |= {(job[Job.TYPE], Status.WAITING) for job in jobs}
        if jobs and WORKER_SIZE_METRICS_COLLECTION in self.side:
            doubt.worker_sizes = True
        return doubt

    def _add_to_job_metrics(self, changes: Counter[tuple[str, str]], session: ClientSession | None) -> None:
        add_to_totals(self.store.job_metrics, changes, self.side.by_dataset_status, session)

    def _add_to_worker_sizes(self, changes: Counter[str], session: ClientSession | None) -> None:
        add_to_counts(self.store.worker_size_metrics, changes, session)

    def _blockages(self, datasets: Iterable[str], session: ClientSession | None) -> dict[str, Any]:
        """dataset -> ``_id`` of its blockage, for the blocked ones among ``datasets``."""
        if BLOCKAGES_COLLECTION not in self.side:
            return {}
        return blockages_of(self.store.blockages, datasets, session)

    def _record_past_jobs(
        self, finished: list[Finished], now: dt.datetime, session: ClientSession | None
    ) -> AppliedEffects:
        """A ``pastJobs`` record per run of at least 30 s (``_id`` = the job's, so never twice); block the datasets
        over the limit."""
        records = {}
        for item in finished:
            seconds = run_seconds(item.job, item.finished_at)
            if seconds >= PAST_JOB_MIN_SECONDS:
                records[item.id] = (item, seconds)
        if not records:
            return AppliedEffects({})
        runs = {
            job_id: (item.job[Job.DATASET], seconds, item.finished_at) for job_id, (item, seconds) in records.items()
        }
        record_runs(self.store.past_jobs, runs, session)
        effects = AppliedEffects({job_id: [Effect.PAST_JOB] for job_id in records})
        return effects.merge(self._block_datasets(list(records.values()), now, session))

    def _block_datasets(
        self, recorded: list[tuple[Finished, int]], now: dt.datetime, session: ClientSession | None
    ) -> AppliedEffects:
        """Block each dataset whose last hour of runs now exceeds the deployment's threshold, once.

        Only a run longer than the minimum can block; its dataset's pending jobs then
        leave the worker-size counters, as the deployment does. The blockage's ``_id``
        is the smallest job id of the batch's runs that trigger it, so a pass redone
        writes the same one; a blockage found with the id of one of the batch's jobs
        was written by an earlier pass, which may or may not have lowered the
        counters: in doubt.
        """
        if BLOCKAGES_COLLECTION not in self.side:
            return AppliedEffects({})
        triggering: dict[str, Any] = {}  # dataset -> the job whose run blocks it
        for item, seconds in recorded:
            if seconds > PAST_JOB_MIN_SECONDS:
                dataset = item.job[Job.DATASET]
                triggering[dataset] = min(triggering.get(dataset, item.id), item.id)
        if not triggering:
            return AppliedEffects({})
        already = self._blockages(triggering, session)
        batch = {item.id for item, _ in recorded}
        effects = AppliedEffects(
            {blockage: [Effect.BLOCKED_DATASET] for blockage in already.values() if blockage in batch}
        )
        effects.in_doubt.worker_sizes = bool(effects.by_job) and WORKER_SIZE_METRICS_COLLECTION in self.side
        totals = seconds_by_dataset(self.store.past_jobs, set(triggering) - set(already), session)
        to_block = {
            dataset: event_id
            for dataset, event_id in triggering.items()
            if dataset not in already and over_the_limit(dataset, totals.get(dataset, 0))
        }
        if not to_block:
            return effects
        block(self.store.blockages, to_block, now, session)
        if WORKER_SIZE_METRICS_COLLECTION in self.side:
            pending = self.store.jobs.find(
                {Job.DATASET: {"$in": sorted(to_block)}}, {Job.DIFFICULTY: 1}, session=session
            )
            sizes = Counter(worker_size(job.get(Job.DIFFICULTY)) for job in pending)
            self._add_to_worker_sizes(Counter({size: -count for size, count in sizes.items()}), session)
        for event_id in to_block.values():
            effects.by_job[event_id] = [Effect.BLOCKED_DATASET]
        return effects

    def _release_locks(self, finished: list[Finished], now: dt.datetime, session: ClientSession | None) -> None:
        """Free the locks the deployment's finish frees, in one command.

        The lock keyed by each job's ``unicity_id``, so that its re-run can start (the deployment's own finish
        from 2024-08-22; before, the cleanup's: docs/generations.md). Where the generation's finish frees every
        lock the job owns (2023-08-07 to 2024-08-22: ``release_locks(owner=job_id)``), those of each job whose
        worker is gone too, such as a conversion's ``refs/convert/parquet`` branch lock: a job past its maximum
        duration may still be running, and its worker frees its own when it leaves them.
        """
        keys = {item.job[Job.UNICITY_ID] for item in finished}
        owners = (
            {str(item.id) for item in finished if item.worker_gone} if self.side.generation.frees_owned_locks else set()
        )
        release_locks(self.store.locks, keys, owners, now, session)
