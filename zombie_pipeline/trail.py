"""The audit trail, read: what the cleanup, the statistics, the monitoring and the status ask of our own collections.

The events (``zombieEvents``) a cleanup writes as its write-ahead log, the delayed retries (``zombieRetries``) and
the quarantines (``zombieQuarantines``) are read by the cleanup (its summary, the late results, the quarantine),
the statistics (their windows, causes and late results), the sensors and checks (the queue's state), the metrics
(the totals a cleanup pushes) and ``zombie-pipeline status``. Each question is written here once, on the index that
answers it; the writes stay with the step that makes them (``cleanup/events.py``, ``retries.py``, ``quarantine.py``, ``late_results.py``).

An event this code did not write (no string job type, a reason we never gave) is skipped where it is counted, never
counted as something it is not.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pymongo.collection import Collection
from pymongo.cursor import Cursor

from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.queue.audit_documents import (
    CacheOutcome,
    CompensationState,
    Event,
    EventState,
    LateResult,
    Quarantine,
    QuarantineDocument,
    RetryOutcome,
    ScheduledRetry,
    ScheduledState,
    ZombieEvent,
)
from zombie_pipeline.queue.cache import ErrorCode
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import ID, Job, job_type_problem
from zombie_pipeline.queue.reasons import REASONS, Cause, Reason
from zombie_pipeline.queue.store import Store, aggregate_rows
from zombie_pipeline.queue.times import as_utc, utc

# --- the events -------------------------------------------------------------------------------------------------


def finalized_between(start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Zombies finalized in ``[start, end)``, on the ``finalized_at`` index; a claim that lost its race never gets there."""
    return {Event.FINALIZED_AT: {"$gte": start, "$lt": end}, Event.STATE: EventState.DONE}


def finalized_events(
    events: Collection[ZombieEvent],
    start: dt.datetime,
    end: dt.datetime,
    fields: Mapping[str, Any],
    batch_size: int = 0,
) -> Cursor[ZombieEvent]:
    """The zombies finalized in ``[start, end)``, with only ``fields`` (``batch_size`` 0: the server's batches)."""
    return events.find(finalized_between(start, end), fields, batch_size=batch_size)


def unfinished_finalizations(store: Store) -> int:
    """Events a cleanup has not completed: a run in progress, or one that crashed (the next run takes them over)."""
    return store.events.count_documents({Event.STATE: {"$ne": EventState.DONE}})


def finalizations_since(store: Store, since: dt.datetime) -> int:
    """Events whose finalization began at ``since`` or later, completed or not."""
    return store.events.count_documents({Event.FINALIZED_AT: {"$gte": since}})


def compensations_in(store: Store, state: CompensationState) -> int:
    """Finalized zombies whose compensations are in ``state`` (pending: still to run or to try again)."""
    return store.events.count_documents({Event.COMPENSATION_STATE: state})


def finalized_by_run(store: Store, run_id: str) -> list[ZombieEvent]:
    """Every finalization a run drove to done (taken over from a crashed run too), in the order they were made."""
    query = {Event.LEASE_OWNER: run_id, Event.STATE: EventState.DONE}
    return list(store.events.find(query).sort(Event.FINALIZED_AT, 1))


def causes_between(store: Store, start: dt.datetime, end: dt.datetime) -> dict[str, dict[Cause, int]]:
    """The zombies finalized in ``[start, end)`` per job type and cause, counted on the server (by reason too, for
    the events recorded before causes were, which take their reason's cause)."""
    pipeline = [
        {"$match": finalized_between(start, end)},
        {
            "$group": {
                ID: {"type": f"${Event.JOB}.{Job.TYPE}", "cause": f"${Event.CAUSE}", "reason": f"${Event.REASON}"},
                "count": {"$sum": 1},
            }
        },
    ]
    counts: dict[str, Counter[Cause]] = {}
    for row in aggregate_rows(store.events, pipeline):
        key = row[ID]
        if not isinstance(key.get("type"), str) or key.get("reason") not in frozenset(Reason):
            continue  # not an event this code wrote: nothing to count it as
        cause = cause_of_event({Event.CAUSE: key.get("cause"), Event.REASON: key["reason"]})
        counts.setdefault(key["type"], Counter())[cause] += row["count"]
    return {job_type: dict(by_cause) for job_type, by_cause in sorted(counts.items())}


def late_results_between(store: Store, start: dt.datetime, end: dt.datetime) -> dict[str, int]:
    """Late results per job type among the zombies finalized in ``[start, end)``, counted on the server."""
    pipeline = [
        {"$match": {**finalized_between(start, end), Event.LATE_RESULT: {"$ne": None}}},
        {"$group": {ID: f"${Event.JOB}.{Job.TYPE}", "count": {"$sum": 1}}},
    ]
    return {row[ID]: row["count"] for row in aggregate_rows(store.events, pipeline) if isinstance(row[ID], str)}


# --- the totals a cleanup pushes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """Observations counted at or below each of ``bounds`` (cumulative, as Prometheus exposes them), all of them, and
    their sum."""

    bounds: tuple[float, ...]
    at_or_below: tuple[int, ...]
    count: int
    total: float

    def buckets(self) -> list[tuple[str, float]]:
        bounds = [(f"{bound:g}", float(count)) for bound, count in zip(self.bounds, self.at_or_below)]
        return [*bounds, ("+Inf", float(self.count))]


@dataclass
class AuditTotals:
    """The audit trail's finalizations, counted by what the counters label them with."""

    finalized: Counter[Any] = field(default_factory=Counter)  # (job type, reason, error code, cause) -> events
    fresher_kept: Counter[Any] = field(default_factory=Counter)  # job type -> events
    retries: Counter[Any] = field(default_factory=Counter)  # (job type, cause, retry outcome) -> events
    late_results: Counter[Any] = field(default_factory=Counter)  # job type -> events whose job showed life afterwards
    skipped: int = 0  # events whose type, reason or code cannot be a label value (written by hand or an old version)
    detection: dict[str, Histogram] = field(default_factory=dict)  # reason -> detection times (recorded since 2026-12)
    release_lag: dict[str, Histogram] = field(default_factory=dict)  # reason -> release lags (recorded since 2026-12)


