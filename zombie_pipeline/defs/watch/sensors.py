"""``zombie_watch_sensor``: keeps one ``zombie_watch_job`` run watching the queue's deadlines (``jobs.py`` says how
the runs hand over), and waits longer after each failed one.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from zombie_pipeline.cleanup import watch_lease
from zombie_pipeline.cleanup.watch_lease import LeaseView
from zombie_pipeline.defs.cleanup.jobs import IN_FLIGHT_STATUSES, WAITING_STATUSES, start_timeout_seconds, waiting_since
from zombie_pipeline.defs.resources import Databases, ZombiePolicyResource
from zombie_pipeline.defs.tags import TRIGGER_TAG, WATCHED_QUEUE_DATABASE_TAG
from zombie_pipeline.defs.watch.jobs import HANDOFF_SECONDS, zombie_watch_job
from zombie_pipeline.queue.times import utc_now

#: The watch sensor's tick: Dagster's default; a watch that died is replaced within it (the fallback acts meanwhile).
WATCH_SENSOR_TICK_SECONDS = 30
#: A started watch run may take this long to take the lease (to load the code, decide the generations); past it, a
#: watch run holding no live lease is taken for dead.
WATCH_START_GRACE_SECONDS = 120
#: After a failed watch run the sensor waits this long before asking again, doubling with each failure in a row.
RELAUNCH_BACKOFF_SECONDS = (0, 60, 300, 900)


@dataclass(frozen=True)
class WatchRun:
    """A watch run as the sensor weighs it."""

    run_id: str
    status: dg.DagsterRunStatus
    since: float  # when it entered its state (unix time): its start, or when it began to wait for one


def relaunch_verdict(
    lease: LeaseView | None,
    in_flight: Sequence[WatchRun],
    failures_in_a_row: int,
    last_failure_at: float | None,
    now: dt.datetime,
    start_timeout: float,
) -> str | None:
    """Why no watch run is asked for now, or None when one should be: the sensor's decision, from what it read."""
    moment = now.timestamp()
    alive = lease is not None and lease.alive(now)
    if (
        alive
        and lease is not None
        and (lease.ends_at is None or (lease.ends_at - now).total_seconds() > HANDOFF_SECONDS)
    ):
        return lease.describe(now)
    for other in in_flight:
        if alive and lease is not None and other.run_id == lease.holder:
            continue
        if other.status in WAITING_STATUSES and moment - other.since < start_timeout:
            return f"watch run {other.run_id} is {other.status.value.lower()}: it takes the lease once started"
        if other.status == dg.DagsterRunStatus.STARTED and (alive or moment - other.since < WATCH_START_GRACE_SECONDS):
            return f"watch run {other.run_id} has started and takes the lease " + (
                "at the handover" if alive else "soon"
            )
    if failures_in_a_row and last_failure_at is not None:
        backoff = RELAUNCH_BACKOFF_SECONDS[min(failures_in_a_row, len(RELAUNCH_BACKOFF_SECONDS)) - 1]
        if moment - last_failure_at < backoff:
            return (
                f"the last {failures_in_a_row} watch runs failed (see Runs): the next one is asked for "
                f"{backoff - (moment - last_failure_at):.0f} s from now; stale_jobs_sensor acts meanwhile"
            )
    return None


@dg.sensor(
    job_name=zombie_watch_job.name,
    minimum_interval_seconds=WATCH_SENSOR_TICK_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        f"Every {WATCH_SENSOR_TICK_SECONDS} s, keeps one zombie_watch_job run watching the queue's deadlines: asks for "
        "one when no watch holds a live lease (none yet, one ended, died or hung), and for its successor "
        f"{HANDOFF_SECONDS // 60} minutes before the current one ends. Waits longer after each failed watch run. Asks "
        "for none while the policy's watch_deadlines is false: stop this sensor, or set it in the policy file, to turn "
        "the watcher off."
    ),
)
def zombie_watch_sensor(
    context: dg.SensorEvaluationContext, databases: Databases, zombie_policy: ZombiePolicyResource
) -> dg.SkipReason | dg.RunRequest:
    if not zombie_policy.policy(fresh=True).watch_deadlines:
        return dg.SkipReason("the policy turns the watcher off (watch_deadlines: false)")
    databases.check_reachable(cache=False)
    now = utc_now()
    lease = watch_lease.read(databases.store().watchers)
    instance = context.instance
    watched = {WATCHED_QUEUE_DATABASE_TAG: zombie_watch_job.tags[WATCHED_QUEUE_DATABASE_TAG]}
    in_flight = [
        WatchRun(record.dagster_run.run_id, record.dagster_run.status, _since(instance, record))
        for record in instance.get_run_records(
            dg.RunsFilter(job_name=zombie_watch_job.name, statuses=IN_FLIGHT_STATUSES, tags=watched), limit=10
        )
    ]
    finished = instance.get_run_records(
        dg.RunsFilter(
            job_name=zombie_watch_job.name,
            statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED],
            tags=watched,
        ),
        limit=len(RELAUNCH_BACKOFF_SECONDS),
    )
    failures = 0
    for record in finished:
        if record.dagster_run.status != dg.DagsterRunStatus.FAILURE:
            break
        failures += 1
    last_failure_at = finished[0].end_time if failures else None
    why_not = relaunch_verdict(lease, in_flight, failures, last_failure_at, now, start_timeout_seconds(instance))
    if why_not is not None:
        return dg.SkipReason(why_not)
    dead = [run.run_id for run in in_flight if run.status == dg.DagsterRunStatus.STARTED]
    if dead:
        context.log.warning(
            f"watch runs {dead} renew no lease: taken for dead (run monitoring stops them at their max_runtime)"
        )
    if lease is not None and lease.alive(now):
        context.log.info(f"asking for the successor of {lease.describe(now)}")
    else:
        context.log.info("no watch holds a live lease: asking for a watch run")
    return dg.RunRequest(tags={TRIGGER_TAG: context.sensor_name or "zombie_watch_sensor"})


def _since(instance: dg.DagsterInstance, record: dg.RunRecord) -> float:
    """When the run entered its state: started (its start), else as the cleanup's start timeout counts it."""
    if record.dagster_run.status in WAITING_STATUSES:
        return waiting_since(instance, record)
    return record.start_time or record.create_timestamp.timestamp()
