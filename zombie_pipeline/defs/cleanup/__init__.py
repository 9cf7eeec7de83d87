"""The cleanup: ``kill_zombies_job`` (partitioned by job type), its schedule, and the sensors that request it and
register the job types."""

import dagster as dg

from zombie_pipeline.defs.cleanup.jobs import kill_zombies_job
from zombie_pipeline.defs.cleanup.schedules import kill_zombies_schedule
from zombie_pipeline.defs.cleanup.sensors import job_types_sensor, stale_jobs_sensor

defs = dg.Definitions(
    jobs=[kill_zombies_job],
    schedules=[kill_zombies_schedule],
    sensors=[stale_jobs_sensor, job_types_sensor],
)
