"""The queue's health after a cleanup: ``queue_health`` and its checks, checked after each cleanup and when cleanups
stop."""

import dagster as dg

from zombie_pipeline.defs.health.assets import (
    cleanups_are_recent,
    compensations_succeed,
    no_zombies_left,
    queue_health,
    queue_health_job,
    zombies_have_cache_errors,
)
from zombie_pipeline.defs.health.sensors import cleanup_checks_sensor, cleanup_overdue_sensor

defs = dg.Definitions(
    assets=[queue_health],
    asset_checks=[no_zombies_left, zombies_have_cache_errors, compensations_succeed, cleanups_are_recent],
    jobs=[queue_health_job],
    sensors=[cleanup_checks_sensor, cleanup_overdue_sensor],
)
