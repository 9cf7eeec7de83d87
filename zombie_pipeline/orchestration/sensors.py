"""Sensors: react within a minute instead of waiting for the schedule, and report what goes wrong.

- ``stale_jobs_sensor`` (every 30 s, stopped by default: it writes): a count
  on the ``(status, started_at)`` index; when jobs are past their thresholds it
  requests ``kill_zombies_job`` with a run key made from the stale jobs' ids, so
  one state of the queue launches one cleanup, however many ticks see it. While
  a watcher holds a live lease (``orchestration/watch.py``) it leaves them to it:
  the fallback of a watcher that died or hung, from the first tick after.
- ``job_types_sensor`` (every 5 minutes, running by default): each job type in
  the queue becomes a ``job_types`` partition, so new types can be cleaned and
  backfilled without a deploy.
- ``cleanup_checks_sensor`` (running by default): after each successful
  cleanup, ``queue_health_job`` records the queue's state and runs the checks.
- ``pipeline_failure_sensor`` (running by default): a failed run of any job of
  this code location is logged, recorded in ``zombiePipelineFailures`` and
  POSTed to an optional webhook; a run Dagster retries, by its retry, unless it
  never started (then at once: nothing else says the code server failed it).
- ``cleanup_overdue_sensor`` (every minute, stopped by default: turned on with
  the schedule): no cleanup of the queue succeeded in the last N minutes. Says
  so on ``queue_health``'s check ``cleanups_are_recent`` and to the webhook.
"""

import datetime as dt
import json

import dagster as dg
from pymongo.errors import PyMongoError

from zombie_pipeline import alerts, monitoring
from zombie_pipeline.cleanup import watch_lease
from zombie_pipeline.config import CLEANUP_OVERDUE_MINUTES_ENV, WEBHOOK_URL_ENV, cleanup_overdue_minutes
from zombie_pipeline.orchestration import recency
from zombie_pipeline.orchestration.cleanup import cleanup_in_flight, in_flight_reason, kill_zombies_job
from zombie_pipeline.orchestration.failures import Launch, launch_of, run_cause
from zombie_pipeline.orchestration.health import cleanup_scope, queue_health, queue_health_job
from zombie_pipeline.orchestration.resources import Databases, FailureWebhook, ZombiePolicyResource
from zombie_pipeline.orchestration.tags import (
    CLEANUP_RUN_TAG,
    JOB_TYPE_PARTITIONS,
    JOB_TYPE_PARTITIONS_NAME,
    PARTITION_TAG,
    STALE_COUNT_TAG,
    TRIGGER_TAG,
    WILL_RETRY_TAG,
)
from zombie_pipeline.queue.documents import utc_now
from zombie_pipeline.queue.secrets import scrub

#: The stale jobs sensor's tick: Dagster's own shortest (the daemon evaluates sensors every 30 s); an indexed count
#: each time, so a dead job waits half a minute at most before its cleanup is requested.
STALE_JOBS_TICK_SECONDS = 30


@dg.sensor(
    job_name=kill_zombies_job.name,
    minimum_interval_seconds=STALE_JOBS_TICK_SECONDS,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description=(
        f"Every {STALE_JOBS_TICK_SECONDS} s, counts started jobs past their heartbeat timeout or maximum duration "
        "(an indexed count). "
        "When there are any, requests a kill_zombies_job run over every type, keyed by the set of stale jobs: "
        "the same state never launches twice, and no run is requested while a cleanup of the same queue database is queued "
        "or running, nor while a watcher holds a live lease (zombie_watch_job: this sensor is its fallback). "
        "Detection latency becomes threshold + the tick + the run's start."
    ),
)
def stale_jobs_sensor(
    context: dg.SensorEvaluationContext, databases: Databases, zombie_policy: ZombiePolicyResource
) -> dg.SkipReason | dg.RunRequest:
    databases.check_reachable(cache=False)
    store = databases.store()
    now = utc_now()
    state = monitoring.stale_state(store.jobs, zombie_policy.in_force(store), now)
    if state.count == 0:
        return dg.SkipReason("no started job is past its thresholds")
    watcher = watch_lease.alive_watcher(store.watchers, now)
    if watcher is not None:  # the fallback, once its lease lapses (dead or hung): at the first tick after
        return dg.SkipReason(f"{state.count} stale jobs, left to the watcher: {watcher.describe(now)}")
    in_flight = cleanup_in_flight(context.instance)
    if in_flight is not None:
        reason = in_flight_reason(in_flight, context.instance)
        return dg.SkipReason(f"{state.count} stale jobs, left to the cleanup in flight or the next tick: {reason}")
    context.log.info(f"{state.count} started jobs are past their thresholds: requesting a cleanup ({state.run_key})")
    return dg.RunRequest(
        run_key=state.run_key,
        tags={TRIGGER_TAG: context.sensor_name or "stale_jobs_sensor", STALE_COUNT_TAG: str(state.count)},
    )


