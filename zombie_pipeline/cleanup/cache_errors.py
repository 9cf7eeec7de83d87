"""The error users see: a finalized zombie's cache entry, written as the deployment writes it.

One entry per cache key, in the cache's own document generation (only the
fields it declares), never over a fresher result: an entry updated after the
zombie started holds what a newer run computed. The entry carries the job's
``revision`` as ``dataset_git_revision`` where jobs have one, the runner version
of the job's step as the deployment writes it on a crash (its processing graph's,
which the cache shows: ``queue.cache_entries.step_version``; none where the cache
shows none, never a guess), the run's ``duration``, and ``failed_runs`` counted as
the deployment in front counts it (its generation's rule:
``queue.cache_entries.failed_runs_after_crash``), but for a death whose cause
costs no run (a deploy, by default: ``causes``), whose entry keeps the count it
had; ``cacheTotalMetric`` is kept in step where the cache has it. ``details``
(a free dictionary in every generation) carries the event's facts, its cause
among them. A quarantined job's entry says so in its message, and records at
least the deployment's own limit of failed runs where the cache has the field,
so that the deployment's backfill leaves it alone too (``quarantine``).

Idempotent: an entry that already carries this job's id in its ``details`` was
written for it by an earlier attempt, and is recognized rather than rewritten;
that attempt may have died before its ``cacheTotalMetric`` move, so the keys the
move touches (the entry's, and the one it replaced) are returned in doubt, to be
set from a recount (``counters.repair``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson import ObjectId
from pymongo import InsertOne, ReplaceOne, UpdateOne
from pymongo.client_session import ClientSession
from pymongo.errors import BulkWriteError

from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.cleanup.counters import CountersInDoubt
from zombie_pipeline.messages import (
    DEPLOY_WAVE_MESSAGE,
    ERROR_MESSAGE_OF_REASON,
    terminated_alone_message,
    terminated_too_often_message,
)
from zombie_pipeline.queue.audit_documents import (
    CacheOutcome,
    CacheResult,
    Event,
    FreeRuns,
    PreviousEntry,
    PreviousEntrySummary,
    ZombieEvent,
)
from zombie_pipeline.queue.cache import (
    CACHE_CONTENT_ERROR,
    DEPLOYMENT_MAX_FAILED_RUNS,
    Cache,
    CacheEntry,
    CacheMetric,
    ErrorCode,
    cache_key_of_job,
)
from zombie_pipeline.queue.cache_entries import (
    DETAIL_JOB_ID,
    DETAIL_PREVIOUS,
    DETAIL_QUARANTINED,
    CacheKey,
    carried_failed_runs,
    current_runner_version,
    entries_of_jobs,
    failed_runs_after_crash,
    is_fresher,
    key_of,
    runner_version_of,
    step_version,
    stored_failed_runs,
    written_for,
)
from zombie_pipeline.queue.generations import CacheGeneration, FailedRunsRule
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.queue.store import READ_BATCH, Store, duplicate_indexes
from zombie_pipeline.queue.times import as_utc, utc
from zombie_pipeline.queue.transactions import Conflict


@dataclass
class CacheWrite:
    """The cache errors of a batch: each event's result (by event id), and the ``cacheTotalMetric`` keys in doubt."""

    outcomes: dict[Any, CacheResult] = field(default_factory=dict)
    in_doubt: CountersInDoubt = field(default_factory=CountersInDoubt)

    def __getitem__(self, event_id: Any) -> CacheResult:
        return self.outcomes[event_id]


def summary_of(entry: Mapping[str, Any] | None) -> PreviousEntrySummary | None:
    """What an entry told users before our error replaced it: the small fields, never the content (JSON-ready)."""
    if entry is None:
        return None
    updated_at = as_utc(entry.get(Cache.UPDATED_AT))
    return {
        PreviousEntry.UPDATED_AT: updated_at.isoformat() if updated_at else None,
        PreviousEntry.HTTP_STATUS: entry.get(Cache.HTTP_STATUS),
        PreviousEntry.ERROR_CODE: entry.get(Cache.ERROR_CODE),
        PreviousEntry.FAILED_RUNS: stored_failed_runs(entry),
        PreviousEntry.DATASET_GIT_REVISION: entry.get(Cache.DATASET_GIT_REVISION),
        PreviousEntry.RUNNER_VERSION: runner_version_of(entry),
    }


