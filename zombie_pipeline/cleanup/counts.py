"""What a cleanup's steps count, named once: the steps add to them, run metadata and the run's summary read them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


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


def reason_count(reason: str) -> str:
    return f"reason:{reason}"


def type_count(job_type: str) -> str:
    return f"type:{job_type}"


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

    counts: Counter = field(default_factory=Counter)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: StepResult) -> StepResult:
        self.counts.update(other.counts)
        self.rows.extend(other.rows)
        return self
