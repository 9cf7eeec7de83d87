"""Per-type tallies of exact durations: what a period of runs comes to, whatever it was read from.

A period (one UTC day for a Dagster partition, or any window) becomes a
:class:`Period`: a :class:`Tally` per job type, with the documents left out
counted by reason (:class:`BadData`). The finished jobs are read by
``jobs_source``, the cache entries by ``cache_source``, the audited zombies of
``zombieEvents`` by :func:`tally_events` here; ``sources`` picks the source the
queue's generation leaves.

A tally keeps the durations themselves, as float32 arrays, rather than a
histogram or a sketch: combining days is then a concatenation and a window's
percentiles are *exact* (float32 has a 24-bit mantissa: below 8192 s the
rounding is under a millisecond, the precision of BSON dates). A week of a
million successful jobs a day is 28 MB; past that, the tally is the one place
to swap in a log-binned histogram.

A job *stopped at T2* never finished: its duration is only a lower bound
(censored). Stopped jobs are the audited ``exceeded_max_duration`` zombies,
whose duration comes from their event (it outlives the job's TTL), plus error
jobs outside our audit trail that ran at least the current T2 (stopped by an
earlier killer). A zombie audited as a crash (its worker died) was not stopped
at any limit, and how long it sat dead says nothing of how long it would have
run: it counts as a started job ended in error, without a duration.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

from zombie_pipeline.queue.audit_documents import Event, ZombieEvent
from zombie_pipeline.queue.jobs import ID, Job, job_type_problem
from zombie_pipeline.queue.reasons import REASONS, Reason
from zombie_pipeline.queue.times import as_utc

READ_BATCH_SIZE = 5_000


#: Where a period's durations come from, as the report explains it.
SOURCES = {
    "jobs": "finished jobs, which the queue keeps (before 2023-12): every run of the period",
    "cache": "cache entries (the queue deletes finished jobs): one duration per artifact, its latest run, "
    "so an artifact recomputed several times counts once",
}


_DURATIONS = np.float32


EMPTY_DURATIONS = np.empty(0, dtype=_DURATIONS)


class BadData:
    """Why a document was left out of the statistics; each is counted in the report."""

    # Counted over the whole collection (see count_undated_jobs): no daily read holds these jobs.
    UNKNOWN_STATUS = (
        "unknown_status"  # missing, null, not a string, or a status the queue's generation does not declare
    )
    INVALID_TYPE = "invalid_type"  # missing, not a string, or not a name (see documents.job_type_problem)
    MISSING_STARTED_AT = "missing_started_at"
    STARTED_AT_AS_STRING = "started_at_stored_as_string"
    STARTED_AT_NOT_A_DATE = "started_at_not_a_date"
    FINISHED_BEFORE_STARTED = "finished_before_started"
    # Undated: no day can hold these jobs, so they are counted over the whole collection.
    MISSING_FINISHED_AT = "missing_finished_at"
    FINISHED_AT_AS_STRING = "finished_at_stored_as_string"
    INCOMPLETE_AUDIT_EVENT = "incomplete_audit_event"
    # Cache entries, where they are the source.
    MISSING_DURATION = "missing_duration"  # written before 2024-07, or by a step that records none
    INVALID_DURATION = "invalid_duration"
    INVALID_HTTP_STATUS = "invalid_http_status"


def durations_array(values: Iterable[float] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=_DURATIONS).ravel()


@dataclass
class Tally:
    """One job type over one period; tallies of several periods add up exactly."""

    statuses: Counter[Any] = field(default_factory=Counter)  # final status -> jobs
    started: int = 0  # jobs that ran: a valid start, or an audited zombie whose job is gone
    success: np.ndarray = field(default_factory=lambda: EMPTY_DURATIONS)  # seconds, float32
    error: np.ndarray = field(default_factory=lambda: EMPTY_DURATIONS)  # errors not audited as exceeded
    stopped: np.ndarray = field(
        default_factory=lambda: EMPTY_DURATIONS
    )  # audited as stopped at T2: ran at least this long
    zombies: Counter[Any] = field(default_factory=Counter)  # reason -> audited zombies

    def __add__(self, other: Tally) -> Tally:
        return Tally.total([self, other])

    @classmethod
    def total(cls, tallies: Sequence[Tally]) -> Tally:
        """The tallies as one, each array joined once: adding them in turn would copy the running total every time."""
        return cls(
            statuses=sum((Counter(tally.statuses) for tally in tallies), Counter()),
            started=sum(tally.started for tally in tallies),
            success=np.concatenate([EMPTY_DURATIONS, *(tally.success for tally in tallies)]),
            error=np.concatenate([EMPTY_DURATIONS, *(tally.error for tally in tallies)]),
            stopped=np.concatenate([EMPTY_DURATIONS, *(tally.stopped for tally in tallies)]),
            zombies=sum((Counter(tally.zombies) for tally in tallies), Counter()),
        )

    def stopped_at(self, max_duration_seconds: float) -> np.ndarray:
        """Durations of every job stopped at T2: audited, or errors that reached it."""
        return np.concatenate([self.stopped, self.error[self.error >= max_duration_seconds]])


@dataclass
class Period:
    """Tallies per job type over ``[start, end)``, with the documents left out."""

    start: dt.datetime
    end: dt.datetime
    tallies: dict[str, Tally] = field(default_factory=dict)
    bad_data: Counter[Any] = field(default_factory=Counter)
    jobs_read: int = 0  # finished jobs, or cache entries where those are the source
    events_read: int = 0
    source: str = "jobs"  # see SOURCES
    detection: dict[str, np.ndarray] = field(default_factory=dict)  # reason -> the events' detection_seconds
    #: The databases read, where the wiring can tell them apart (a simulation's id); None: a deployment's.
    origin: str | None = None

    def tally(self, job_type: str) -> Tally:
        return self.tallies.setdefault(job_type, Tally())

    def detected(self, reason: str, seconds: float) -> None:
        self.detection[reason] = np.concatenate(
            [self.detection.get(reason, EMPTY_DURATIONS), durations_array([seconds])]
        )


def combine(periods: Iterable[Period]) -> Period:
    """The periods as one: counts added, durations concatenated, so percentiles stay exact."""
    periods = sorted(periods, key=lambda period: period.start)
    if not periods:
        raise ValueError("combine needs at least one period")
    sources = sorted({period.source for period in periods})
    result = Period(start=periods[0].start, end=max(period.end for period in periods), source="+".join(sources))
    by_type: dict[str, list[Tally]] = {}
    for period in periods:
        for job_type, tally in period.tallies.items():
            by_type.setdefault(job_type, []).append(tally)
        result.bad_data += Counter(period.bad_data)
        result.jobs_read += period.jobs_read
        result.events_read += period.events_read
    result.tallies = {job_type: Tally.total(tallies) for job_type, tallies in by_type.items()}
    # A day tallied before detection times were recorded was stored without them.
    detection = [getattr(period, "detection", {}) for period in periods]
    for reason in sorted({reason for times in detection for reason in times}):
        result.detection[reason] = np.concatenate(
            [EMPTY_DURATIONS, *(times.get(reason, EMPTY_DURATIONS) for times in detection)]
        )
    return result


EVENT_PROJECTION = {
    ID: 1,
    Event.REASON: 1,
    Event.FINALIZED_AT: 1,
    Event.DETECTION_SECONDS: 1,
    f"{Event.JOB}.{Job.TYPE}": 1,
    f"{Event.JOB}.{Job.STARTED_AT}": 1,
}


#: Job id -> (type, reason) of the zombies audited in a period; they are few.
Audited = Mapping[Any, tuple[str, str]]


def is_job_type(value: Any) -> TypeGuard[str]:
    return job_type_problem(value) is None


def tally_events(period: Period, events: Iterable[ZombieEvent]) -> Audited:
    """Count the period's audited zombies; return ``job id -> (type, reason)`` for :func:`tally_jobs`.

    The duration of a job stopped for exceeding T2 comes from its event, which
    outlives the job document's 7-day TTL.
    """
    audited: dict[Any, tuple[str, str]] = {}  # zombies are few
    for event in events:
        period.events_read += 1
        snapshot = event.get(Event.JOB)
        if not isinstance(snapshot, Mapping):
            snapshot = {}
        job_type = snapshot.get(Job.TYPE)
        reason = event.get(Event.REASON)
        if not is_job_type(job_type) or not isinstance(reason, str) or reason not in REASONS:
            period.bad_data[BadData.INCOMPLETE_AUDIT_EVENT] += 1
            continue
        if reason == Reason.EXCEEDED_MAX_DURATION:
            started_at, finalized_at = as_utc(snapshot.get(Job.STARTED_AT)), as_utc(event.get(Event.FINALIZED_AT))
            if started_at is None or finalized_at is None or finalized_at < started_at:
                period.bad_data[BadData.INCOMPLETE_AUDIT_EVENT] += 1
                continue
            tally = period.tally(job_type)
            tally.stopped = np.concatenate(
                [tally.stopped, durations_array([(finalized_at - started_at).total_seconds()])]
            )
        period.tally(job_type).zombies[reason] += 1
        detection_seconds = event.get(Event.DETECTION_SECONDS)  # recorded since 2026-12
        if isinstance(detection_seconds, (int, float)) and detection_seconds >= 0:
            period.detected(reason, detection_seconds)
        audited[event[ID]] = (job_type, reason)
    return audited
