"""The audit trail, read: what the cleanup, the statistics, the monitoring and the status ask of our own collections.

The events (``zombieEvents``) a cleanup writes as its write-ahead log, the delayed retries (``zombieRetries``) and
the quarantines (``zombieQuarantines``) are read by several rooms: the cleanup (its summary, the late results, the
quarantine), the statistics (their windows, causes and late results), the sensors and checks (the queue's state)
and ``zombie-pipeline status``. Each question is written here once, on the index that answers it; the writes stay
with the step that makes them (``cleanup/events.py``, ``retries.py``, ``quarantine.py``, ``late_results.py``).

An event this code did not write (no string job type, a reason we never gave) is skipped where it is counted, never
counted as something it is not.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping
from typing import Any

from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.queue.documents import (
    ID,
    Cause,
    Event,
    EventState,
    Job,
    Quarantine,
    QuarantineDocument,
    Reason,
    ScheduledRetry,
    ScheduledState,
    ZombieEvent,
    as_utc,
    utc,
)
from zombie_pipeline.queue.store import Store, aggregate_rows

# --- the events -------------------------------------------------------------------------------------------------


def finalized_between(start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Zombies finalized in ``[start, end)``, on the ``finalized_at`` index; a claim that lost its race never gets there."""
    return {Event.FINALIZED_AT: {"$gte": start, "$lt": end}, Event.STATE: EventState.DONE}


def unfinished_finalizations(store: Store) -> int:
    """Events a cleanup has not completed: a run in progress, or one that crashed (the next run takes them over)."""
    return store.events.count_documents({Event.STATE: {"$ne": EventState.DONE}})


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