def message_of(event: ZombieEvent) -> str:
    """What users read of a finalized zombie: a deploy wave's sentence, a lone SIGTERM's (free, or charged past its
    pair's free re-runs), else its reason's."""
    reason = Reason(event[Event.REASON])
    budget = event.get(Event.FREE_RUNS)
    if budget is not None:
        if budget[FreeRuns.CHARGED]:
            return terminated_too_often_message(budget[FreeRuns.ALONE], budget[FreeRuns.WINDOW_HOURS])
        return terminated_alone_message(budget[FreeRuns.FREE], budget[FreeRuns.LIMIT], budget[FreeRuns.WINDOW_HOURS])
    if cause_of_event(event) == Cause.DEPLOY and (reason != Reason.TERMINATED or event.get(Event.IN_WAVE)):
        return DEPLOY_WAVE_MESSAGE
    return ERROR_MESSAGE_OF_REASON[reason]


def error_entry(
    event: ZombieEvent,
    existing: Mapping[str, Any] | None,
    generation: CacheGeneration,
    http_status: int,
    failed_runs: int,
    quarantined: str | None = None,
    step_version: int | None = None,
) -> CacheEntry:
    """The cache entry telling users why the job failed, with only the generation's fields; ``quarantined``: the
    sentence that says its (dataset, job type) is quarantined, instead of the reason's; ``step_version``: the
    version of the job's step the cache shows (``cache_entries.step_version``)."""
    job = event[Event.JOB]
    message = quarantined or message_of(event)
    finalized_at = event[Event.FINALIZED_AT]
    last_heartbeat = as_utc(job.get(Job.LAST_HEARTBEAT))
    details: dict[str, Any] = {  # the event's facts, under its own names
        CACHE_CONTENT_ERROR: message,
        Event.REASON: event[Event.REASON],
        Event.CAUSE: cause_of_event(event),
        Event.IN_WAVE: bool(event.get(Event.IN_WAVE)),
        DETAIL_QUARANTINED: quarantined is not None,
        Job.LAST_HEARTBEAT: last_heartbeat.isoformat() if last_heartbeat else None,
        Event.THRESHOLD_SECONDS: event[Event.THRESHOLD_SECONDS],
        Event.PAST_MAX_DURATION: bool(event.get(Event.PAST_MAX_DURATION)),
        Event.RUN_ID: event[Event.RUN_ID],
        DETAIL_JOB_ID: str(event[ID]),
        DETAIL_PREVIOUS: summary_of(existing),
    }
    if Event.FREE_RUNS in event:
        details[Event.FREE_RUNS] = dict(event[Event.FREE_RUNS])
    entry: dict[str, Any] = {
        **cache_key_of_job(job),
        Cache.HTTP_STATUS: http_status,
        Cache.ERROR_CODE: event[Event.ERROR_CODE],
        Cache.CONTENT: {CACHE_CONTENT_ERROR: message},
        Cache.DETAILS: details,
        Cache.UPDATED_AT: finalized_at,
        # the job's revision where jobs carry one, else what the worker left
        Cache.DATASET_GIT_REVISION: job.get(Job.REVISION) or (existing or {}).get(Cache.DATASET_GIT_REVISION),
    }
    if generation.version_field == Cache.JOB_RUNNER_VERSION:  # the step's version now, as the deployment writes it
        entry[Cache.JOB_RUNNER_VERSION] = current_runner_version(existing, step_version)
    elif existing is not None:  # a semver string (2023-01): the worker's own, from its entry
        entry[Cache.WORKER_VERSION] = runner_version_of(existing)
    duration = round((finalized_at - utc(job[Job.STARTED_AT])).total_seconds(), 3)
    for name, value in ((Cache.DURATION, duration), (Cache.FAILED_RUNS, failed_runs)):
        if generation.declares(name):
            entry[name] = value
        else:
            details[name] = value
    return generation.keep_declared(entry)


