"""Our own collections, which the deployment never reads: the events of each finalization, the retries waiting
for their delay, the quarantines, the watcher's lease, the failed runs, the suggestions and the heartbeat gaps.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Any, Final, TypedDict

from bson import ObjectId

from zombie_pipeline.queue.jobs import JobDocument, JobSnapshot

#: The collections whose names a deployment's configuration may change.
DEFAULT_EVENTS_COLLECTION = "zombieEvents"
DEFAULT_FAILURES_COLLECTION = "zombiePipelineFailures"
DEFAULT_SUGGESTIONS_COLLECTION = "zombieT2Suggestions"

#: The heartbeat gaps a watcher saw, per day, job type and worker size (``statistics.gap_log``).
HEARTBEAT_GAPS_COLLECTION = "zombieHeartbeatGaps"

#: Retries waiting for their delay to pass (a field on the deployment's jobs could not hold it).
RETRIES_COLLECTION = "zombieRetries"

#: The (dataset, job type) pairs whose jobs keep crashing their workers: not re-enqueued while quarantined.
QUARANTINE_COLLECTION = "zombieQuarantine"

#: The lease of the watch run that acts at the queue's deadlines (``cleanup.watch``): one document, renewed by it.
WATCHERS_COLLECTION = "zombieWatchers"


class PreviousEntry:
    """Field names of what an event keeps of the cache entry our error replaced (its small fields, never its content)."""

    UPDATED_AT: Final = "updated_at"  # ISO 8601, as JSON carries it
    HTTP_STATUS: Final = "http_status"
    ERROR_CODE: Final = "error_code"
    FAILED_RUNS: Final = "failed_runs"
    DATASET_GIT_REVISION: Final = "dataset_git_revision"
    RUNNER_VERSION: Final = "runner_version"  # job_runner_version, or worker_version in early 2023


class PreviousEntrySummary(TypedDict):
    """What an event keeps of the cache entry our error replaced (:class:`PreviousEntry` names the fields)."""

    updated_at: str | None
    http_status: int | None
    error_code: str | None
    failed_runs: int
    dataset_git_revision: str | None
    runner_version: int | str | None


class Event:
    """Field names of our audit collection: one document per zombie finalization.

    The ``_id`` of an event is the job's ``_id``: inserting it is the claim that
    makes a job ours to finalize, so two cleanups never finalize the same job.
    """

    JOB: Final = "job"  # snapshot of the job as detection saw it
    REASON: Final = "reason"
    ERROR_CODE: Final = "error_code"
    THRESHOLD_SECONDS: Final = "threshold_seconds"
    PAST_MAX_DURATION: Final = "past_max_duration"  # a dead job that had also run longer than its T2 (still a crash)
    POLICY: Final = "policy"
    DETECTED_AT: Final = "detected_at"
    FINALIZED_AT: Final = "finalized_at"  # also the job's new finished_at
    # Seconds from the job's last sign of life (start, heartbeat, SIGTERM) to its finalization; for a job still
    # running past its T2, from that deadline.
    DETECTION_SECONDS: Final = "detection_seconds"
    # Seconds from the moment the job's rules first allowed finalizing it (its deadline) to its finalization: what the
    # cleanup that finalized it added to the rule.
    RELEASE_LAG_SECONDS: Final = "release_lag_seconds"
    RUN_ID: Final = "run_id"  # the run that claimed the job
    STATE: Final = "state"
    LEASE_OWNER: Final = "lease_owner"  # the run driving the event now (a reconcile may take over)
    LEASE_UNTIL: Final = "lease_until"
    CACHE_OUTCOME: Final = "cache_outcome"
    FAILED_RUNS: Final = "failed_runs"
    RETRY_JOB_ID: Final = "retry_job_id"
    RETRY_OUTCOME: Final = "retry_outcome"
    COMPLETED_AT: Final = "completed_at"
    QUEUE_GENERATION: Final = "queue_generation"  # the generation the finalization follows, to its end
    PREVIOUS_ENTRY: Final = "previous_entry"  # what the cache knew before our error entry (small fields only)
    EFFECTS: Final = "effects"  # what was done around the finish, as the deployment does it (counters, locks, ...)
    RETRY_DUE_AT: Final = "retry_due_at"  # a retry scheduled after a delay: when it becomes due
    COMPENSATION_STATE: Final = "compensation_state"  # pending, done or failed: the zombie's side effects undone?
    COMPENSATIONS: Final = "compensations"  # one CompensationEntry per action
    COMPENSATION_LEASE_UNTIL: Final = "compensation_lease_until"  # a run is running its actions until then
    COMPENSATION_LEASE_OWNER: Final = "compensation_lease_owner"
    CAUSE: Final = "cause"  # why the worker stopped (deploy, crash, never_started, timeout): decides the retry
    IN_WAVE: Final = "in_wave"  # the death fell in a wave of workers stopped at once (``cleanup.causes``)
    FREE_RUNS: Final = "free_runs"  # a death SIGTERMed alone: its pair's free re-runs (FreeRunsRecord)
    LATE_RESULT: Final = "late_result"  # the job showed life after its finalization (LateResultRecord): a mistake


class FreeRuns:
    """Field names of an event's ``free_runs``: the budget of free re-runs of a job SIGTERMed alone (``cleanup.budget``)."""

    ALONE: Final = "alone"  # lone SIGTERMs of its (dataset, job type) within the window, this one included
    FREE: Final = "free"  # of them, those re-run free, this one included when it is
    LIMIT: Final = "limit"  # the policy's free re-runs within the window
    WINDOW_HOURS: Final = "window_hours"
    CHARGED: Final = "charged"  # past the limit: this one is counted as a crash


