"""The code location: every job, asset, check, schedule and sensor, with the resources from the environment.

Asset groups: ``zombie_cleanup`` (``queue_health`` and its checks, the state a
cleanup leaves) and ``duration_statistics`` (daily tallies, window statistics,
T2 suggestions). Jobs: ``kill_zombies_job`` (the cleanup, partitioned by job
type), ``queue_health_job`` and ``duration_statistics_job``.
"""

import dagster as dg

from zombie_pipeline.orchestration.assets import ASSETS, STATS_JOBS
from zombie_pipeline.orchestration.checks import ASSET_CHECKS, CHECK_JOBS, HEALTH_ASSETS
from zombie_pipeline.orchestration.jobs import JOBS
from zombie_pipeline.orchestration.resources import resources_from_env
from zombie_pipeline.orchestration.schedules import SCHEDULES
from zombie_pipeline.orchestration.sensors import SENSORS, FailureWebhook

defs = dg.Definitions(
    assets=[*ASSETS, *HEALTH_ASSETS],
    asset_checks=ASSET_CHECKS,
    jobs=[*JOBS, *CHECK_JOBS, *STATS_JOBS],
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources={**resources_from_env(), "failure_webhook": FailureWebhook()},
)
