"""The two ways a queue finishes a job, each owning every rule that depends on it.

Before December 2023 a finished job is kept with status ``error`` and its
``finished_at`` (:class:`KeptAsError`); from then on it is deleted
(:class:`Deleted`). A strategy owns what follows from that, and nothing else in
the pipeline asks which generation a queue is:

- the write that finishes a job, a compare-and-set on what detection saw (still
  ``started``, same ``started_at``, ``last_heartbeat`` and ``terminated_at``): a
  worker that beat, finished or got SIGTERM meanwhile wins, and the claim is
  forgotten;
- the order of the job's finish and its cache error entry
  (:attr:`~FinishStrategy.writes_error_entry_first`: the deployment of 2023-12
  on writes the entry first, so the deletion then proves the claim won);
- how an earlier pass's finish is recognized afterwards, whether that pass died
  or only its reply was lost: our stamp as ``finished_at`` on a kept job; for a
  deleted one, the entry beside it (a worker writes its result before it
  deletes its job: our error entry, or the fresher one we kept, untouched since
  the claim, says the deletion was ours);
- whether the cleanup re-enqueues crashed jobs by default (from 2023-12 the
  deployment's backfill re-creates them itself).

A strategy writes the jobs and nothing else: what the deployment does around a
finish (``effects``), the cache entries and the events are the finalizer's to
write, in the order the strategy gives.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pymongo import DeleteOne, UpdateOne
from pymongo.client_session import ClientSession
from pymongo.results import BulkWriteResult

from zombie_pipeline.cleanup.detection import as_seen_expression, as_seen_filter, is_as_seen
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, ZombieEvent
from zombie_pipeline.queue.cache import Cache, cache_key_of_job
from zombie_pipeline.queue.cache_entries import entries_of_jobs, is_fresher, key_of, written_for
from zombie_pipeline.queue.generations import FinishStyle, QueueGeneration
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.store import READ_BATCH, Store
from zombie_pipeline.queue.times import as_utc

_JOB_STATE = {Job.STATUS: 1, Job.FINISHED_AT: 1, Job.STARTED_AT: 1, Job.LAST_HEARTBEAT: 1, Job.TERMINATED_AT: 1}


@dataclass
class SortedClaims:
    """A batch of claimed events, told apart before anything is written."""

    to_finish: list[ZombieEvent] = field(default_factory=list)  # still as detection saw them
    done_before: list[ZombieEvent] = field(default_factory=list)  # finished by an earlier pass (dead, or reply lost)
    lost: list[ZombieEvent] = field(default_factory=list)  # a worker touched the job: not ours any more


@dataclass
class FinishOutcome:
    """What the finish of a batch did: the claims it won, those an earlier pass had won, those lost to a worker."""

    won: list[ZombieEvent] = field(default_factory=list)
    done_before: list[ZombieEvent] = field(default_factory=list)
    lost: list[ZombieEvent] = field(default_factory=list)

    @property
    def finished(self) -> list[ZombieEvent]:
        return self.won + self.done_before


class FinishStrategy(ABC):
    """How one queue finishes a job."""

    style: ClassVar[FinishStyle]
    #: Whether the job's cache error entry is written before the job is finished (else after).
    writes_error_entry_first: ClassVar[bool]
    #: Whether the cleanup re-enqueues a crashed job unless the policy says otherwise.
    retries_by_default: ClassVar[bool]

    def __init__(self, store: Store, generation: QueueGeneration) -> None:
        self.store = store
        self.generation = generation

    def sort_claims(self, events: list[ZombieEvent], fresh: Collection[Any]) -> SortedClaims:
        """Which claims can still be finished, which an earlier pass finished (any but the ``fresh`` ones may have
        been), which are lost to a worker: read from the jobs, whatever an earlier pass may have heard or not."""
        current = _jobs_of(self.store, events, None)
        claims, finished = SortedClaims(), []
        for event in events:
            job = current.get(event[ID])
            if event[ID] not in fresh and self._finished_by_us(job, event):
                finished.append(event)
            elif is_as_seen(job, event[Event.JOB]):
                claims.to_finish.append(event)
            else:
                claims.lost.append(event)
        ours = self._finished_by_an_earlier_pass(finished)
        claims.done_before += [event for event in finished if event[ID] in ours]
        claims.lost += [event for event in finished if event[ID] not in ours]
        return claims

    def finish(self, claims: SortedClaims, session: ClientSession | None = None) -> FinishOutcome:
        """Finish the claims still as detection saw them, by compare-and-set; which took."""
        outcome = FinishOutcome(done_before=list(claims.done_before), lost=list(claims.lost))
        if claims.to_finish:
            operations = [self._finish_operation(event) for event in claims.to_finish]
            written = self.store.jobs.bulk_write(operations, ordered=False, session=session)
            if self._applied(written) == len(claims.to_finish):  # every compare-and-set took: all won, nothing to read
                outcome.won = list(claims.to_finish)
            else:
                outcome.won = self._won(claims.to_finish, written, session)
            winners = {event[ID] for event in outcome.won}
            outcome.lost += [event for event in claims.to_finish if event[ID] not in winners]
        return outcome

    def enqueues_retries(self, policy: ZombiePolicy) -> bool:
        """Whether this cleanup re-enqueues crashed jobs: as the policy says, else as the deployment of the generation."""
        return self.retries_by_default if policy.enqueue_retries is None else policy.enqueue_retries

    def _finished_by_an_earlier_pass(self, finished: list[ZombieEvent]) -> set[Any]:
        """Of the claims whose job looks finished by us, those a pass of ours did finish (their ids)."""
        return {event[ID] for event in finished}

    @abstractmethod
    def _finish_operation(self, event: ZombieEvent) -> UpdateOne | DeleteOne: ...

    @abstractmethod
    def _applied(self, written: BulkWriteResult) -> int: ...

    @abstractmethod
    def _finished_by_us(self, job: JobDocument | None, event: ZombieEvent) -> bool: ...

    def _won(
        self, events: list[ZombieEvent], written: BulkWriteResult, session: ClientSession | None
    ) -> list[ZombieEvent]:
        """Which compare-and-sets took, read back from the jobs."""
        after = _jobs_of(self.store, events, session)
        return [event for event in events if self._finished_by_us(after.get(event[ID]), event)]


class KeptAsError(FinishStrategy):
    """Before 2023-12: the job is set to ``error`` with our stamp as ``finished_at``; then its cache entry."""

    style = FinishStyle.KEPT_AS_ERROR
    writes_error_entry_first = False
    retries_by_default = True  # nothing in the deployment of the time re-ran a crashed job

    def sort_claims(self, events: list[ZombieEvent], fresh: Collection[Any]) -> SortedClaims:
        if all(event[ID] in fresh for event in events):  # the finish's own compare-and-set is the check: no read
            return SortedClaims(to_finish=list(events))
        return super().sort_claims(events, fresh)

    def _finish_operation(self, event: ZombieEvent) -> UpdateOne:
        """Selected by ``_id`` alone, compared in the update itself (an update pipeline's ``$cond``, atomic like a filter).

        A job no longer as seen is left exactly as it is and not counted as modified. The embedded
        server serves an ``_id``-only filter by a point lookup, and plans every other field of a filter
        against its index catalog first (about 1 ms per statement: docs/benchmarks.md); MongoDB serves
        both by the ``_id`` index.
        """
        job = event[Event.JOB]
        seen = as_seen_expression(job)
        finish_job = {
            Job.STATUS: {"$cond": [seen, Status.ERROR, f"${Job.STATUS}"]},
            Job.FINISHED_AT: {"$cond": [seen, event[Event.FINALIZED_AT], f"${Job.FINISHED_AT}"]},
        }
        return UpdateOne({ID: job[ID]}, [{"$set": finish_job}])

    def _applied(self, written: BulkWriteResult) -> int:
        return written.modified_count

    def _finished_by_us(self, job: JobDocument | None, event: ZombieEvent) -> bool:
        return (
            job is not None
            and job.get(Job.STATUS) == Status.ERROR
            and as_utc(job.get(Job.FINISHED_AT)) == event[Event.FINALIZED_AT]
        )


class Deleted(FinishStrategy):
    """2023-12 on, as the deployment kills a stuck job: its cache error entry first, then the job deleted.

    ``sort_claims`` reads the jobs first in every case: claims of jobs a worker touched since detection are
    dropped before the cache is written, so no error entry is written for a worker that is only slow.
    """

    style = FinishStyle.DELETED
    writes_error_entry_first = True
    retries_by_default = False  # the deployment's backfill re-creates failed jobs from the cache's failed_runs

    def _finished_by_an_earlier_pass(self, finished: list[ZombieEvent]) -> set[Any]:
        """A job gone since an earlier pass was deleted by it unless its worker's own result is there instead."""
        return _deleted_by_us(self.store, finished)

    def _finish_operation(self, event: ZombieEvent) -> DeleteOne:
        return DeleteOne(as_seen_filter(event[Event.JOB]))

    def _applied(self, written: BulkWriteResult) -> int:
        return written.deleted_count

    def _finished_by_us(self, job: JobDocument | None, event: ZombieEvent) -> bool:
        return job is None

    def _won(
        self, events: list[ZombieEvent], written: BulkWriteResult, session: ClientSession | None
    ) -> list[ZombieEvent]:
        won = super()._won(events, written, session)
        if written.deleted_count < len(won):  # a worker deleted some itself: their results are beside them
            ours = _deleted_by_us(self.store, won)
            won = [event for event in won if event[ID] in ours]
        return won


STRATEGIES: dict[FinishStyle, type[FinishStrategy]] = {strategy.style: strategy for strategy in (KeptAsError, Deleted)}


def strategy_for(store: Store, generation: QueueGeneration) -> FinishStrategy:
    """The strategy of ``generation``'s finish style."""
    return STRATEGIES[generation.finish](store, generation)


def _jobs_of(store: Store, events: Sequence[ZombieEvent], session: ClientSession | None) -> dict[Any, JobDocument]:
    ids = [event[ID] for event in events]
    return {
        job[ID]: job for job in store.jobs.find({ID: {"$in": ids}}, _JOB_STATE, session=session).batch_size(READ_BATCH)
    }


def _deleted_by_us(store: Store, events: Sequence[ZombieEvent]) -> set[Any]:
    """The events whose job, gone, was deleted by a pass of ours, told from the cache entry beside it.

    A worker writes its result before it deletes its job; we write our error entry before we delete a zombie,
    or keep an entry fresher than the zombie's start (a worker that wrote its result and died before deleting
    its job). So a job gone beside our entry, or beside the fresher entry not rewritten since the claim, was
    deleted by us; a result written after the claim is its worker's own finish, and no entry at all a deletion
    that was not a finish of ours (the dataset itself deleted). Clocks apart, the one case this cannot tell is
    a worker that wrote its result just before the claim and deleted its job just after our read of it.
    """
    if not events:
        return set()
    fields = {Cache.DETAILS: 1, Cache.ERROR_CODE: 1, Cache.UPDATED_AT: 1}
    entries = entries_of_jobs(store.cache, [event[Event.JOB] for event in events], fields)
    ours = set()
    for event in events:
        entry = entries.get(key_of(cache_key_of_job(event[Event.JOB])))
        if entry is None:
            continue
        updated_at = as_utc(entry.get(Cache.UPDATED_AT))
        kept = (
            is_fresher(entry, event[Event.JOB]) and updated_at is not None and updated_at <= event[Event.FINALIZED_AT]
        )
        if kept or written_for(entry, event):
            ours.add(event[ID])
    return ours
