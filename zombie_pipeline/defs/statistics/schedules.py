"""The duration statistics every day, stopped by default: an operator turns it on in the UI (Automation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg

if TYPE_CHECKING:  # what Dagster builds from an asset job's partitions; not exported at the top level
    from dagster._core.definitions.partitions.partitioned_schedule import UnresolvedPartitionedAssetScheduleDefinition

from zombie_pipeline.defs.statistics.assets import duration_statistics_job
from zombie_pipeline.defs.tags import TRIGGER_TAG


def build_duration_stats_schedule() -> dg.ScheduleDefinition | UnresolvedPartitionedAssetScheduleDefinition:
    """Daily at 00:30 UTC, for the UTC day that just ended (the job's daily partition)."""
    return dg.build_schedule_from_partitioned_job(
        duration_statistics_job,
        name="duration_stats_schedule",
        hour_of_day=0,
        minute_of_hour=30,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        tags={TRIGGER_TAG: "duration_stats_schedule"},
        description=(
            "Every day at 00:30 UTC, materializes the previous UTC day: its duration tallies, then the statistics "
            "and suggested maximum durations of the window ending that day. Older days: backfill the partitions "
            "from the asset page."
        ),
    )


duration_stats_schedule = build_duration_stats_schedule()
