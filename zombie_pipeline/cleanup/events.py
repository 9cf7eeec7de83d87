"""The audit trail as the cleanup's write-ahead log: the claim, leases, batches of events by state, recorded outcomes.

Each event (``zombieEvents``, ``_id`` = the job's ``_id``) is driven by one run
at a time, its lease owner. Inserting it is the **claim**: the unique ``_id``
makes it exclusive, so of two concurrent cleanups one insert fails and that
cleanup leaves the job alone. A run that dies leaves its events with a lease
that runs out; the next run takes them over and completes them. Every step
reads its events in batches of ``policy.batch_size`` and must move each one on
(to a later state, or out of the log), so that a step ends when no event is
left for it. Everyone else reads the trail through ``zombie_pipeline.trail``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bson import ObjectId
from pymongo import UpdateMany, UpdateOne
from pymongo.client_session import ClientSession
from pymongo.collection import Collection as MongoCollection
from pymongo.errors import BulkWriteError

from zombie_pipeline.cleanup.causes import solitary_cause
from zombie_pipeline.cleanup.detection import Candidate
from zombie_pipeline.cleanup.results import Count, StepResult
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState, ZombieEvent
from zombie_pipeline.queue.generations import OLDEST_QUEUE_GENERATION, QueueGeneration
from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.queue.store import duplicate_indexes
from zombie_pipeline.queue.times import utc_now

T = TypeVar("T")


@dataclass
class Claims(StepResult):
    """What a claim did (its counts), and the events it inserted: nothing but this call has touched them yet."""

    ids: set[Any] = field(default_factory=set)


@dataclass(frozen=True)
class EventLog:
    """One run's side of the audit trail: the events it claims, holds by lease, drives and completes."""

    events: MongoCollection[ZombieEvent]
    run_id: str
    policy: ZombiePolicy

    def claim(
        self, candidates: Sequence[Candidate], now: dt.datetime, generation: QueueGeneration, finalized_at: dt.datetime
    ) -> Claims:
        """Record the intent to finalize each candidate; a job claimed by another cleanup is skipped.

        An event found already there under this run's lease was inserted by an earlier attempt of this run whose
        reply was lost (the step retried): it is this run's, counted as claimed, but not among the fresh ``ids``.
        """
        claims = Claims()
        for batch in batched(candidates, self.policy.batch_size):
            events = [
                event_of(candidate, self.policy, self.run_id, finalized_at, now, generation) for candidate in batch
            ]
            try:
                self.events.insert_many(events, ordered=False)
                refused: set[int] = set()
            except BulkWriteError as error:
                refused = duplicate_indexes(error)
            claims.ids.update(event[ID] for index, event in enumerate(events) if index not in refused)
            ours = self._owned([events[index][ID] for index in refused])
            claims.counts[Count.CLAIMED] += len(events) - len(refused) + len(ours)
            if len(refused) > len(ours):
                claims.counts[Count.CLAIMED_BY_ANOTHER_CLEANUP] += len(refused) - len(ours)
        return claims

    def take_over_expired(self, now: dt.datetime, default_generation: str = OLDEST_QUEUE_GENERATION) -> int:
        """Make this run the driver of every unfinished event whose lease ran out (its run died).

        An event without a queue generation (written before generations were recorded) gets ``default_generation``.
        """
        result = self.events.update_many(
            {Event.STATE: {"$ne": EventState.DONE}, Event.LEASE_UNTIL: {"$lt": now}},
            [
                {
                    "$set": {
                        Event.LEASE_OWNER: self.run_id,
                        Event.LEASE_UNTIL: lease_end(now, self.policy),
                        Event.QUEUE_GENERATION: {"$ifNull": [f"${Event.QUEUE_GENERATION}", default_generation]},
                    }
                }
            ],
        )
        return result.modified_count

    def claimed_generations(self) -> list[str]:
        """The queue generations this run's claimed events are finalized in, each its claim's."""
        query = {Event.LEASE_OWNER: self.run_id, Event.STATE: EventState.CLAIMED}
        return sorted(self.events.distinct(Event.QUEUE_GENERATION, query))

    def drain(self, query: Mapping[str, Any]) -> Iterator[list[ZombieEvent]]:
        """Batches of this run's events matching ``query``, until none is left; each batch must move them on.

        A long step renews the run's leases before a third of them has run out, so no
        reconcile takes over work that is still in progress.
        """
        renewed = time.monotonic()
        lease = self.policy.claim_lease_seconds
        while True:
            if lease and time.monotonic() - renewed > lease / 3:
                self._renew_leases()
                renewed = time.monotonic()
            batch = self._owned_batch(query)
            if not batch:
                return
            yield batch

    def complete(
        self, changes: Mapping[ObjectId, ZombieEvent], forgotten: Collection[Any], session: ClientSession | None
    ) -> None:
        """Record each event's outcome in one command (one update per distinct outcome: a batch repeats a few), and
        forget the claims lost to a worker, so that their jobs may be judged again later."""
        ids_by_change: dict[tuple[Any, ...], list[ObjectId]] = {}
        operations: list[UpdateOne | UpdateMany] = []
        for event_id, change in changes.items():
            key = tuple(sorted(change.items()))
            try:
                ids_by_change.setdefault(key, []).append(event_id)
            except TypeError:  # a list or a document in the outcome: this event's own update
                operations.append(UpdateOne({ID: event_id, Event.LEASE_OWNER: self.run_id}, {"$set": dict(change)}))
        operations += [
            UpdateMany({ID: {"$in": ids}, Event.LEASE_OWNER: self.run_id}, {"$set": dict(key)})
            for key, ids in ids_by_change.items()
        ]
        if operations:
            self.events.bulk_write(operations, ordered=False, session=session)
        if forgotten:
            self.events.delete_many(
                {ID: {"$in": list(forgotten)}, Event.LEASE_OWNER: self.run_id, Event.STATE: EventState.CLAIMED},
                session=session,
            )

    def _owned(self, event_ids: list[Any]) -> set[Any]:
        if not event_ids:
            return set()
        query = {ID: {"$in": event_ids}, Event.LEASE_OWNER: self.run_id}
        return {event[ID] for event in self.events.find(query, {ID: 1})}

    def _owned_batch(self, query: Mapping[str, Any]) -> list[ZombieEvent]:
        without_policy = {Event.POLICY: 0}  # kept for the audit; no step reads it back
        selected = {Event.LEASE_OWNER: self.run_id, **query}
        limit = self.policy.batch_size
        return list(self.events.find(selected, without_policy).sort(ID, 1).limit(limit).batch_size(limit))

    def _renew_leases(self) -> None:
        self.events.update_many(
            {Event.LEASE_OWNER: self.run_id, Event.STATE: {"$ne": EventState.DONE}},
            {"$set": {Event.LEASE_UNTIL: lease_end(utc_now(), self.policy)}},
        )