@dataclass(frozen=True)
class CacheErrors:
    """A cleanup's error entries, in the cache's own generation, with ``cacheTotalMetric`` where the cache keeps it."""

    store: Store
    generation: CacheGeneration
    http_status: int
    keeps_metrics: bool
    #: The causes whose death costs no failed run (the policy's: ``ZombiePolicy.costless_causes``).
    costless: frozenset[str] = frozenset()
    #: How the deployment in front counts a failed run (its queue generation's rule).
    failed_runs: FailedRunsRule = FailedRunsRule.EVERY_FAILURE

    def write(
        self,
        events: Sequence[ZombieEvent],
        session: ClientSession | None = None,
        quarantined: Mapping[Any, str] | None = None,
    ) -> CacheWrite:
        """Write the error entries of a batch of events; each event's outcome, failed runs and previous entry.

        ``quarantined``: the events whose (dataset, job type) is quarantined, each with the sentence users read.
        In a transaction (``session``) the entries and ``cacheTotalMetric`` change
        together or not at all; a worker writing the same entry meanwhile makes the
        transaction start again, and its entry is then fresher.
        """
        quarantined = quarantined or {}
        jobs = [event[Event.JOB] for event in events]
        existing = entries_of_jobs(self.store.cache, jobs, {Cache.CONTENT: 0}, session)
        written = CacheWrite()
        outcomes = written.outcomes
        operations: list[ReplaceOne[CacheEntry] | InsertOne[CacheEntry]] = []
        planned: dict[CacheKey, CacheEntry] = {}
        expected: dict[Any, tuple[CacheKey, int, int, PreviousEntrySummary | None]] = {}
        replaced: dict[CacheKey, CacheEntry | None] = {}
        versions: dict[str, int | None] = {}  # each kind's step version, read once for the batch where needed
        for event in events:
            job = event[Event.JOB]
            key = key_of(cache_key_of_job(job))
            entry = existing.get(key)
            if entry is not None and written_for(entry, event):  # an earlier attempt wrote it
                previous = entry.get(Cache.DETAILS, {}).get(DETAIL_PREVIOUS)
                outcomes[event[ID]] = _outcome(CacheOutcome.WRITTEN, stored_failed_runs(entry), previous)
                if self.keeps_metrics:  # that attempt may have died before moving cacheTotalMetric
                    written.in_doubt.cache_metrics |= _metric_keys(entry, previous)
            elif entry is not None and is_fresher(entry, job):
                outcomes[event[ID]] = _outcome(
                    CacheOutcome.SKIPPED_FRESHER, stored_failed_runs(entry), summary_of(entry)
                )
            else:
                carried = carried_failed_runs(entry, job)
                costs_a_run = cause_of_event(event) not in self.costless
                failed_runs = failed_runs_after_crash(entry, job, self.failed_runs) if costs_a_run else carried
                notice = quarantined.get(event[ID])
                if notice is not None and self.generation.declares(Cache.FAILED_RUNS):  # the backfill's limit reached
                    failed_runs = max(
                        failed_runs, DEPLOYMENT_MAX_FAILED_RUNS.get(ErrorCode(event[Event.ERROR_CODE]), 0)
                    )
                if key not in planned:  # two zombies of one key (a broken queue) share one entry
                    kind = job[Job.TYPE]
                    if kind not in versions and self.generation.declares(Cache.JOB_RUNNER_VERSION):
                        versions[kind] = step_version(self.store.cache, kind, session)
                    document = error_entry(
                        event, entry, self.generation, self.http_status, failed_runs, notice, versions.get(kind)
                    )
                    document[ID] = entry[ID] if entry is not None else ObjectId()
                    operations.append(_write_operation(entry, document))
                    planned[key] = document
                    replaced[key] = entry
                expected[event[ID]] = (key, failed_runs, carried, summary_of(entry))
        if not operations:
            return written
        if self._write(operations, session) == len(operations):  # every write took (one entry each): all ours
            ours = set(planned)
        else:  # which ones: read the entries back
            entry_ids = [document[ID] for document in planned.values()]
            found = self.store.cache.find({ID: {"$in": entry_ids}}, {Cache.UPDATED_AT: 1}, session=session)
            stored = {entry[ID]: entry for entry in found.batch_size(READ_BATCH)}
            ours = {
                key
                for key, document in planned.items()
                if document[ID] in stored
                and as_utc(stored[document[ID]].get(Cache.UPDATED_AT)) == document[Cache.UPDATED_AT]
            }
        for event_id, (key, failed_runs, carried, previous) in expected.items():
            if key in ours:
                outcomes[event_id] = _outcome(CacheOutcome.WRITTEN, failed_runs, previous)
            else:  # a worker wrote the entry between our read and our write
                outcomes[event_id] = _outcome(CacheOutcome.SKIPPED_FRESHER, carried, previous)
        if self.keeps_metrics:
            self._count_in_cache_metrics([(replaced[key], planned[key]) for key in ours], session)
        return written

    def _write(
        self, operations: list[ReplaceOne[CacheEntry] | InsertOne[CacheEntry]], session: ClientSession | None
    ) -> int:
        """Run the writes; how many took (a replacement that matched, an insert that was accepted).

        An entry a worker inserted first refuses ours, and one a worker rewrote since our read fails our
        compare-and-set: fewer took than were sent, and the read-back then sees theirs.
        """
        try:
            result = self.store.cache.bulk_write(operations, ordered=False, session=session)
        except BulkWriteError as error:
            duplicate_indexes(error)  # anything but a duplicate is raised
            if session is not None:  # the transaction is aborted: start again, the worker's entry is now there
                raise Conflict() from error
            return int(error.details.get("nMatched", 0) + error.details.get("nInserted", 0))
        return result.matched_count + result.inserted_count

    def _count_in_cache_metrics(
        self, changes: list[tuple[CacheEntry | None, CacheEntry]], session: ClientSession | None
    ) -> None:
        """``cacheTotalMetric``: the old entry's (kind, http_status, error_code) -1, the new one's +1, as the deployment
        counts."""
        totals: Counter[tuple[Any, Any, Any]] = Counter()
        for old, new in changes:
            if old is not None:
                totals[(old.get(Cache.KIND), old.get(Cache.HTTP_STATUS), old.get(Cache.ERROR_CODE))] -= 1
            totals[(new[Cache.KIND], new[Cache.HTTP_STATUS], new.get(Cache.ERROR_CODE))] += 1
        operations = [
            UpdateOne(
                {CacheMetric.KIND: kind, CacheMetric.HTTP_STATUS: http_status, CacheMetric.ERROR_CODE: error_code},
                {"$inc": {CacheMetric.TOTAL: change}},
                upsert=True,
            )
            for (kind, http_status, error_code), change in sorted(totals.items(), key=str)
            if change
        ]
        if operations:
            self.store.cache_metrics.bulk_write(operations, ordered=False, session=session)