class FreeRunsRecord(TypedDict):
    """An event's ``free_runs`` (:class:`FreeRuns` names the fields)."""

    alone: int
    free: int
    limit: int
    window_hours: int
    charged: bool


class LateResult:
    """Field names of an event's ``late_result``: what showed the finalized job alive afterwards, and when."""

    EVIDENCE: Final = "evidence"  # a LateEvidence
    SEEN_AT: Final = "seen_at"  # the heartbeat, or the result's updated_at
    SECONDS_AFTER: Final = "seconds_after"  # since the finalization


class LateEvidence(StrEnum):
    HEARTBEAT = "heartbeat"  # a kept job's heartbeat later than its finalization
    RESULT = "result"  # the same run's result over our error entry


class LateResultRecord(TypedDict):
    """An event's ``late_result`` (:class:`LateResult` names the fields)."""

    evidence: str
    seen_at: dt.datetime
    seconds_after: float


class EventState(StrEnum):
    """Where a finalization stands; every step after ``claimed`` is idempotent."""

    CLAIMED = "claimed"  # ours to finalize; the job may still be started
    DONE = "done"


class CacheOutcome(StrEnum):
    WRITTEN = "written"
    SKIPPED_FRESHER = "skipped_fresher"


class Effect(StrEnum):
    """What the deployment does around a finish, as recorded on the event once done."""

    JOB_METRICS = "job_metrics"  # jobTotalMetric: started -1 (and error +1 where finished jobs are kept)
    PAST_JOB = "past_job"  # a pastJobs record (runs of at least 30 s)
    BLOCKED_DATASET = "blocked_dataset"  # a datasetBlockages entry, worker-size counters lowered
    LOCKS_RELEASED = "locks_released"


class RetryOutcome(StrEnum):
    ENQUEUED = "enqueued"
    SCHEDULED = "scheduled"  # enqueued by a later run, once its delay has passed
    ALREADY_QUEUED = "already_queued"
    LIMIT_REACHED = "limit_reached"
    NOT_RETRIED = "not_retried"
    QUARANTINED = "quarantined"  # its (dataset, job type) keeps crashing its workers: not re-enqueued


class ScheduledRetry:
    """Field names of ``zombieRetries``: one document per delayed retry, ``_id`` = the retry job's ``_id``."""

    JOB: Final = "job"  # the waiting job to insert, exactly as it will be inserted
    EVENT_ID: Final = "event_id"
    QUEUE_GENERATION: Final = "queue_generation"
    DUE_AT: Final = "due_at"
    STATE: Final = "state"
    DECIDED_AT: Final = "decided_at"


class ScheduledState(StrEnum):
    PENDING = "pending"
    ENQUEUED = "enqueued"
    ALREADY_QUEUED = "already_queued"  # a twin waited or ran when it became due


class CompensationState(StrEnum):
    PENDING = "pending"  # still to run, or failed and tried again by later runs up to the policy's attempts
    DONE = "done"
    FAILED = "failed"  # given up on: for an operator


