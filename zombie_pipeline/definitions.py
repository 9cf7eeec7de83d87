"""The code location: every job, asset, check, schedule and sensor, with the resources from the environment.

Grouped by domain, as ``orchestration/`` is: the cleanup (``kill_zombies_job``,
partitioned by job type, and ``lift_quarantine_job``), the watcher that releases each dead job at its deadline
(``zombie_watch_job``, kept running by ``zombie_watch_sensor``), the queue's health after a cleanup (``queue_health``
and its checks), the duration statistics (daily tallies and heartbeat gaps, window statistics,
T2 and heartbeat timeout suggestions), the repeat offenders (daily, in the statistics' group and job),
then the automation that runs them.
"""

import dagster as dg

from zombie_pipeline.orchestration import health, heartbeat_gaps, quarantine, repeat_offenders, statistics, watch
from zombie_pipeline.orchestration.cleanup import kill_zombies_job
from zombie_pipeline.orchestration.resources import resources_from_env
from zombie_pipeline.orchestration.schedules import (
    duration_stats_schedule,
    kill_zombies_schedule,
)
from zombie_pipeline.orchestration.sensors import (
    cleanup_checks_sensor,
    cleanup_overdue_sensor,
    job_types_sensor,
    pipeline_failure_sensor,
    stale_jobs_sensor,
)
from zombie_pipeline.policy import InvalidPolicy

try:
    resources = resources_from_env()
except InvalidPolicy as refused:  # each refusal on its own line, as `zombie-pipeline policy check` says them
    raise InvalidPolicy("\n".join(refused.lines())) from None

defs = dg.Definitions.merge(
    dg.Definitions(jobs=[kill_zombies_job, quarantine.lift_quarantine_job]),  # the cleanup, and lifting a quarantine
    dg.Definitions(jobs=[watch.zombie_watch_job], sensors=[watch.zombie_watch_sensor]),  # the watcher, on by default
    dg.Definitions(  # the queue's health after a cleanup
        assets=[health.queue_health],
        asset_checks=[
            health.no_zombies_left,
            health.zombies_have_cache_errors,
            health.compensations_succeed,
            health.cleanups_are_recent,
        ],
        jobs=[health.queue_health_job],
    ),
    dg.Definitions(  # the duration statistics
        assets=[
            statistics.job_duration_tallies,
            heartbeat_gaps.heartbeat_gap_tallies,
            statistics.job_duration_statistics,
        ],
        jobs=[statistics.duration_statistics_job],
    ),
    dg.Definitions(  # the repeat offenders, with their check no_repeat_offenders
        assets=[repeat_offenders.repeat_offenders],
    ),
    dg.Definitions(  # the automation that runs them
        schedules=[kill_zombies_schedule, duration_stats_schedule],
        sensors=[
            stale_jobs_sensor,
            job_types_sensor,
            cleanup_checks_sensor,
            pipeline_failure_sensor,
            cleanup_overdue_sensor,
        ],
    ),
    dg.Definitions(resources=resources),
)
