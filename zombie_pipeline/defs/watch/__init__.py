"""The watcher that releases each dead job at its deadline: ``zombie_watch_job``, kept running by
``zombie_watch_sensor`` (on by default)."""

import dagster as dg

from zombie_pipeline.defs.watch.jobs import zombie_watch_job
from zombie_pipeline.defs.watch.sensors import zombie_watch_sensor

defs = dg.Definitions(jobs=[zombie_watch_job], sensors=[zombie_watch_sensor])