class CompensationEntry:
    """Field names of one action's record in an event's ``compensations``."""

    NAME: Final = "name"
    STATE: Final = "state"
    ATTEMPTS: Final = "attempts"
    LAST_ERROR: Final = "last_error"
    DONE_AT: Final = "done_at"


class CacheResult(TypedDict):
    """What an event records of its cache entry: written or kept as fresher, the failed runs, the entry replaced."""

    cache_outcome: str
    failed_runs: int
    previous_entry: PreviousEntrySummary | None


class CompensationRecord(TypedDict, total=False):
    """One action's record in an event's ``compensations`` (:class:`CompensationEntry` names the fields)."""

    name: str
    state: str
    attempts: int
    last_error: str
    done_at: dt.datetime


class ZombieEvent(TypedDict, total=False):
    """One document of ``zombieEvents``, a finalization from its claim to its end (:class:`Event` names the fields)."""

    _id: ObjectId
    job: JobSnapshot
    reason: str
    error_code: str
    threshold_seconds: int
    past_max_duration: bool
    policy: dict[str, Any]
    detected_at: dt.datetime
    finalized_at: dt.datetime
    detection_seconds: float
    release_lag_seconds: float
    run_id: str
    state: str
    lease_owner: str
    lease_until: dt.datetime
    cache_outcome: str
    failed_runs: int
    retry_job_id: ObjectId
    retry_outcome: str
    completed_at: dt.datetime
    queue_generation: str
    previous_entry: PreviousEntrySummary | None
    effects: list[str]
    retry_due_at: dt.datetime
    compensation_state: str
    compensations: list[CompensationRecord]
    compensation_lease_until: dt.datetime
    compensation_lease_owner: str
    cause: str
    in_wave: bool
    free_runs: FreeRunsRecord
    late_result: LateResultRecord


class RetryDocument(TypedDict, total=False):
    """One document of ``zombieRetries``, a retry waiting for its delay (:class:`ScheduledRetry` names the fields)."""

    _id: ObjectId
    job: JobDocument
    event_id: ObjectId
    queue_generation: str
    due_at: dt.datetime
    state: str
    decided_at: dt.datetime


class WatchLease:
    """Field names of the watcher's lease (``zombieWatchers``, ``_id`` :data:`WATCH_LEASE_ID`): which watch run acts at
    the deadlines, and until when. Renewed by the watch loop itself between its passes, so a watcher that dies or
    hangs lets it lapse: what the fallback cleanups and the relaunch sensor read."""

    HOLDER: Final = "holder"  # the run id of the watch run acting
    LEASE_UNTIL: Final = "lease_until"
    RENEWED_AT: Final = "renewed_at"
    SINCE: Final = "since"  # when the holder took the lease
    ENDS_AT: Final = "ends_at"  # when the holder hands over: its run's planned end
    STATE: Final = "state"  # a WatchState
    WATCHED: Final = "watched"  # started jobs watched at the last refresh
    NEXT_DEADLINE: Final = "next_deadline"
    FINALIZED: Final = "finalized"  # finalizations of the holder so far


WATCH_LEASE_ID: Final = "watcher"


class WatchState(StrEnum):
    WATCHING = "watching"
    HOLDING = "holding"  # deadlines falling due together (a wave, a fleet going quiet): held to be judged as one
    BRAKED = "braked"  # the brake refused what fell due
    ENDED = "ended"  # handed over, or stopped


class WatchLeaseDocument(TypedDict, total=False):
    """The watcher's lease (:class:`WatchLease` names the fields)."""

    _id: str
    holder: str
    lease_until: dt.datetime
    renewed_at: dt.datetime
    since: dt.datetime
    ends_at: dt.datetime
    state: str
    watched: int
    next_deadline: dt.datetime | None
    finalized: int


class Quarantine:
    """Field names of ``zombieQuarantine``: one document per (dataset, job type) that was quarantined, the latest time.

    Quarantined from the finalization that reached the threshold (``since``, ties broken by its event's ``_id``)
    until it lapses or an operator lifts it; the crashes of a later quarantine are counted from its end on.
    """

    DATASET: Final = "dataset"
    JOB_TYPE: Final = "job_type"
    SINCE: Final = "since"  # the finalized_at of the crash that reached the threshold
    EVENT_ID: Final = "event_id"  # that crash's event
    CRASHES: Final = "crashes"  # crashes counted in the window, that one included
    EVENT_IDS: Final = "event_ids"  # their events
    WINDOW_HOURS: Final = "window_hours"
    LAPSES_AT: Final = "lapses_at"
    LIFTED_AT: Final = "lifted_at"  # an operator lifted it (None: not lifted)
    LIFTED_BY: Final = "lifted_by"  # the run that lifted it


