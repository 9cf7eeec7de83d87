"""Finalizing zombies exactly once, never over a live worker, and telling users why.

The audit collection is also the write-ahead log of a cleanup. Each step moves
events forward and is safe to repeat, so a run that dies anywhere leaves work
that the next run's reconcile completes:

1. **claim**: insert one event per candidate, ``_id`` = the job's ``_id``. The
   unique ``_id`` makes the claim exclusive: of two concurrent cleanups, one
   insert fails and that cleanup leaves the job alone.
2. **finalize**: compare-and-set the claimed jobs to ``error`` (still
   ``started``, same ``started_at`` and ``last_heartbeat`` as detection saw),
   stamping ``finished_at`` with the event's ``finalized_at``. A read-back tells
   won from lost: a job whose worker beat or finished in between is left alone
   and its event deleted.
3. **cache errors**: replace the cache entry of each finalized job, unless a
   fresher result is there; an entry whose ``updated_at`` is the event's
   ``finalized_at`` is recognised as already written.
4. **retries**: re-enqueue below the limit, with an ``_id`` chosen at claim
   time, so a repeated insert is refused by the server instead of doubling.
5. **done**.

Every step works in batches of ``policy.batch_size``: the database commands of
a cleanup grow with zombies / batch size, not with zombies.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from bson import ObjectId
from pymongo import InsertOne, ReplaceOne, UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError

from zombie_pipeline.cache_entries import entries_of_jobs, key_of
from zombie_pipeline.detection import Candidate, Detection, brake_for, detect, find_malformed_started, on_index
from zombie_pipeline.documents import (
    ERROR_MESSAGE_OF_CODE,
    ID,
    Cache,
    CacheOutcome,
    Event,
    EventState,
    Job,
    Reason,
    RetryOutcome,
    Status,
    as_utc,
    cache_key_of_job,
    job_row,
    utc_now,
    without_none,
)
from zombie_pipeline.generations import (
    CACHE_GENERATIONS,
    NEWEST_CACHE_GENERATION,
    CacheGeneration,
    cache_generation_of,
    failed_runs_of,
    stored_failed_runs,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.store import Store

DUPLICATE_KEY = 11000
#: Fields a re-enqueued job does not inherit from the job it retries.
_RUN_FIELDS = {Job.STATUS, Job.CREATED_AT, Job.STARTED_AT, Job.FINISHED_AT, Job.LAST_HEARTBEAT}
_GENERATION_SAMPLE = 200
_ENTRY_READ_BATCH = 10_000  # entries come back in one reply, not one getMore per 101


class BrakeEngaged(RuntimeError):
    """Too many started jobs look dead at once; nothing was written."""


def batched(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass
class StepResult:
    """What one step did, for run metadata."""

    counts: Counter = field(default_factory=Counter)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: "StepResult") -> "StepResult":
        self.counts.update(other.counts)
        self.rows.extend(other.rows)
        return self


# --- reconcile ----------------------------------------------------------------


def take_over_expired(store: Store, run_id: str, now: dt.datetime, policy: ZombiePolicy) -> int:
    """Make this run the driver of every unfinished event whose lease ran out (its run died)."""
    result = store.events.update_many(
        {Event.STATE: {"$ne": EventState.DONE}, Event.LEASE_UNTIL: {"$lt": now}},
        {"$set": {Event.LEASE_OWNER: run_id, Event.LEASE_UNTIL: _lease_end(now, policy)}},
    )
    return result.modified_count


def _lease_end(now: dt.datetime, policy: ZombiePolicy) -> dt.datetime:
    return now + dt.timedelta(seconds=policy.claim_lease_seconds)


# --- claim ----------------------------------------------------------------------


def claim(store: Store, candidates: list[Candidate], policy: ZombiePolicy, run_id: str, now: dt.datetime) -> StepResult:
    """Record the intent to finalize each candidate; a job claimed by another cleanup is skipped."""
    result = StepResult()
    finalized_at = utc_now()
    for batch in batched(candidates, policy.batch_size):
        events = [_event_of(candidate, policy, run_id, finalized_at, now) for candidate in batch]
        try:
            store.events.insert_many(events, ordered=False)
            result.counts["claimed"] += len(events)
        except BulkWriteError as error:
            refused = _duplicate_indexes(error)
            result.counts["claimed"] += len(events) - len(refused)
            result.counts["claimed_by_another_cleanup"] += len(refused)
    return result


def _event_of(
    candidate: Candidate, policy: ZombiePolicy, run_id: str, finalized_at: dt.datetime, now: dt.datetime
) -> dict[str, Any]:
    return {
        ID: candidate.id,
        Event.JOB: candidate.job,
        Event.REASON: candidate.reason,
        Event.ERROR_CODE: candidate.error_code,
        Event.THRESHOLD_SECONDS: candidate.threshold_seconds,
        Event.POLICY: policy.as_document(),
        Event.DETECTED_AT: candidate.detected_at,
        Event.FINALIZED_AT: finalized_at,
        Event.RUN_ID: run_id,
        Event.STATE: EventState.CLAIMED,
        Event.LEASE_OWNER: run_id,
        Event.LEASE_UNTIL: _lease_end(now, policy),
        Event.RETRY_JOB_ID: ObjectId(),
    }


def _duplicate_indexes(error: BulkWriteError) -> set[int]:
    """Indexes of the operations refused as duplicates; any other write error is re-raised."""
    refused = set()
    for write_error in error.details.get("writeErrors", []):
        if write_error.get("code") != DUPLICATE_KEY:
            raise error
        refused.add(write_error["index"])
    return refused


def _owned(store: Store, run_id: str, state: str, limit: int, extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    query = {Event.LEASE_OWNER: run_id, Event.STATE: state, **(extra or {})}
    without_policy = {Event.POLICY: 0}  # kept for the audit; no step reads it back
    return list(store.events.find(query, without_policy).sort(ID, 1).limit(limit).batch_size(limit))


def _drain(store: Store, run_id: str, state: str, policy: ZombiePolicy, extra: Mapping[str, Any] | None = None) -> Iterator[list[dict[str, Any]]]:
    """Batches of this run's events in ``state``, until none is left; each batch must move them on.

    A long step renews the run's leases before a third of them has run out, so no
    reconcile takes over work that is still in progress.
    """
    renewed = time.monotonic()
    while True:
        if policy.claim_lease_seconds and time.monotonic() - renewed > policy.claim_lease_seconds / 3:
            renew_leases(store, run_id, policy)
            renewed = time.monotonic()
        batch = _owned(store, run_id, state, policy.batch_size, extra)
        if not batch:
            return
        yield batch


def renew_leases(store: Store, run_id: str, policy: ZombiePolicy) -> None:
    store.events.update_many(
        {Event.LEASE_OWNER: run_id, Event.STATE: {"$ne": EventState.DONE}},
        {"$set": {Event.LEASE_UNTIL: _lease_end(utc_now(), policy)}},
    )


def _set_on_events(store: Store, run_id: str, changes: Mapping[ObjectId, Mapping[str, Any]]) -> None:
    """Record each event's outcome: one update per distinct outcome, since a batch repeats a few."""
    ids_by_change: dict[tuple, list[ObjectId]] = {}
    for event_id, change in changes.items():
        ids_by_change.setdefault(tuple(sorted(change.items())), []).append(event_id)
    if not ids_by_change:
        return
    store.events.bulk_write(
        [
            UpdateMany({ID: {"$in": ids}, Event.LEASE_OWNER: run_id}, {"$set": dict(change)})
            for change, ids in ids_by_change.items()
        ],
        ordered=False,
    )


