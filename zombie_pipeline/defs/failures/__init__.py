"""The failed runs of this code location, told once: ``pipeline_failure_sensor``."""

import dagster as dg

from zombie_pipeline.defs.failures.sensors import pipeline_failure_sensor

defs = dg.Definitions(sensors=[pipeline_failure_sensor])