class QuarantineDocument(TypedDict, total=False):
    """One document of ``zombieQuarantine`` (:class:`Quarantine` names the fields)."""

    _id: ObjectId
    dataset: str
    job_type: str
    since: dt.datetime
    event_id: ObjectId
    crashes: int
    event_ids: list[ObjectId]
    window_hours: int
    lapses_at: dt.datetime
    lifted_at: dt.datetime | None
    lifted_by: str | None


class Failure:
    """Field names of ``zombiePipelineFailures``: one document per failed pipeline run, ``_id`` = run id."""

    JOB_NAME: Final = "job_name"
    PARTITION_KEY: Final = "partition_key"
    FAILED_AT: Final = "failed_at"
    MESSAGE: Final = "message"
    FAILED_STEPS: Final = "failed_steps"
    WILL_RETRY: Final = "will_retry"  # a run that never started is told at once, though Dagster retries it
    WEBHOOK_OUTCOME: Final = "webhook_outcome"


class T2Suggestion:
    """Field names of ``zombieT2Suggestions``: one document per statistics window.

    Job types are values in the ``by_type`` array, never keys: a type name may
    hold characters MongoDB refuses in keys.
    """

    WINDOW_START: Final = "window_start"
    WINDOW_END: Final = "window_end"  # the _id: recomputing a window replaces its document, unless it covers fewer days
    DAYS_PRESENT: Final = "days_present"  # days of the window whose tallies were computed
    DAYS_EXPECTED: Final = "days_expected"
    COMPUTED_AT: Final = "computed_at"
    SETTINGS: Final = "settings"
    BY_TYPE: Final = "by_type"
    TYPE: Final = "type"
    SUGGESTED_T2_SECONDS: Final = "suggested_t2_seconds"
    CURRENT_T2_SECONDS: Final = "current_t2_seconds"
    ENOUGH_DATA: Final = "enough_data"
    CENSORED: Final = "censored"
    SAMPLES: Final = "samples"


class HeartbeatGaps:
    """Field names of ``zombieHeartbeatGaps``: the gaps between live jobs' heartbeats, one document per (UTC day, job
    type, worker size), and one per (job type, worker size) with no day holding its totals since the first watch.

    The ``_id`` is the key itself (``{day, type, worker}``): job types are values, never field names. Histograms map
    a bucket's upper edge, in whole milliseconds written as text, to a count (``statistics.gap_histogram``).
    """

    DAY: Final = "day"  # ISO day the gap ended (a finished job: the day it was last seen); None on the totals
    TYPE: Final = "type"
    WORKER: Final = "worker"  # the worker size the job's difficulty sends it to, or WORKER_UNTOLD
    GAPS: Final = "gaps"  # completed gaps between a live job's signs of life (its start, then its heartbeats)
    GAP_COUNT: Final = "gap_count"
    GAP_SECONDS: Final = "gap_seconds"  # their sum
    LONGEST_GAP: Final = "longest_gap_seconds"
    FINISHED: Final = "finished"  # jobs watched from their start that finished, by their longest silence
    FINISHED_COUNT: Final = "finished_count"
    FINISHED_SECONDS: Final = "finished_seconds"  # the sum of their longest silences
    LONGEST_FINISHED: Final = "longest_finished_seconds"
    PARTLY_WATCHED: Final = "finished_partly_watched"  # finished jobs first seen after their first heartbeat
    FINALIZED: Final = "finalized"  # jobs a cleanup of ours finalized while watched: their last gap never closed
    ENDED_UNSEEN: Final = "ended_unseen"  # gone without our finalization, so silent the deployment's killer may have
    UNOBSERVED: Final = "unobserved"  # gaps that ended while the watcher looked away too long to tell them
    FLUSHES: Final = "flushes"  # the last flushes applied: a flush sent again finds itself here
    UPDATED_AT: Final = "updated_at"


#: The worker size of a job whose queue does not say (no ``difficulty`` before 2023-07): any worker may run it.
WORKER_UNTOLD = "any"
