"""The duration statistics: daily tallies and heartbeat gaps, the window's statistics with the T2 and heartbeat
timeout suggestions, the repeat offenders (with their check ``no_repeat_offenders``), and the daily schedule."""

import dagster as dg

from zombie_pipeline.defs.statistics.assets import (
    duration_statistics_job,
    job_duration_statistics,
    job_duration_tallies,
)
from zombie_pipeline.defs.statistics.heartbeat_gaps import heartbeat_gap_tallies
from zombie_pipeline.defs.statistics.repeat_offenders import repeat_offenders
from zombie_pipeline.defs.statistics.schedules import duration_stats_schedule

defs = dg.Definitions(
    assets=[job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics, repeat_offenders],
    jobs=[duration_statistics_job],
    schedules=[duration_stats_schedule],
)