# --- finalize ---------------------------------------------------------------------


def finalize(store: Store, run_id: str, policy: ZombiePolicy) -> StepResult:
    """Compare-and-set every claimed job of this run to error; keep the ones won."""
    result = StepResult()
    for events in _drain(store, run_id, EventState.CLAIMED, policy):
        store.jobs.bulk_write([_finalize_operation(event) for event in events], ordered=False)
        current = {
            job[ID]: job
            for job in store.jobs.find(
                {ID: {"$in": [event[ID] for event in events]}}, {Job.STATUS: 1, Job.FINISHED_AT: 1}
            ).batch_size(_ENTRY_READ_BATCH)
        }
        won, lost = [], []
        for event in events:
            job = current.get(event[ID], {})
            finished_by_us = job.get(Job.STATUS) == Status.ERROR and as_utc(job.get(Job.FINISHED_AT)) == event[Event.FINALIZED_AT]
            (won if finished_by_us else lost).append(event)
        if won:
            store.events.update_many(
                {ID: {"$in": [event[ID] for event in won]}, Event.LEASE_OWNER: run_id},
                {"$set": {Event.STATE: EventState.FINALIZED}},
            )
        if lost:  # the worker was alive after all: forget the claim, the job may be judged again later
            store.events.delete_many(
                {ID: {"$in": [event[ID] for event in lost]}, Event.LEASE_OWNER: run_id, Event.STATE: EventState.CLAIMED}
            )
        result.counts["finalized"] += len(won)
        result.counts["lost_to_live_worker"] += len(lost)
        for event in won:
            result.counts[f"reason:{event[Event.REASON]}"] += 1
            result.counts[f"type:{event[Event.JOB][Job.TYPE]}"] += 1
            result.rows.append(_finalized_row(event))
    return result


