"""Job types as dynamic partitions: cleanup can run, and be backfilled, per job type."""

import dagster as dg

JOB_TYPE_PARTITIONS = dg.DynamicPartitionsDefinition(name="job_types")