def _metric_keys(entry: CacheEntry, previous: Mapping[str, Any] | None) -> set[tuple[Any, Any, Any]]:
    """The ``cacheTotalMetric`` keys writing ``entry`` moved: its own, and the one of the entry it replaced."""
    keys = {(entry[Cache.KIND], entry.get(Cache.HTTP_STATUS), entry.get(Cache.ERROR_CODE))}
    if previous is not None:
        keys.add((entry[Cache.KIND], previous.get(Cache.HTTP_STATUS), previous.get(Cache.ERROR_CODE)))
    return keys


def _outcome(outcome: CacheOutcome, failed_runs: int, previous: PreviousEntrySummary | None) -> CacheResult:
    return {Event.CACHE_OUTCOME: outcome, Event.FAILED_RUNS: failed_runs, Event.PREVIOUS_ENTRY: previous}


def _write_operation(
    existing: CacheEntry | None, document: CacheEntry
) -> ReplaceOne[CacheEntry] | InsertOne[CacheEntry]:
    if existing is not None:  # compare-and-set on the entry we read
        return ReplaceOne({ID: existing[ID], Cache.UPDATED_AT: existing.get(Cache.UPDATED_AT)}, document)
    # No entry was there: insert, with the _id chosen here; if one appeared meanwhile, the
    # unique key refuses ours and the read-back by _id reports the entry as fresher.
    return InsertOne(document)