def _finalize_operation(event: Mapping[str, Any]) -> UpdateOne:
    job = event[Event.JOB]
    return UpdateOne(
        {
            ID: event[ID],
            Job.STATUS: Status.STARTED,
            Job.STARTED_AT: job[Job.STARTED_AT],
            Job.LAST_HEARTBEAT: job.get(Job.LAST_HEARTBEAT),  # None matches missing or null
        },
        {"$set": {Job.STATUS: Status.ERROR, Job.FINISHED_AT: event[Event.FINALIZED_AT]}},
    )


def _finalized_row(event: Mapping[str, Any]) -> dict[str, Any]:
    job = event[Event.JOB]
    return job_row(
        event[ID],
        job,
        reason=event[Event.REASON],
        threshold_seconds=event[Event.THRESHOLD_SECONDS],
        ran_seconds=round((event[Event.FINALIZED_AT] - as_utc(job[Job.STARTED_AT])).total_seconds(), 1),
    )


# --- cache errors -----------------------------------------------------------------


def detect_cache_generation(store: Store, policy: ZombiePolicy) -> CacheGeneration:
    """The configured generation, else the one the newest existing entries were written in."""
    if policy.cache_generation:
        return CACHE_GENERATIONS[policy.cache_generation]
    seen: set[str] = set()
    recent = store.cache.find({}, {Cache.CONTENT: 0, Cache.DETAILS: 0}).sort("$natural", -1).limit(_GENERATION_SAMPLE)
    for entry in recent:
        seen.update(entry)
    if not seen:  # an empty cache: assume the newest deployment
        return CACHE_GENERATIONS[NEWEST_CACHE_GENERATION]
    return cache_generation_of(seen)


def write_cache_errors(store: Store, run_id: str, policy: ZombiePolicy, generation: CacheGeneration | None = None) -> StepResult:
    """Write the error entry of every job this run finalized, unless a fresher one is there."""
    generation = generation or detect_cache_generation(store, policy)
    result = StepResult()
    result.counts[f"cache_generation:{generation.name}"] = 1
    pending = {Event.CACHE_OUTCOME: {"$exists": False}}
    for events in _drain(store, run_id, EventState.FINALIZED, policy, pending):
        existing = _existing_entries(store, events)
        operations, expected, planned = [], {}, {}
        outcomes: dict[ObjectId, tuple[str, int]] = {}
        for event in events:
            key = key_of(cache_key_of_job(event[Event.JOB]))
            entry = existing.get(key)
            failed_runs = failed_runs_of(entry) + 1
            if entry is not None and as_utc(entry.get(Cache.UPDATED_AT)) == event[Event.FINALIZED_AT]:
                outcomes[event[ID]] = (CacheOutcome.WRITTEN, stored_failed_runs(entry))  # a previous attempt wrote it
                continue
            if entry is not None and _is_fresher(entry, event):
                outcomes[event[ID]] = (CacheOutcome.SKIPPED_FRESHER, failed_runs_of(entry))
                continue
            if key not in planned:  # two zombies of one key (a broken queue) share one entry
                document = {ID: entry[ID] if entry is not None else ObjectId(), **error_entry(event, entry, generation, policy, failed_runs)}
                operations.append(_write_operation(entry, document))
                planned[key] = document[ID]
            expected[event[ID]] = (planned[key], event[Event.FINALIZED_AT], failed_runs)
        if operations:
            _bulk_write_refusing_duplicates(store, operations)
            entry_ids = [entry_id for entry_id, _, _ in expected.values()]
            written = {entry[ID]: entry for entry in store.cache.find({ID: {"$in": entry_ids}}, {Cache.UPDATED_AT: 1}).batch_size(_ENTRY_READ_BATCH)}
            for event_id, (entry_id, finalized_at, failed_runs) in expected.items():
                ours = entry_id in written and as_utc(written[entry_id].get(Cache.UPDATED_AT)) == finalized_at
                outcomes[event_id] = (CacheOutcome.WRITTEN, failed_runs) if ours else (CacheOutcome.SKIPPED_FRESHER, failed_runs - 1)
        _set_on_events(
            store,
            run_id,
            {event_id: {Event.CACHE_OUTCOME: outcome, Event.FAILED_RUNS: failed_runs} for event_id, (outcome, failed_runs) in outcomes.items()},
        )
        result.counts.update(f"cache_{outcome}" for outcome, _ in outcomes.values())
    return result