def event_of(
    candidate: Candidate,
    policy: ZombiePolicy,
    run_id: str,
    finalized_at: dt.datetime,
    now: dt.datetime,
    generation: QueueGeneration,
) -> ZombieEvent:
    """The claim of one candidate: the job as detection saw it, why, and the generation it is finalized in, to its end."""
    return {
        ID: candidate.id,
        Event.JOB: candidate.job,
        Event.REASON: candidate.reason,
        Event.ERROR_CODE: candidate.error_code,
        Event.THRESHOLD_SECONDS: candidate.threshold_seconds,
        Event.PAST_MAX_DURATION: candidate.past_max_duration,
        Event.POLICY: policy.as_document(),
        Event.DETECTED_AT: candidate.detected_at,
        Event.FINALIZED_AT: finalized_at,
        Event.DETECTION_SECONDS: candidate.detection_seconds(finalized_at),
        Event.RELEASE_LAG_SECONDS: candidate.release_lag_seconds(finalized_at),
        Event.RUN_ID: run_id,
        Event.QUEUE_GENERATION: generation.name,
        Event.STATE: EventState.CLAIMED,
        Event.LEASE_OWNER: run_id,
        Event.LEASE_UNTIL: lease_end(now, policy),
        Event.RETRY_JOB_ID: ObjectId(),
        Event.CAUSE: candidate.cause if candidate.cause is not None else solitary_cause(candidate.reason),
        Event.IN_WAVE: candidate.in_wave,
        **({Event.FREE_RUNS: candidate.free_runs} if candidate.free_runs is not None else {}),
    }


def batched(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def lease_end(now: dt.datetime, policy: ZombiePolicy) -> dt.datetime:
    return now + dt.timedelta(seconds=policy.claim_lease_seconds)
