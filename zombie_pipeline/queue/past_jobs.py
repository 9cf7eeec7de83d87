"""The deployment's ``pastJobs``: the runs of the last hour its rate limiter counts."""

from __future__ import annotations

from typing import Final

PAST_JOBS_COLLECTION = "pastJobs"


class PastJob:
    """Field names of ``pastJobs``: the runs of the last hour, for the deployment's rate limiter."""

    DATASET: Final = "dataset"
    DURATION: Final = "duration"  # whole seconds
    FINISHED_AT: Final = "finished_at"