def _existing_entries(store: Store, events: list[Mapping[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return entries_of_jobs(store.cache, [event[Event.JOB] for event in events], {Cache.CONTENT: 0})


def _is_fresher(entry: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    """An entry updated after the zombie started holds a newer result than the zombie could give."""
    updated_at = as_utc(entry.get(Cache.UPDATED_AT))
    return updated_at is not None and updated_at > as_utc(event[Event.JOB][Job.STARTED_AT])


def error_entry(
    event: Mapping[str, Any],
    existing: Mapping[str, Any] | None,
    generation: CacheGeneration,
    policy: ZombiePolicy,
    failed_runs: int,
) -> dict[str, Any]:
    """The cache entry telling users why the job failed, with only the generation's fields."""
    job = event[Event.JOB]
    error_code = event[Event.ERROR_CODE]
    message = ERROR_MESSAGE_OF_CODE[error_code]
    finalized_at = event[Event.FINALIZED_AT]
    duration = round((finalized_at - as_utc(job[Job.STARTED_AT])).total_seconds(), 3)
    last_heartbeat = as_utc(job.get(Job.LAST_HEARTBEAT))
    details: dict[str, Any] = {
        "error": message,
        "reason": event[Event.REASON],
        "last_heartbeat": last_heartbeat.isoformat() if last_heartbeat else None,
        "threshold_seconds": event[Event.THRESHOLD_SECONDS],
        "run_id": event[Event.RUN_ID],
        "job_id": str(event[ID]),
    }
    entry: dict[str, Any] = {
        **cache_key_of_job(job),
        Cache.HTTP_STATUS: policy.http_status,
        Cache.ERROR_CODE: error_code,
        Cache.CONTENT: {"error": message},
        Cache.DETAILS: details,
        Cache.UPDATED_AT: finalized_at,
    }
    if existing is not None:  # keep what the worker knew; never invent a version
        entry[generation.version_field] = existing.get(generation.version_field)
        entry[Cache.DATASET_GIT_REVISION] = existing.get(Cache.DATASET_GIT_REVISION)
    for name, value in ((Cache.DURATION, duration), (Cache.FAILED_RUNS, failed_runs)):
        if generation.declares(name):
            entry[name] = value
        else:
            details[name] = value
    return generation.keep_declared(entry)


def _write_operation(existing: Mapping[str, Any] | None, document: dict[str, Any]) -> ReplaceOne | InsertOne:
    if existing is not None:  # compare-and-set on the entry we read
        return ReplaceOne({ID: existing[ID], Cache.UPDATED_AT: existing.get(Cache.UPDATED_AT)}, document)
    # No entry was there: insert, with the _id chosen here; if one appeared meanwhile, the
    # unique key refuses ours and the read-back by _id reports the entry as fresher.
    return InsertOne(document)


def _bulk_write_refusing_duplicates(store: Store, operations: list) -> None:
    try:
        store.cache.bulk_write(operations, ordered=False)
    except BulkWriteError as error:
        _duplicate_indexes(error)  # a fresher entry appeared: the read-back reports it


# --- retries --------------------------------------------------------------------------


def enqueue_retries(store: Store, run_id: str, policy: ZombiePolicy, now: dt.datetime | None = None) -> StepResult:
    """Re-enqueue finalized jobs below their retry limit, once, then close their events."""
    now = now or utc_now()
    result = StepResult()
    ready = {Event.CACHE_OUTCOME: {"$exists": True}}
    for events in _drain(store, run_id, EventState.FINALIZED, policy, ready):
        outcomes = {event[ID]: _retry_decision(event, policy) for event in events}
        wanted = [event for event in events if outcomes[event[ID]] == RetryOutcome.ENQUEUED]
        queued = _queued_unicity_ids(store, wanted)
        new_jobs = []
        for event in wanted:
            holder = queued.get(event[Event.JOB][Job.UNICITY_ID])
            if holder is not None and holder != event[Event.RETRY_JOB_ID]:
                outcomes[event[ID]] = RetryOutcome.ALREADY_QUEUED
            elif holder is None:
                new_jobs.append(retry_job(event, now))
                queued[event[Event.JOB][Job.UNICITY_ID]] = event[Event.RETRY_JOB_ID]  # one retry per unicity_id in a batch too
        if new_jobs:
            try:
                store.jobs.insert_many(new_jobs, ordered=False)
            except BulkWriteError as error:
                _duplicate_indexes(error)  # inserted by an earlier attempt of this event
        _set_on_events(
            store,
            run_id,
            {event_id: {Event.RETRY_OUTCOME: outcome, Event.STATE: EventState.DONE, Event.COMPLETED_AT: now} for event_id, outcome in outcomes.items()},
        )
        result.counts.update(f"retry_{outcome}" for outcome in outcomes.values())
    return result


def _retry_decision(event: Mapping[str, Any], policy: ZombiePolicy) -> str:
    if event[Event.CACHE_OUTCOME] == CacheOutcome.SKIPPED_FRESHER:
        return RetryOutcome.NOT_RETRIED  # a newer result exists: nothing to redo
    if event.get(Event.FAILED_RUNS, 1) > policy.retry_limit_of(event[Event.ERROR_CODE]):
        return RetryOutcome.LIMIT_REACHED
    return RetryOutcome.ENQUEUED


def _queued_unicity_ids(store: Store, events: list[Mapping[str, Any]]) -> dict[str, ObjectId]:
    """unicity_id -> _id of a waiting or started job that already holds it."""
    if not events:
        return {}
    unicity_ids = sorted({event[Event.JOB][Job.UNICITY_ID] for event in events})
    pipeline = on_index(
        {Job.UNICITY_ID: {"$in": unicity_ids}},
        {Job.STATUS: {"$in": [Status.WAITING, Status.STARTED]}},
        {"$project": {Job.UNICITY_ID: 1}},
    )
    holders = store.jobs.aggregate(pipeline, batchSize=_ENTRY_READ_BATCH)
    return {job[Job.UNICITY_ID]: job[ID] for job in holders}


def retry_job(event: Mapping[str, Any], now: dt.datetime) -> dict[str, Any]:
    """A new waiting job with the fields of the one it retries (its own generation), nothing more."""
    job = {name: value for name, value in event[Event.JOB].items() if name not in _RUN_FIELDS and name != ID}
    return without_none({ID: event[Event.RETRY_JOB_ID], **job, Job.STATUS: Status.WAITING, Job.CREATED_AT: now})


# --- the whole cleanup ----------------------------------------------------------------------


@dataclass
class CleanupReport:
    run_id: str
    dry_run: bool
    detection: Detection | None = None
    malformed: list = field(default_factory=list)
    steps: StepResult = field(default_factory=StepResult)
    reconciled: StepResult = field(default_factory=StepResult)

    @property
    def counts(self) -> Counter:
        return self.steps.counts

    def candidate_rows(self) -> list[dict[str, Any]]:
        return [candidate.evidence() for candidate in (self.detection.candidates if self.detection else [])]


def finalize_zombies(store: Store, candidates: list[Candidate], policy: ZombiePolicy, run_id: str, now: dt.datetime) -> StepResult:
    """Claim the candidates, then finalize the ones claimed."""
    return claim(store, candidates, policy, run_id, now).merge(finalize(store, run_id, policy))


def complete(store: Store, run_id: str, policy: ZombiePolicy, generation: CacheGeneration | None = None) -> StepResult:
    """Drive every event this run owns to done: finalize, cache errors, retries."""
    result = finalize(store, run_id, policy)
    result.merge(write_cache_errors(store, run_id, policy, generation))
    result.merge(enqueue_retries(store, run_id, policy))
    return result


def reconcile(store: Store, run_id: str, policy: ZombiePolicy, now: dt.datetime | None = None) -> StepResult:
    """Complete what crashed runs left half done; runs first in every cleanup."""
    taken = take_over_expired(store, run_id, now or utc_now(), policy)
    result = complete(store, run_id, policy) if taken else StepResult()
    result.counts["taken_over"] += taken
    return result


def find_zombies(
    store: Store,
    policy: ZombiePolicy,
    now: dt.datetime | None = None,
    job_types: Iterable[str] | None = None,
    override_brake: bool = False,
) -> Detection:
    """Detect, and refuse (raise BrakeEngaged) when the share of dead-looking jobs is implausible."""
    detection = detect(store.jobs, policy, now or utc_now(), job_types)
    detection.malformed.extend(
        m for m in find_malformed_started(store.jobs, job_types) if m.id not in {x.id for x in detection.malformed}
    )
    if detection.candidates and not override_brake:
        brake = brake_for(store.jobs, detection, policy, job_types)
        if brake.engaged:
            raise BrakeEngaged(brake.message())
    return detection


def run_cleanup(
    store: Store,
    policy: ZombiePolicy,
    run_id: str,
    now: dt.datetime | None = None,
    job_types: Iterable[str] | None = None,
    dry_run: bool = False,
    override_brake: bool = False,
) -> CleanupReport:
    """The whole cleanup in one call: the steps of ``kill_zombies_job``'s ops, in their order."""
    job_types = list(job_types) if job_types is not None else None
    report = CleanupReport(run_id=run_id, dry_run=dry_run)
    if not dry_run:
        report.reconciled = reconcile(store, run_id, policy, now)
    report.detection = find_zombies(store, policy, now, job_types, override_brake)
    report.malformed = report.detection.malformed
    if dry_run:
        return report
    report.steps.merge(finalize_zombies(store, report.detection.candidates, policy, run_id, now or utc_now()))
    report.steps.merge(write_cache_errors(store, run_id, policy))
    report.steps.merge(enqueue_retries(store, run_id, policy))
    return report


@dataclass
class RunSummary:
    """A run's work as the audit trail records it, plus the counts of the steps that left no event."""

    counts: Counter
    rows: list[dict[str, Any]]

    def one_line(self) -> str:
        c = self.counts
        return (
            f"finalized {c['finalized']} zombies ({c['reason:missing_heartbeat']} missing heartbeat, "
            f"{c['reason:never_heartbeated']} never heartbeated, {c['reason:exceeded_max_duration']} past maximum "
            f"duration); {c['lost_to_live_worker']} lost to live workers; {c['cache_written']} cache errors written, "
            f"{c['cache_skipped_fresher']} kept as fresher; {c['retry_enqueued']} retries enqueued, "
            f"{c['retry_limit_reached']} at their retry limit"
        )

    def markdown(self) -> str:
        lines = [self.one_line(), "", "| reason | type | finalized |", "|---|---|---|"]
        by_pair = Counter((row["reason"], row["type"]) for row in self.rows)
        lines += [f"| {reason} | `{job_type}` | {count} |" for (reason, job_type), count in sorted(by_pair.items())]
        return "\n".join(lines)


def summarize_run(store: Store, run_id: str, step_counts: Mapping[str, int] | None = None) -> RunSummary:
    """Counts and a table of every finalization this run drove, read back from the audit trail."""
    counts: Counter = Counter(step_counts or {})
    for name in ("finalized", "lost_to_live_worker", "cache_written", "cache_skipped_fresher", "retry_enqueued", "retry_limit_reached"):
        counts.setdefault(name, 0)
    for reason in (Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.EXCEEDED_MAX_DURATION):
        counts.setdefault(f"reason:{reason}", 0)
    rows = []
    query = {Event.LEASE_OWNER: run_id, Event.STATE: EventState.DONE}
    for event in store.events.find(query).sort(Event.FINALIZED_AT, 1):
        row = _finalized_row(event)
        row["cache"] = event.get(Event.CACHE_OUTCOME)
        row["retry"] = event.get(Event.RETRY_OUTCOME)
        rows.append(row)
    return RunSummary(counts=counts, rows=rows)
