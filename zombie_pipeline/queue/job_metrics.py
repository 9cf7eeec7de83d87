"""The deployment's ``jobTotalMetric``: jobs per type and status, kept in step with the queue, and its writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pymongo import UpdateOne
from pymongo.client_session import ClientSession
from pymongo.collection import Collection

JOB_METRICS_COLLECTION = "jobTotalMetric"


class JobMetric:
    """Field names of ``jobTotalMetric``: started, waiting ... jobs per type, kept in step by the deployment."""

    JOB_TYPE: Final = "job_type"
    STATUS: Final = "status"
    DATASET_STATUS: Final = "dataset_status"  # from 2024-07-31; incremental updates always use "normal"
    TOTAL: Final = "total"
    CREATED_AT: Final = "created_at"


DATASET_STATUS_NORMAL = "normal"


def metric_key(job_type: str, status: str, by_dataset_status: bool) -> dict[str, str]:
    """The key of a row: its type and status, and its ``dataset_status`` where the rows have one."""
    key = {JobMetric.JOB_TYPE: job_type, JobMetric.STATUS: status}
    if by_dataset_status:
        key[JobMetric.DATASET_STATUS] = DATASET_STATUS_NORMAL
    return key


def add_to_totals(
    totals: Collection[Any],
    changes: Mapping[tuple[str, str], int],
    by_dataset_status: bool,
    session: ClientSession | None = None,
) -> None:
    """Move the totals of each (job type, status) by ``changes``, in one command (a row missing is created)."""
    operations = [
        UpdateOne(metric_key(job_type, status, by_dataset_status), {"$inc": {JobMetric.TOTAL: change}}, upsert=True)
        for (job_type, status), change in sorted(changes.items())
        if change
    ]
    if operations:
        totals.bulk_write(operations, ordered=False, session=session)
