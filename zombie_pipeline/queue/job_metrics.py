"""The deployment's ``jobTotalMetric``: jobs per type and status, kept in step with the queue."""

from __future__ import annotations

from typing import Final

JOB_METRICS_COLLECTION = "jobTotalMetric"


class JobMetric:
    """Field names of ``jobTotalMetric``: started, waiting ... jobs per type, kept in step by the deployment."""

    JOB_TYPE: Final = "job_type"
    STATUS: Final = "status"
    DATASET_STATUS: Final = "dataset_status"  # from 2024-07-31; incremental updates always use "normal"
    TOTAL: Final = "total"
    CREATED_AT: Final = "created_at"


DATASET_STATUS_NORMAL = "normal"
