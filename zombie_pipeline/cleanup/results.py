"""What a cleanup's steps count, named once: the steps add to them, run metadata and the run's summary read them."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.queue.audit_documents import CacheResult, Event, FreeRuns, ZombieEvent
from zombie_pipeline.queue.jobs import ID, Job, job_row
from zombie_pipeline.queue.times import utc


class Count(StrEnum):
    """The counts of a cleanup's steps (Dagster metadata shows them with ``/`` for ``:``)."""

    CLAIMED = "claimed"
    CLAIMED_BY_ANOTHER_CLEANUP = "claimed_by_another_cleanup"
    FINALIZED = "finalized"
    LOST_TO_LIVE_WORKER = "lost_to_live_worker"  # the worker beat, finished or got SIGTERM after detection
    TAKEN_OVER = "taken_over"  # finalizations a crashed run left, completed by this one
    COUNTERS_REPAIRED = "counters_repaired"  # the deployment's counters a dead pass left in doubt, set from a recount
    DUE_RETRY_ENQUEUED = "due_retry_enqueued"
    DUE_RETRY_ALREADY_QUEUED = "due_retry_already_queued"
    RETRIES_PENDING = "retries_pending"  # delayed retries still waiting for their time
    COMPENSATION_DONE = "compensation_done"
    COMPENSATION_TO_RETRY = "compensation_to_retry"
    COMPENSATION_FAILED = "compensation_failed"
    LATE_RESULTS = "late_results"  # finalized jobs seen alive afterwards, first noticed by this run
    TERMINATED_ALONE_FREE = "terminated_alone_free"  # SIGTERMed alone, within its pair's free re-runs
    TERMINATED_ALONE_CHARGED = "terminated_alone_charged"  # SIGTERMed alone past them: charged as a crash


def reason_count(reason: str) -> str:
    return f"reason:{reason}"


def type_count(job_type: str) -> str:
    return f"type:{job_type}"


def cause_count(cause: str) -> str:
    return f"cause:{cause}"


def cause_retry_count(cause: str, outcome: str) -> str:
    """``cause_retry:deploy:enqueued`` ...: what became of the retries of one cause."""
    return f"cause_retry:{cause}:{outcome}"


def effect_count(effect: str) -> str:
    return f"effect:{effect}"


def cache_count(outcome: str) -> str:
    """``cache_written`` or ``cache_skipped_fresher``."""
    return f"cache_{outcome}"


def retry_count(outcome: str) -> str:
    """``retry_enqueued``, ``retry_scheduled``, ``retry_limit_reached`` ..."""
    return f"retry_{outcome}"


def cache_generation_count(name: str) -> str:
    return f"cache_generation:{name}"


@dataclass
class StepResult:
    """What one step did, for run metadata: counts by name, and rows of a table."""

    counts: Counter[Any] = field(default_factory=Counter)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: StepResult) -> StepResult:
        self.counts.update(other.counts)
        self.rows.extend(other.rows)
        return self


def batch_result(
    finished: Sequence[ZombieEvent],
    lost: int,
    effects: Mapping[Any, Sequence[str]],
    cached: Mapping[Any, CacheResult],
    retried: Mapping[Any, tuple[str, dt.datetime | None]],
    repaired: int,
) -> StepResult:
    """What a batch's pass did: counts by reason, cause, type, cache and retry outcome (by cause too) and effect,
    and a row per zombie."""
    result = StepResult()
    result.counts[Count.FINALIZED] += len(finished)
    result.counts[Count.LOST_TO_LIVE_WORKER] += lost
    for event in finished:
        cause = cause_of_event(event)
        result.counts[reason_count(event[Event.REASON])] += 1
        result.counts[cause_count(cause)] += 1
        result.counts[type_count(event[Event.JOB][Job.TYPE])] += 1
        result.counts[cache_count(cached[event[ID]][Event.CACHE_OUTCOME])] += 1
        result.counts[retry_count(retried[event[ID]][0])] += 1
        result.counts[cause_retry_count(cause, retried[event[ID]][0])] += 1
        result.counts.update(effect_count(effect) for effect in effects[event[ID]])
        budget = event.get(Event.FREE_RUNS)
        if budget is not None:
            charged = budget[FreeRuns.CHARGED]
            result.counts[Count.TERMINATED_ALONE_CHARGED if charged else Count.TERMINATED_ALONE_FREE] += 1
        result.rows.append(finalized_row(event))
    if repaired:
        result.counts[Count.COUNTERS_REPAIRED] += repaired
    return result


def finalized_row(event: ZombieEvent) -> dict[str, Any]:
    """A finalized zombie as one row of the run's table."""
    job = event[Event.JOB]
    return job_row(
        event[ID],
        job,
        reason=event[Event.REASON],
        cause=cause_of_event(event),
        threshold_seconds=event[Event.THRESHOLD_SECONDS],
        ran_seconds=round((event[Event.FINALIZED_AT] - utc(job[Job.STARTED_AT])).total_seconds(), 1),
        detection_seconds=event.get(Event.DETECTION_SECONDS),
        release_lag_seconds=event.get(Event.RELEASE_LAG_SECONDS),
    )
