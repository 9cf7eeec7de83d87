"""Names shared across the code location: asset groups, run tags, partitions."""

import json

import dagster as dg

from zombie_pipeline.cleanup.plan import CleanupOptions
from zombie_pipeline.policy import PolicySource

CLEANUP_GROUP = "zombie_cleanup"
STATISTICS_GROUP = "duration_statistics"

#: Tag of a ``queue_health_job`` run: the cleanup run whose result it checks.
CLEANUP_RUN_TAG = "zombie_pipeline/cleanup_run_id"
#: Which schedule or sensor asked for a run.
TRIGGER_TAG = "zombie_pipeline/trigger"
STALE_COUNT_TAG = "zombie_pipeline/stale_jobs"
#: Dagster's own tag of a partitioned run.
PARTITION_TAG = "dagster/partition"
#: A cleanup run's scope, tagged by its first step: what ``queue_health``'s checks judge that cleanup by, and what the
#: runs list shows (a dry run; the job types, a JSON list, absent for every type).
DRY_RUN_TAG = "zombie_pipeline/dry_run"
JOB_TYPES_TAG = "zombie_pipeline/job_types"


#: Where a run's policy came from (``policy.PolicySource``), tagged by the first step that takes it: ``default``, or
#: ``file:<path>`` with the file's SHA-256 (its first 12 hex digits), and the fields the run's config overrode.
POLICY_SOURCE_TAG = "zombie_pipeline/policy_source"
POLICY_SHA256_TAG = "zombie_pipeline/policy_sha256"
POLICY_OVERRIDES_TAG = "zombie_pipeline/policy_overrides"


def policy_tags(source: PolicySource) -> dict[str, str]:
    """The tags that say where a run's policy came from."""
    tags = {POLICY_SOURCE_TAG: f"file:{source.path}" if source.path else "default"}
    if source.digest:
        tags[POLICY_SHA256_TAG] = source.digest
    if source.overrides:
        tags[POLICY_OVERRIDES_TAG] = ",".join(source.overrides)
    return tags


def scope_tags(options: CleanupOptions) -> dict[str, str]:
    """The tags that say a cleanup run's scope."""
    tags = {DRY_RUN_TAG: str(options.dry_run).lower()}
    if options.job_types is not None:
        tags[JOB_TYPES_TAG] = json.dumps(list(options.job_types))
    return tags


def scope_of_tags(tags: dict[str, str]) -> tuple[tuple[str, ...] | None, bool]:
    """The job types (None: every type) and whether it was a dry run, as a cleanup run's tags say them."""
    job_types = tuple(json.loads(tags[JOB_TYPES_TAG])) if JOB_TYPES_TAG in tags else None
    return job_types, tags.get(DRY_RUN_TAG) == "true"


# --- what the production run queue, run monitoring and run retries read (deploy/dagster.yaml) ---------------
#: Which part of the pipeline a run belongs to (value: CLEANUP_GROUP or STATISTICS_GROUP).
PIPELINE_TAG = "pipeline"
#: The queue database a cleanup works on: the run queue allows one cleanup per value at a time.
QUEUE_DATABASE_TAG = "zombie_pipeline/queue_database"
#: The queue database a watch run watches: the watch sensor finds the runs of its queue by it (not the cleanups' tag,
#: whose limit of one run would hold every cleanup behind a watch run that lasts an hour).
WATCHED_QUEUE_DATABASE_TAG = "zombie_pipeline/watched_queue_database"
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
