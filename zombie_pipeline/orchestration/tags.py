"""Names shared across the code location: asset groups, run tags, partitions."""

import dagster as dg

CLEANUP_GROUP = "zombie_cleanup"
STATISTICS_GROUP = "duration_statistics"

#: Tag of a ``queue_health_job`` run: the cleanup run whose result it checks.
CLEANUP_RUN_TAG = "zombie_pipeline/cleanup_run_id"
#: Which schedule or sensor asked for a run.
TRIGGER_TAG = "zombie_pipeline/trigger"
STALE_COUNT_TAG = "zombie_pipeline/stale_jobs"
#: Dagster's own tag of a partitioned run.
PARTITION_TAG = "dagster/partition"

#: Job types as dynamic partitions: the cleanup can run, and be backfilled, per type.
JOB_TYPE_PARTITIONS = dg.DynamicPartitionsDefinition(name="job_types")
