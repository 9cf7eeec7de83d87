"""The cleanup every 10 minutes, stopped by default: an operator turns it on in the UI (Automation) once the policy
suits the deployment.

Its cron comes from ``$ZOMBIE_KILL_CRON``; a bad value stops the code location from loading with a message that names
the variable, rather than a schedule that never fires. A tick skips, saying why, while a cleanup of the same queue
database is queued or running: it would only wait behind it, and a stuck run would pile up a backlog that later runs
as a burst.
"""

from collections.abc import Mapping

import dagster as dg

from zombie_pipeline import config
from zombie_pipeline.config import KILL_CRON_ENV, SettingError
from zombie_pipeline.defs.cleanup.jobs import cleanup_in_flight, in_flight_reason, kill_zombies_job
from zombie_pipeline.defs.tags import TRIGGER_TAG

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


kill_zombies_schedule = build_kill_zombies_schedule()
