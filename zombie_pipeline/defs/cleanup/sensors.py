"""The cleanup's sensors: react within a minute instead of waiting for the schedule.

- ``stale_jobs_sensor`` (every 30 s, stopped by default: it writes): a count
  on the ``(status, started_at)`` index; when jobs are past their thresholds it
  requests ``kill_zombies_job`` with a run key made from the stale jobs' ids, so
  one state of the queue launches one cleanup, however many ticks see it. While
  a watcher holds a live lease (``defs/watch/``) it leaves them to it:
  the fallback of a watcher that died or hung, from the first tick after.
- ``job_types_sensor`` (every 5 minutes, running by default): each job type in
  the queue becomes a ``job_types`` partition, so new types can be cleaned and
  backfilled without a deploy.
"""

import dagster as dg

from zombie_pipeline.cleanup import watch_lease
from zombie_pipeline.defs.cleanup.jobs import cleanup_in_flight, in_flight_reason, kill_zombies_job
from zombie_pipeline.defs.resources import Databases, ZombiePolicyResource
from zombie_pipeline.defs.tags import JOB_TYPE_PARTITIONS, JOB_TYPE_PARTITIONS_NAME, STALE_COUNT_TAG, TRIGGER_TAG
from zombie_pipeline.observability import monitoring
from zombie_pipeline.queue.times import utc_now

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
