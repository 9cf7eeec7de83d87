"""How long a queue has gone without a successful cleanup: the alarm an operator sets on the cleanup itself.

A cleanup that fails says so (``pipeline_failure_sensor``); one that never ends, or is never launched (the
schedule turned off, the daemon down, a code location that does not load, every tick skipped behind a stuck
run) says nothing. What they have in common is that no cleanup of the queue succeeds: this reads the newest
successful ``kill_zombies_job`` run of the queue database from the Dagster instance and judges its age against
a limit (``$ZOMBIE_CLEANUP_OVERDUE_MINUTES``, 30 by default: three ticks of the default schedule). The
``cleanups_are_recent`` check shows the verdict on ``queue_health``; ``cleanup_overdue_sensor`` reports it
there every time it changes and POSTs the failure webhook when the queue becomes overdue.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import dagster as dg

from zombie_pipeline.config import CLEANUP_OVERDUE_MINUTES_ENV
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.tags import QUEUE_DATABASE_TAG

CHECK_NAME = "cleanups_are_recent"


@dataclass(frozen=True)
class CleanupRecency:
    queue_database: str
    limit_minutes: int
    now: dt.datetime
    last_success_run_id: str | None
    last_success_at: dt.datetime | None  # when that run ended
    watching_since: dt.datetime | None  # the sensor's first tick: a queue never cleaned is overdue only after the limit

    @property
    def reference(self) -> dt.datetime | None:
        """What the age is counted from: the last successful cleanup, else when watching started."""
        return self.last_success_at or self.watching_since

    @property
    def minutes_since(self) -> float | None:
        return None if self.reference is None else (self.now - self.reference).total_seconds() / 60

    @property
    def overdue(self) -> bool:
        return self.minutes_since is None or self.minutes_since > self.limit_minutes

    def message(self) -> str:
        queue = f"queue database {self.queue_database!r}"
        limit = f"limit {self.limit_minutes} min, ${CLEANUP_OVERDUE_MINUTES_ENV}"
        if self.last_success_at is None:
            since = "" if self.watching_since is None else f" since {self.watching_since:%Y-%m-%d %H:%M} UTC"
            return f"no successful cleanup of {queue}{since} ({limit})"
        verdict = "OVERDUE: the last successful" if self.overdue else "the last successful"
        return (
            f"{verdict} cleanup of {queue} ended {self.minutes_since:.0f} min ago, at {self.last_success_at:%Y-%m-%d %H:%M} "
            f"UTC (run {self.last_success_run_id}; {limit})"
        )

    def metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"queue_database": self.queue_database, "limit_minutes": self.limit_minutes}
        if self.last_success_at is not None:
            metadata["last_successful_cleanup_at"] = dg.MetadataValue.timestamp(self.last_success_at)
            metadata["last_successful_cleanup_run"] = self.last_success_run_id
        if self.minutes_since is not None:
            metadata["minutes_since"] = round(self.minutes_since, 1)
        return metadata

    def payload(self) -> dict[str, Any]:
        """The webhook body when the queue becomes overdue; ``text`` is what chat webhooks display."""
        return {
            "text": f"zombie-pipeline: {self.message()}",
            "alert": "cleanup_overdue",
            "queue_database": self.queue_database,
            "last_successful_cleanup_at": self.last_success_at.isoformat() if self.last_success_at else None,
            "last_successful_cleanup_run": self.last_success_run_id,
            "minutes_since": None if self.minutes_since is None else round(self.minutes_since, 1),
            "limit_minutes": self.limit_minutes,
        }


def cleanup_recency(
    instance: dg.DagsterInstance,
    now: dt.datetime,
    limit_minutes: int,
    watching_since: dt.datetime | None = None,
    queue_database: str | None = None,
) -> CleanupRecency:
    """The newest successful cleanup of ``queue_database`` (default: this location's) judged against the limit."""
    database = queue_database or kill_zombies_job.tags[QUEUE_DATABASE_TAG]
    records = instance.get_run_records(
        dg.RunsFilter(
            job_name=kill_zombies_job.name, statuses=[dg.DagsterRunStatus.SUCCESS], tags={QUEUE_DATABASE_TAG: database}
        ),
        limit=1,
    )
    ended = None
    if records:
        record = records[0]
        timestamp = record.end_time or record.update_timestamp.timestamp()
        ended = dt.datetime.fromtimestamp(timestamp, dt.UTC)
    return CleanupRecency(
        queue_database=database,
        limit_minutes=limit_minutes,
        now=now,
        last_success_run_id=records[0].dagster_run.run_id if records else None,
        last_success_at=ended,
        watching_since=watching_since,
    )
