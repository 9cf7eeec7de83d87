"""Finished jobs, audit events and tallies of known durations, for the statistics suites."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from bson import ObjectId

from zombie_pipeline.queue.audit_documents import Event, EventState, ZombieEvent
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.statistics.tallies import Period, Tally

UTC = dt.UTC
DAY = dt.datetime(2024, 3, 5, tzinfo=UTC)
NEXT_DAY = DAY + dt.timedelta(days=1)
NOON = DAY + dt.timedelta(hours=12)


def job(job_type: Any, status: Any, seconds: float | None, finished_at: Any = NOON, **fields: Any) -> JobDocument:
    """A finished job that ran ``seconds`` (None: never started). Type, status and dates are ``Any``: the suites
    build bad data with them too, which the jobs collection holds all the same."""
    document: dict[str, Any] = {ID: ObjectId(), Job.TYPE: job_type, Job.STATUS: status, Job.FINISHED_AT: finished_at}
    if seconds is not None:
        document[Job.STARTED_AT] = finished_at - dt.timedelta(seconds=seconds)
    document.update(fields)
    return cast(JobDocument, document)


def event(job_document: Mapping[str, Any], reason: str, state: str = EventState.DONE) -> ZombieEvent:
    """The audit event of a zombie finalization; its finalized_at is the job's finished_at."""
    return {
        ID: job_document[ID],
        Event.JOB: {Job.TYPE: job_document[Job.TYPE], Job.STARTED_AT: job_document[Job.STARTED_AT]},
        Event.REASON: reason,
        Event.FINALIZED_AT: job_document[Job.FINISHED_AT],
        Event.STATE: state,
    }


def tally(success=(), error=(), stopped=()) -> Tally:
    return Tally(
        statuses=cast(Counter[Any], {Status.SUCCESS: len(success), Status.ERROR: len(error) + len(stopped)}),
        started=len(success) + len(error) + len(stopped),
        success=np.asarray(success, dtype=np.float32),
        error=np.asarray(error, dtype=np.float32),
        stopped=np.asarray(stopped, dtype=np.float32),
    )


def week(tallies: dict[str, Tally], end: dt.datetime = NEXT_DAY) -> Period:
    """The seven days to ``end``, holding ``tallies``."""
    return Period(start=end - dt.timedelta(days=7), end=end, tallies=tallies)
