"""The deployment's ``pastJobs``: the runs of the last hour its rate limiter counts, and their writes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from zombie_pipeline.queue.jobs import ID, Job, JobSnapshot
from zombie_pipeline.queue.times import utc

PAST_JOBS_COLLECTION = "pastJobs"


class PastJob:
    """Field names of ``pastJobs``: the runs of the last hour, for the deployment's rate limiter."""

    DATASET: Final = "dataset"
    DURATION: Final = "duration"  # whole seconds
    FINISHED_AT: Final = "finished_at"


#: A run shorter than this leaves no ``pastJobs`` record.
PAST_JOB_MIN_SECONDS = 30
#: A record expires this long after its run finished (the deployment's TTL index).
PAST_JOBS_TTL = dt.timedelta(hours=1)


def run_seconds(job: JobSnapshot, finished_at: dt.datetime) -> int:
    """The whole seconds a run lasted, as ``pastJobs`` records them."""
    return int((finished_at - utc(job[Job.STARTED_AT])).total_seconds())


def record_runs(
    past_jobs: Collection[Any],
    runs: Mapping[Any, tuple[str, int, dt.datetime]],
    session: ClientSession | None = None,
) -> None:
    """A record per run (job id -> its dataset, seconds and end) not recorded yet: the record's ``_id`` is its job's,
    so a pass redone never doubles one."""
    present = {document[ID] for document in past_jobs.find({ID: {"$in": list(runs)}}, {ID: 1}, session=session)}
    new = [
        {ID: job_id, PastJob.DATASET: dataset, PastJob.DURATION: seconds, PastJob.FINISHED_AT: finished_at}
        for job_id, (dataset, seconds, finished_at) in runs.items()
        if job_id not in present
    ]
    if new:
        past_jobs.insert_many(new, ordered=True, session=session)


def seconds_by_dataset(
    past_jobs: Collection[Any], datasets: Iterable[str], session: ClientSession | None = None
) -> dict[str, int]:
    """The seconds of runs recorded for each of ``datasets`` (the ones with none left out)."""
    return {
        row[ID]: row["seconds"]
        for row in past_jobs.aggregate(
            [
                {"$match": {PastJob.DATASET: {"$in": sorted(datasets)}}},
                {"$group": {ID: f"${PastJob.DATASET}", "seconds": {"$sum": f"${PastJob.DURATION}"}}},
            ],
            session=session,
        )
    }