_REASONS = {str(reason) for reason in REASONS}
_ERROR_CODES = {str(code) for code in ErrorCode}
_RETRY_OUTCOMES = {str(outcome) for outcome in RetryOutcome}
_TYPE, _REASON, _CODE, _CACHE, _RETRY, _LATE = "type", "reason", "code", "cache", "retry", "late"
_CAUSE, _COUNT, _SUM = "cause", "count", "sum"


def audit_totals(
    events: Collection[ZombieEvent], detection_bounds: tuple[float, ...], release_lag_bounds: tuple[float, ...]
) -> AuditTotals:
    """One aggregation over the finalized events (on the ``(state, lease_until)`` index), grouped on the server.

    Finalized means completed (state ``done``), as the statistics read it: a claim that lost its race never gets
    there. The detection times and release lags are counted into the given bounds (the metrics' buckets).
    """
    pipeline = on_index(
        {Event.STATE: EventState.DONE},
        {},
        {
            "$group": {
                ID: {
                    _TYPE: f"${Event.JOB}.{Job.TYPE}",
                    _REASON: f"${Event.REASON}",
                    _CODE: f"${Event.ERROR_CODE}",
                    _CACHE: f"${Event.CACHE_OUTCOME}",
                    _RETRY: f"${Event.RETRY_OUTCOME}",
                    _CAUSE: f"${Event.CAUSE}",
                    _LATE: f"${Event.LATE_RESULT}.{LateResult.EVIDENCE}",
                },
                _COUNT: {"$sum": 1},
            }
        },
    )
    totals = AuditTotals()
    for group in aggregate_rows(events, pipeline):
        key, count = group[ID], group[_COUNT]
        job_type, reason, code = key.get(_TYPE), key.get(_REASON), key.get(_CODE)
        if job_type_problem(job_type) or reason not in _REASONS or code not in _ERROR_CODES:
            totals.skipped += count
            continue
        cause = str(cause_of_event({Event.CAUSE: key.get(_CAUSE), Event.REASON: reason}))
        totals.finalized[(job_type, reason, code, cause)] += count
        if key.get(_CACHE) == CacheOutcome.SKIPPED_FRESHER:
            totals.fresher_kept[job_type] += count
        if key.get(_RETRY) in _RETRY_OUTCOMES:
            totals.retries[(job_type, cause, key[_RETRY])] += count
        if key.get(_LATE) is not None:
            totals.late_results[job_type] += count
    totals.detection = seconds_histograms(events, Event.DETECTION_SECONDS, detection_bounds)
    totals.release_lag = seconds_histograms(events, Event.RELEASE_LAG_SECONDS, release_lag_bounds)
    return totals


def seconds_histograms(events: Collection[ZombieEvent], figure: str, bounds: tuple[float, ...]) -> dict[str, Histogram]:
    """Per reason, one of the finalized events' figures in seconds (``figure``: detection time, release lag) counted
    into ``bounds``, on the server."""
    seconds = f"${figure}"
    at_or_below = {
        f"le{index}": {"$sum": {"$cond": [{"$lte": [seconds, bound]}, 1, 0]}} for index, bound in enumerate(bounds)
    }
    pipeline = on_index(
        {Event.STATE: EventState.DONE},
        {figure: {"$type": "number"}},
        {"$group": {ID: f"${Event.REASON}", _COUNT: {"$sum": 1}, _SUM: {"$sum": seconds}, **at_or_below}},
    )
    return {
        group[ID]: Histogram(bounds, tuple(group[name] for name in at_or_below), group[_COUNT], float(group[_SUM]))
        for group in aggregate_rows(events, pipeline)
        if group[ID] in _REASONS
    }


# --- the delayed retries ------------------------------------------------------------------------------------------


def pending_retries(store: Store) -> int:
    """Delayed retries not enqueued yet, due or not."""
    return store.retries.count_documents({ScheduledRetry.STATE: ScheduledState.PENDING})


# --- the quarantines ----------------------------------------------------------------------------------------------


def is_active(quarantine: Mapping[str, Any], at: dt.datetime) -> bool:
    """Whether ``quarantine`` holds at ``at``: begun, not lapsed, not lifted."""
    lifted_at = as_utc(quarantine.get(Quarantine.LIFTED_AT))
    return utc(quarantine[Quarantine.SINCE]) <= at < utc(quarantine[Quarantine.LAPSES_AT]) and (
        lifted_at is None or at < lifted_at
    )


def active_quarantines(store: Store, at: dt.datetime) -> list[QuarantineDocument]:
    """The quarantines holding at ``at``, the most recent first (a small collection: one document per pair ever)."""
    found = store.quarantine.find({Quarantine.LAPSES_AT: {"$gt": at}, Quarantine.SINCE: {"$lte": at}})
    return sorted(
        (document for document in found if is_active(document, at)),
        key=lambda document: (utc(document[Quarantine.SINCE]), document[Quarantine.DATASET]),
        reverse=True,
    )
