"""The code location: every job, asset, check, schedule and sensor, with the resources from the environment."""

import dagster as dg

from zombie_pipeline.orchestration.assets import ASSETS
from zombie_pipeline.orchestration.checks import ASSET_CHECKS
from zombie_pipeline.orchestration.jobs import JOBS
from zombie_pipeline.orchestration.resources import resources_from_env
from zombie_pipeline.orchestration.schedules import SCHEDULES
from zombie_pipeline.orchestration.sensors import SENSORS

defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=ASSET_CHECKS,
    jobs=JOBS,
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=resources_from_env(),
)