@dg.sensor(
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Every 5 minutes, registers each distinct job type of the jobs collection as a partition of 'job_types', "
        "so cleanup can run and be backfilled per type without a deploy. Types that cannot be partition keys "
        "(not a non-empty printable string, or containing '.' or a leading '$') are logged and skipped."
    ),
)
def job_types_sensor(context: dg.SensorEvaluationContext, databases: Databases) -> dg.SensorResult:
    databases.check_reachable(cache=False)
    found = monitoring.job_types_in_queue(databases.store().jobs)
    if found.refused:
        context.log.warning(
            f"{len(found.refused)} job types cannot be partitions and were skipped: {found.refused[:10]!r}"
        )
    known = set(context.instance.get_dynamic_partitions(JOB_TYPE_PARTITIONS_NAME))
    new = sorted(set(found.valid) - known)
    if not new:
        return dg.SensorResult(skip_reason=f"all {len(found.valid)} job types are registered")
    context.log.info(f"registering {len(new)} new job types: {', '.join(new)}")
    return dg.SensorResult(dynamic_partitions_requests=[JOB_TYPE_PARTITIONS.build_add_request(new)])


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


@dg.run_failure_sensor(
    name="pipeline_failure_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "When a run of this code location fails: logs one line, records it in the queue database "
        "(zombiePipelineFailures, _id = run id) and POSTs it as JSON to the webhook in "
        f"${WEBHOOK_URL_ENV}, if set. Database URLs and credentials are scrubbed from every message. A run that "
        "Dagster retries is told by its retry, if that fails too, unless it never started: a launch error (the code "
        "server did not answer in time) or the start timeout is told at once, marked will_retry."
    ),
)
def pipeline_failure_sensor(
    context: dg.RunFailureSensorContext, databases: Databases, failure_webhook: FailureWebhook
) -> None:
    run_id = context.dagster_run.run_id
    launch = launch_of(context.instance, run_id)
    # Told once: a run lost after it started by its retry, if that fails too. A run that never started is told now,
    # retried or not: its retry may well start, and nothing else would say that the code server could not start it.
    if context.dagster_run.tags.get(WILL_RETRY_TAG) == "true" and launch.started:
        context.log.info(f"run {run_id} failed and will be retried; its retry reports")
        return
    record = failure_record(context, [*databases.urls(), failure_webhook.url], launch)
    context.log.error(record.log_line())
    outcome = alerts.post_alert(failure_webhook.url, record.payload(), failure_webhook.timeout_seconds)
    if outcome.startswith("failed"):
        context.log.warning(f"failure webhook: {outcome}")
    try:
        alerts.record_failure(databases.store().failures, record, outcome)
    except PyMongoError as error:  # the database may be why the run failed: the log line and webhook remain
        context.log.error(f"could not record the failure: {scrub(str(error), databases.urls())}")


def failure_record(
    context: dg.RunFailureSensorContext, secrets: list[str | None], launch: Launch | None = None
) -> alerts.FailureRecord:
    """The failure as its cause in one line (a step's, else the run's own: a resource that would not start, else the
    error of a launch that never started it), scrubbed; whether Dagster retries it."""
    run = context.dagster_run
    steps = context.get_step_failure_events()
    launch = launch or launch_of(context.instance, run.run_id)
    return alerts.FailureRecord(
        run_id=run.run_id,
        job_name=run.job_name,
        failed_at=utc_now(),
        message=scrub(run_cause(context.failure_event, steps, launch.errors), secrets),
        partition_key=run.tags.get(PARTITION_TAG),
        failed_steps=tuple(event.step_key for event in steps if event.step_key),
        will_retry=run.tags.get(WILL_RETRY_TAG) == "true",
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
