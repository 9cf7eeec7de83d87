"""Quarantine: a (dataset, job type) whose workers keep crashing is not re-enqueued again.

A job that kills its worker every time (a dataset too big for any pod, a step
that segfaults on it) would be retried until the failed-run cap, each time on a
bigger worker, holding its user's slot. Sidekiq calls it a poison pill and
quarantines it after 3 recoveries in 72 hours; so do we, per (dataset, job type):
the ``quarantine_after_crashes``-th finalization of cause ``crash`` within
``quarantine_window_hours`` quarantines the pair (``zombieQuarantine``, one
document per pair). From that crash on, nothing of the pair is re-enqueued, and
its cache error says so in a sentence users can read; where the cache has
``failed_runs`` (2024-01 on), the entry records at least the deployment's own
limit for its error code, so that the deployment's backfill does not re-run it
either. The quarantine lapses ``quarantine_lapse_hours`` after it began, or an
operator lifts it (``lift_quarantine_job``), which re-enqueues the withheld jobs;
the crashes of a next quarantine are counted from its end on.

Decided from what the database holds, before the batch's cache entries are
written, and written first: a pass redone finds the quarantine it wrote (a crash
is under it from the crash that began it on, ties broken by event id) and
decides every event of the batch as before.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymongo.errors import DuplicateKeyError

from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.cleanup.retries import enqueue_due_retries, scheduled_retry
from zombie_pipeline.messages import quarantine_message
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import (
    Event,
    EventState,
    Quarantine,
    QuarantineDocument,
    RetryOutcome,
    ZombieEvent,
)
from zombie_pipeline.queue.cache import Cache, cache_key_of_job
from zombie_pipeline.queue.cache_entries import entries_of_jobs, key_of, written_for
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import ID, Job, job_type_problem, name_problem
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import as_utc, utc
from zombie_pipeline.trail import active_quarantines, is_active

#: A (dataset, job type).
Pair = tuple[str, str]


class NotQuarantined(ValueError):
    """A lift asked for a (dataset, job type) that is not quarantined: refused, naming the ones that are."""


def pair_of(job: Mapping[str, Any]) -> Pair:
    return job[Job.DATASET], job[Job.TYPE]


def ended_at(quarantine: Mapping[str, Any]) -> dt.datetime:
    """When a quarantine ended (or will end): its lift, else its lapse."""
    return as_utc(quarantine.get(Quarantine.LIFTED_AT)) or utc(quarantine[Quarantine.LAPSES_AT])


def _covers(quarantine: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    """Whether ``event``'s finalization falls under ``quarantine``: from the crash that began it (by time, then by
    event id) to its end."""
    finalized_at = utc(event[Event.FINALIZED_AT])
    begun = (utc(quarantine[Quarantine.SINCE]), quarantine[Quarantine.EVENT_ID]) <= (finalized_at, event[ID])
    return begun and is_active(quarantine, finalized_at)


def _crash_filter() -> dict[str, Any]:
    """Events of cause crash (an event written before causes were recorded: a missing heartbeat)."""
    return {"$or": [{Event.CAUSE: Cause.CRASH}, {Event.CAUSE: None, Event.REASON: Reason.MISSING_HEARTBEAT}]}


@dataclass(frozen=True)
class Quarantines:
    """The quarantine of one cleanup: which events of a batch fall under one, the new ones written first."""

    store: Store
    policy: ZombiePolicy

    def judge(self, events: Sequence[ZombieEvent]) -> dict[Any, str]:
        """The events of the batch whose (dataset, job type) is quarantined, each with the sentence users read.

        A crash that reaches the threshold begins a quarantine (written here, before anything else of the batch) and
        is itself not re-enqueued; the events after it in the batch fall under it.
        """
        threshold = self.policy.quarantine_after_crashes
        if not threshold or not events:
            return {}
        pairs = {pair_of(event[Event.JOB]) for event in events}
        current = self._quarantines(pairs)
        window = dt.timedelta(hours=self.policy.quarantine_window_hours)
        batch = sorted(events, key=lambda event: (utc(event[Event.FINALIZED_AT]), event[ID]))
        crashes_in_batch: dict[Pair, list[ZombieEvent]] = defaultdict(list)
        for event in batch:
            if cause_of_event(event) == Cause.CRASH:
                crashes_in_batch[pair_of(event[Event.JOB])].append(event)
        earlier = self._earlier_crashes(crashes_in_batch, window, {event[ID] for event in events})
        verdicts: dict[Any, str] = {}
        begun: list[tuple[QuarantineDocument | None, QuarantineDocument]] = []
        for event in batch:
            pair = pair_of(event[Event.JOB])
            quarantine = current.get(pair)
            if quarantine is not None and _covers(quarantine, event):
                verdicts[event[ID]] = self._message(quarantine)
                continue
            if cause_of_event(event) != Cause.CRASH:
                continue
            finalized_at = utc(event[Event.FINALIZED_AT])
            since = finalized_at - window
            if quarantine is not None and ended_at(quarantine) <= finalized_at:
                since = max(since, ended_at(quarantine))  # a new quarantine counts the crashes after the last one
            position = (finalized_at, event[ID])
            counted = [
                (at, event_id) for at, event_id in earlier.get(pair, []) if since < at and (at, event_id) <= position
            ]
            counted += [
                (utc(other[Event.FINALIZED_AT]), other[ID])
                for other in crashes_in_batch[pair]
                if since < utc(other[Event.FINALIZED_AT]) and (utc(other[Event.FINALIZED_AT]), other[ID]) <= position
            ]
            if len(counted) >= threshold:
                new = self._begun(pair, event, sorted(counted))
                begun.append((quarantine, new))
                current[pair] = new
                verdicts[event[ID]] = self._message(new)
        for previous, new in begun:
            self._write(previous, new)
        return verdicts

    def _quarantines(self, pairs: set[Pair]) -> dict[Pair, QuarantineDocument]:
        datasets = sorted({dataset for dataset, _ in pairs})
        found = self.store.quarantine.find({Quarantine.DATASET: {"$in": datasets}})
        return {
            pair: document
            for document in found
            if (pair := (document[Quarantine.DATASET], document[Quarantine.JOB_TYPE])) in pairs
        }

    def _earlier_crashes(
        self, crashes: Mapping[Pair, list[ZombieEvent]], window: dt.timedelta, batch_ids: set[Any]
    ) -> dict[Pair, list[tuple[dt.datetime, Any]]]:
        """The finalized crashes of the batch's pairs that may count with the batch's: (finalized_at, event id)."""
        if not crashes:
            return {}
        first = min(utc(event[Event.FINALIZED_AT]) for events in crashes.values() for event in events)
        datasets = sorted({dataset for dataset, _ in crashes})
        types = sorted({job_type for _, job_type in crashes})
        pipeline = on_index(
            {f"{Event.JOB}.{Job.DATASET}": {"$in": datasets}},
            {
                f"{Event.JOB}.{Job.TYPE}": {"$in": types},
                Event.FINALIZED_AT: {"$gte": first - window},
                Event.STATE: EventState.DONE,
                **_crash_filter(),
            },
            {"$project": {Event.FINALIZED_AT: 1, f"{Event.JOB}.{Job.DATASET}": 1, f"{Event.JOB}.{Job.TYPE}": 1}},
        )
        earlier: dict[Pair, list[tuple[dt.datetime, Any]]] = defaultdict(list)
        for event in self.store.events.aggregate(pipeline):
            pair = pair_of(event[Event.JOB])
            if pair in crashes and event[ID] not in batch_ids:
                earlier[pair].append((utc(event[Event.FINALIZED_AT]), event[ID]))
        return earlier

    def _begun(self, pair: Pair, event: ZombieEvent, counted: list[tuple[dt.datetime, Any]]) -> QuarantineDocument:
        since = utc(event[Event.FINALIZED_AT])
        return {
            Quarantine.DATASET: pair[0],
            Quarantine.JOB_TYPE: pair[1],
            Quarantine.SINCE: since,
            Quarantine.EVENT_ID: event[ID],
            Quarantine.CRASHES: len(counted),
            Quarantine.EVENT_IDS: [event_id for _, event_id in counted],
            Quarantine.WINDOW_HOURS: self.policy.quarantine_window_hours,
            Quarantine.LAPSES_AT: since + dt.timedelta(hours=self.policy.quarantine_lapse_hours),
            Quarantine.LIFTED_AT: None,
            Quarantine.LIFTED_BY: None,
        }

    def _write(self, previous: QuarantineDocument | None, new: QuarantineDocument) -> None:
        """The pair's document replaced by ``new``, by compare-and-set on the one read (or inserted where there was
        none); a concurrent cleanup that wrote first keeps its own, which holds the same pair."""
        key = {Quarantine.DATASET: new[Quarantine.DATASET], Quarantine.JOB_TYPE: new[Quarantine.JOB_TYPE]}
        try:
            if previous is None:
                self.store.quarantine.insert_one(dict(new))  # type: ignore[arg-type]  # a copy: pymongo adds its _id
            else:
                seen = {ID: previous[ID], Quarantine.SINCE: previous[Quarantine.SINCE]}
                self.store.quarantine.update_one({**key, **seen}, {"$set": dict(new)})
        except DuplicateKeyError:
            pass

    @staticmethod
    def _message(quarantine: Mapping[str, Any]) -> str:
        return quarantine_message(quarantine[Quarantine.CRASHES], quarantine[Quarantine.WINDOW_HOURS])


# --- reading them ---------------------------------------------------------------------------------------------


def quarantine_row(quarantine: Mapping[str, Any]) -> dict[str, Any]:
    """A quarantine as one row of a table."""
    return {
        "dataset": quarantine[Quarantine.DATASET],
        "type": quarantine[Quarantine.JOB_TYPE],
        "crashes": quarantine[Quarantine.CRASHES],
        "window_hours": quarantine[Quarantine.WINDOW_HOURS],
        "since": f"{utc(quarantine[Quarantine.SINCE]):%Y-%m-%d %H:%M:%S}",
        "lapses_at": f"{utc(quarantine[Quarantine.LAPSES_AT]):%Y-%m-%d %H:%M:%S}",
    }


# --- lifting one ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lifted:
    """What a lift did: the quarantine lifted, the withheld jobs re-enqueued now (or found waiting already)."""

    dataset: str
    job_type: str
    scheduled: int  # withheld jobs whose error is still what users read, re-enqueued through zombieRetries
    counts: Mapping[str, int]  # what enqueueing the due retries did (enqueued, already queued)


def lift_problem(dataset: Any, job_type: Any) -> str | None:
    """Why ``dataset`` / ``job_type`` cannot name a quarantine, or None."""
    return name_problem(Job.DATASET, dataset) or job_type_problem(job_type)


def lift(store: Store, policy: ZombiePolicy, dataset: str, job_type: str, run_id: str, now: dt.datetime) -> Lifted:
    """Lift the quarantine of (``dataset``, ``job_type``) and re-enqueue the jobs it withheld; :class:`NotQuarantined`
    (nothing written) when it holds none.

    Of each cache key, the latest withheld job is re-run, if its error is still the entry users read (a newer result
    needs no re-run): as a retry due now (``zombieRetries``, ``_id`` = the retry id chosen at its claim), which the
    deployment's counters follow as any retry; then the lift is recorded. A lift that dies in between leaves the
    quarantine holding and its retries scheduled: run again, it schedules nothing twice; the next cleanup enqueues
    what is due either way.
    """
    problem = lift_problem(dataset, job_type)
    if problem:
        raise NotQuarantined(f"cannot lift a quarantine: {problem}")
    quarantine = store.quarantine.find_one({Quarantine.DATASET: dataset, Quarantine.JOB_TYPE: job_type})
    if quarantine is None or not is_active(quarantine, now):
        holding = [f"{q[Quarantine.DATASET]} {q[Quarantine.JOB_TYPE]}" for q in active_quarantines(store, now)]
        raise NotQuarantined(
            f"{dataset} {job_type} is not quarantined"
            + (" (its quarantine has ended)" if quarantine is not None else "")
            + f"; quarantined now: {holding or 'none'}"
        )
    withheld = _withheld(store, dataset, job_type)
    scheduled = [
        scheduled_retry(event, QUEUE_GENERATIONS[event[Event.QUEUE_GENERATION]], now, due_at=now) for event in withheld
    ]
    if scheduled:
        present = {item[ID] for item in store.retries.find({ID: {"$in": [item[ID] for item in scheduled]}}, {ID: 1})}
        fresh = [item for item in scheduled if item[ID] not in present]
        if fresh:
            store.retries.insert_many(fresh, ordered=False)
    store.quarantine.update_one(
        {ID: quarantine[ID], Quarantine.LIFTED_AT: None},
        {"$set": {Quarantine.LIFTED_AT: now, Quarantine.LIFTED_BY: run_id}},
    )
    counts = enqueue_due_retries(store, policy, now)
    return Lifted(dataset, job_type, len(scheduled), dict(counts))


def _withheld(store: Store, dataset: str, job_type: str) -> list[ZombieEvent]:
    """The latest withheld job of each cache key of the pair whose error entry is still the one users read."""
    events = store.events.find(
        {
            f"{Event.JOB}.{Job.DATASET}": dataset,
            f"{Event.JOB}.{Job.TYPE}": job_type,
            Event.RETRY_OUTCOME: RetryOutcome.QUARANTINED,
            Event.STATE: EventState.DONE,
        }
    ).sort(Event.FINALIZED_AT, -1)
    latest: dict[tuple[Any, ...], ZombieEvent] = {}
    for event in events:
        latest.setdefault(key_of(cache_key_of_job(event[Event.JOB])), event)
    if not latest:
        return []
    fields = {Cache.DETAILS: 1, Cache.ERROR_CODE: 1}
    entries = entries_of_jobs(store.cache, [event[Event.JOB] for event in latest.values()], fields)
    return [event for key, event in latest.items() if written_for(entries.get(key), event)]
