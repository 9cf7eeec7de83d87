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

# --- what the production run queue, run monitoring and run retries read (deploy/dagster.yaml) ---------------
#: Which part of the pipeline a run belongs to (value: CLEANUP_GROUP or STATISTICS_GROUP).
PIPELINE_TAG = "pipeline"
#: The queue database a cleanup works on: the run queue allows one cleanup per value at a time.
QUEUE_DATABASE_TAG = "zombie_pipeline/queue_database"
#: Dagster's run-queue priority (higher first): a cleanup goes ahead of statistics runs waiting for a slot.
PRIORITY_TAG = "dagster/priority"
#: Dagster's per-run limit, in seconds, after which run monitoring fails the run and stops its worker.
MAX_RUNTIME_TAG = "dagster/max_runtime"
#: Dagster's per-run number of automatic retries of a failed run (run_retries must be enabled).
MAX_RETRIES_TAG = "dagster/max_retries"
#: Whether a run that failed in a step (rather than lost its worker) is retried too (default: the instance's
#: run_retries.retry_on_asset_or_op_failure).
RETRY_ON_STEP_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"
#: Set by Dagster on a failed run: "true" when run retries will start it again.
WILL_RETRY_TAG = "dagster/will_retry"
#: How a retry re-executes: ALL_STEPS or FROM_FAILURE.
RETRY_STRATEGY_TAG = "dagster/retry_strategy"

#: Job types as dynamic partitions: the cleanup can run, and be backfilled, per type.
JOB_TYPE_PARTITIONS_NAME = "job_types"
JOB_TYPE_PARTITIONS = dg.DynamicPartitionsDefinition(name=JOB_TYPE_PARTITIONS_NAME)
