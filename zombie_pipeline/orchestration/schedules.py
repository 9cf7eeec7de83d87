"""Schedules: the cleanup every 10 minutes, the duration statistics every day.

Both are stopped by default: an operator turns them on in the UI (Automation)
once the policy suits the deployment. The cleanup's cron comes from
``$ZOMBIE_KILL_CRON``; a bad value stops the code location from loading with a
message that names the variable, rather than a schedule that never fires.
A cleanup tick skips, saying why, while a cleanup of the same queue database is
queued or running: it would only wait behind it, and a stuck run would pile up
a backlog that later runs as a burst.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import dagster as dg

if TYPE_CHECKING:  # what Dagster builds from an asset job's partitions; not exported at the top level
    from dagster._core.definitions.partitions.partitioned_schedule import UnresolvedPartitionedAssetScheduleDefinition

from zombie_pipeline import config
from zombie_pipeline.config import KILL_CRON_ENV, SettingError
from zombie_pipeline.orchestration.cleanup import cleanup_in_flight, in_flight_reason, kill_zombies_job
from zombie_pipeline.orchestration.statistics import duration_statistics_job
from zombie_pipeline.orchestration.tags import TRIGGER_TAG

DEFAULT_KILL_CRON = "*/10 * * * *"
TIMEZONE = "UTC"


def kill_zombies_cron(environ: Mapping[str, str] | None = None) -> str:
    """The cleanup's cron: ``$ZOMBIE_KILL_CRON`` when set and not blank, else every 10 minutes."""
    return config.kill_cron(environ) or DEFAULT_KILL_CRON


def build_kill_zombies_schedule(cron: str | None = None) -> dg.ScheduleDefinition:
    cron = cron if cron is not None else kill_zombies_cron()
    try:

        @dg.schedule(
            name="kill_zombies_schedule",
            cron_schedule=cron,
            job_name=kill_zombies_job.name,
            execution_timezone=TIMEZONE,
            default_status=dg.DefaultScheduleStatus.STOPPED,
            description=(
                f"Runs kill_zombies_job over every job type on '{cron}' (UTC; set ${KILL_CRON_ENV} to change, "
                f"default '{DEFAULT_KILL_CRON}'), unless a cleanup of the same queue database is queued or running "
                "(the tick then skips and names it). stale_jobs_sensor reacts sooner; this is the safety net that also "
                "completes finalizations a crashed run left behind."
            ),
        )
        def kill_zombies_schedule(context: dg.ScheduleEvaluationContext) -> dg.SkipReason | dg.RunRequest:
            in_flight = cleanup_in_flight(context.instance)
            if in_flight is not None:
                return dg.SkipReason(in_flight_reason(in_flight, context.instance))
            return dg.RunRequest(tags={TRIGGER_TAG: "kill_zombies_schedule"})

    except dg.DagsterInvalidDefinitionError:
        raise SettingError(
            f"{KILL_CRON_ENV}={cron!r} is not a valid cron schedule: use five fields "
            f"(minute hour day-of-month month day-of-week), e.g. {DEFAULT_KILL_CRON!r} for every 10 minutes, "
            f"or unset {KILL_CRON_ENV} for that default."
        ) from None
    return kill_zombies_schedule


def build_duration_stats_schedule() -> dg.ScheduleDefinition | UnresolvedPartitionedAssetScheduleDefinition:
    """Daily at 00:30 UTC, for the UTC day that just ended (the job's daily partition)."""
    return dg.build_schedule_from_partitioned_job(
        duration_statistics_job,
        name="duration_stats_schedule",
        hour_of_day=0,
        minute_of_hour=30,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        tags={TRIGGER_TAG: "duration_stats_schedule"},
        description=(
            "Every day at 00:30 UTC, materializes the previous UTC day: its duration tallies, then the statistics "
            "and suggested maximum durations of the window ending that day. Older days: backfill the partitions "
            "from the asset page."
        ),
    )


kill_zombies_schedule = build_kill_zombies_schedule()
duration_stats_schedule = build_duration_stats_schedule()
