"""The queue's health, told by sensors: after each cleanup, and when cleanups stop.

- ``cleanup_checks_sensor`` (running by default): after each successful
  cleanup, ``queue_health_job`` records the queue's state and runs the checks.
- ``cleanup_overdue_sensor`` (every minute, stopped by default: turned on with
  the schedule): no cleanup of the queue succeeded in the last N minutes. Says
  so on ``queue_health``'s check ``cleanups_are_recent`` and to the webhook.
"""

import datetime as dt
import json

import dagster as dg

from zombie_pipeline.config import CLEANUP_OVERDUE_MINUTES_ENV, cleanup_overdue_minutes
from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.health import recency
from zombie_pipeline.defs.health.assets import cleanup_scope, queue_health, queue_health_job
from zombie_pipeline.defs.resources import FailureWebhook
from zombie_pipeline.defs.tags import CLEANUP_RUN_TAG, TRIGGER_TAG
from zombie_pipeline.observability import alerts
from zombie_pipeline.queue.times import utc_now


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    name="cleanup_checks_sensor",
    monitored_jobs=[kill_zombies_job],
    request_job=queue_health_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "After each successful kill_zombies_job run (dry runs excepted), materializes queue_health and runs its "
        "checks (no zombies left, every finalized zombie has its cache error) for that cleanup's start time and types."
    ),
)
def cleanup_checks_sensor(context: dg.RunStatusSensorContext) -> dg.SkipReason | dg.RunRequest:
    run_id = context.dagster_run.run_id
    scope = cleanup_scope(context.instance, run_id)
    if scope is not None and scope.dry_run:
        return dg.SkipReason(f"cleanup run {run_id} was a dry run: nothing to check")
    return dg.RunRequest(
        run_key=f"checks-after-{run_id}", tags={CLEANUP_RUN_TAG: run_id, TRIGGER_TAG: "cleanup_checks_sensor"}
    )


@dg.sensor(
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description=(
        "Every minute, the age of the last successful kill_zombies_job run of this queue database. When it passes "
        f"${CLEANUP_OVERDUE_MINUTES_ENV} minutes (30 by default; counted from the sensor's start while no cleanup ever "
        "succeeded), queue_health's check cleanups_are_recent fails and the failure webhook is POSTed once; when a "
        "cleanup succeeds again, the check passes. Turn it on with kill_zombies_schedule."
    ),
)
def cleanup_overdue_sensor(context: dg.SensorEvaluationContext, failure_webhook: FailureWebhook) -> dg.SensorResult:
    cursor = json.loads(context.cursor) if context.cursor else {}
    now = utc_now()
    watching_since = dt.datetime.fromisoformat(cursor["watching_since"]) if cursor.get("watching_since") else now
    verdict = recency.cleanup_recency(context.instance, now, cleanup_overdue_minutes(), watching_since)
    state = "overdue" if verdict.overdue else "recent"
    next_cursor = json.dumps({"watching_since": watching_since.isoformat(), "reported": state})
    if cursor.get("reported") == state:
        return dg.SensorResult(skip_reason=verdict.message(), cursor=next_cursor)
    if verdict.overdue:
        context.log.error(verdict.message())
        outcome = alerts.post_alert(failure_webhook.url, verdict.payload(), failure_webhook.timeout_seconds)
        if outcome.startswith("failed"):
            context.log.warning(f"failure webhook: {outcome}")
    else:
        context.log.info(verdict.message())
    evaluation = dg.AssetCheckEvaluation(
        asset_key=queue_health.key,
        check_name=recency.CHECK_NAME,
        passed=not verdict.overdue,
        metadata=verdict.metadata(),
        description=verdict.message(),
    )
    return dg.SensorResult(asset_events=[evaluation], cursor=next_cursor)
