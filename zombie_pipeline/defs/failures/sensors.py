"""``pipeline_failure_sensor`` (running by default): a failed run of any job of this code location is logged,
recorded in ``zombiePipelineFailures`` and POSTed to an optional webhook; a run Dagster retries, by its retry, unless
it never started (then at once: nothing else says the code server failed it).
"""

import dagster as dg
from pymongo.errors import PyMongoError

from zombie_pipeline.config import WEBHOOK_URL_ENV
from zombie_pipeline.defs.failures.causes import Launch, launch_of, run_cause
from zombie_pipeline.defs.resources import Databases, FailureWebhook
from zombie_pipeline.defs.tags import PARTITION_TAG, WILL_RETRY_TAG
from zombie_pipeline.observability import alerts
from zombie_pipeline.queue.secrets import scrub
from zombie_pipeline.queue.times import utc_now


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
