"""The indexes the pipeline's queries need, declared beside the documents they index, and the query shape that keeps to them.

Each index says which query needs it (``used_by``). Ours are named with our
prefix, so :func:`ensure_indexes` tells ours from the deployment's and never
touches an index it did not create; the ones the deployment declares too are
created exactly as its models create them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pymongo
from pymongo.collection import Collection

from zombie_pipeline.queue.audit_documents import Event, HeartbeatGaps, Quarantine, ScheduledRetry
from zombie_pipeline.queue.cache import Cache
from zombie_pipeline.queue.jobs import Job

INDEX_PREFIX = "zombie_pipeline_"


def on_index(
    index_part: Mapping[str, Any], rest: Mapping[str, Any], *stages: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """An aggregation matching ``index_part`` first, then ``rest``.

    MongoDB merges the two ``$match`` stages and plans them as one query; a server
    whose planner scans the whole collection for an ``$or`` or an ``$in`` (the
    embedded SecantusDB does, and a hint makes it slower still) keeps to the index
    for the first stage. Either way the cost follows the documents the index range
    holds, never the whole collection.
    """
    pipeline = [{"$match": dict(index_part)}]
    if rest:
        pipeline.append({"$match": dict(rest)})
    return pipeline + [dict(stage) for stage in stages]


@dataclass(frozen=True)
class IndexSpec:
    """An index one of our queries needs, and which query.

    ``as_deployment``: the deployment declares the same index; it is then
    created exactly as the deployment's own models would (default name, same
    options), so that their index creation finds it identical instead of
    failing on a conflict of names.
    """

    name: str
    keys: tuple[tuple[str, int], ...]
    used_by: str
    unique: bool = False
    as_deployment: bool = False
    #: The name the deployment gives the index where it names it (else the server's default name).
    deployment_name: str | None = None

    @property
    def full_name(self) -> str:
        if self.as_deployment:
            return self.deployment_name or "_".join(f"{key}_{direction}" for key, direction in self.keys)
        return INDEX_PREFIX + self.name

    def create(self, collection: Collection[Any]) -> str:
        """Create the index under :attr:`full_name`; its name.

        One the deployment declares is created with the options its models send (mongoengine adds
        ``background: false`` to every index), so that its startup finds the index identical: a server
        that compares options would otherwise refuse the deployment's own creation (``IndexKeySpecsConflict``).
        """
        options: dict[str, Any] = {"background": False} if self.as_deployment else {}
        if self.unique:  # in the deployment's order: some servers compare the options as written
            options["unique"] = True
        return collection.create_index(list(self.keys), name=self.full_name, **options)


JOB_INDEXES = (
    IndexSpec(
        "status_started_at",
        ((Job.STATUS, pymongo.ASCENDING), (Job.STARTED_AT, pymongo.ASCENDING)),
        "detection: started jobs older than the heartbeat timeout, and the stale-jobs sensor count",
    ),
    IndexSpec(
        "status_finished_at",
        ((Job.STATUS, pymongo.ASCENDING), (Job.FINISHED_AT, pymongo.ASCENDING)),
        "duration statistics: finished jobs of one day",
    ),
    IndexSpec(
        "unicity_id_status",
        ((Job.UNICITY_ID, pymongo.ASCENDING), (Job.STATUS, pymongo.ASCENDING)),
        "retries: is a waiting or started job already there for this unicity id",
    ),
)

#: The deployment declares both on its cache (every generation): created only where missing, which a
#: deployment's cache never is (a simulated or empty one may be).
CACHE_INDEXES = (
    IndexSpec(
        "key",
        tuple((field, pymongo.ASCENDING) for field in (Cache.KIND, Cache.DATASET, Cache.CONFIG, Cache.SPLIT)),
        "cache errors: an error entry is unique per key, as in the deployment",
        unique=True,
        as_deployment=True,
    ),
    IndexSpec(
        "dataset_kind",
        ((Cache.DATASET, pymongo.ASCENDING), (Cache.KIND, pymongo.ASCENDING), (Cache.HTTP_STATUS, pymongo.ASCENDING)),
        "cache errors and the cache check: a batch's entries in one read, by dataset then kind",
        as_deployment=True,
    ),
)
#: The deployment declares it from 2026 (``{"fields": ["kind", "updated_at", "dataset"], "name": "kind_updated"}``);
#: created by the statistics only when an operator asks (a production cache holds tens of millions of entries).
CACHE_UPDATED_INDEX = IndexSpec(
    "kind_updated",
    ((Cache.KIND, pymongo.ASCENDING), (Cache.UPDATED_AT, pymongo.ASCENDING), (Cache.DATASET, pymongo.ASCENDING)),
    "duration statistics where finished jobs are deleted: one day of one kind's cache entries",
    as_deployment=True,
    deployment_name="kind_updated",
)
EVENT_INDEXES = (
    IndexSpec(
        "state_lease",
        ((Event.STATE, pymongo.ASCENDING), (Event.LEASE_UNTIL, pymongo.ASCENDING)),
        "reconcile: unfinished events whose lease has expired",
    ),
    IndexSpec(
        "unicity_id",
        ((f"{Event.JOB}.{Job.UNICITY_ID}", pymongo.ASCENDING), (Event.FINALIZED_AT, pymongo.DESCENDING)),
        "statistics and retries: zombie history of one job",
    ),
    IndexSpec(
        "finalized_at",
        ((Event.FINALIZED_AT, pymongo.ASCENDING),),
        "statistics and repeat offenders: zombies of one day",
    ),
    IndexSpec(
        "compensation_state",
        ((Event.COMPENSATION_STATE, pymongo.ASCENDING),),
        "compensations: the ones still to run or to try again",
    ),
    IndexSpec(
        "dataset_type_finalized_at",
        (
            (f"{Event.JOB}.{Job.DATASET}", pymongo.ASCENDING),
            (f"{Event.JOB}.{Job.TYPE}", pymongo.ASCENDING),
            (Event.FINALIZED_AT, pymongo.ASCENDING),
        ),
        "quarantine: the recent crashes of one dataset and job type, and the jobs a quarantine withheld",
    ),
)


QUARANTINE_INDEXES = (
    IndexSpec(
        "dataset_job_type",
        ((Quarantine.DATASET, pymongo.ASCENDING), (Quarantine.JOB_TYPE, pymongo.ASCENDING)),
        "quarantine: one document per dataset and job type",
        unique=True,
    ),
)


HEARTBEAT_GAP_INDEXES = (
    IndexSpec(
        "day",
        ((HeartbeatGaps.DAY, pymongo.ASCENDING),),
        "heartbeat gaps: one day's documents for its daily tallies, and the days past the retention pruned",
    ),
)

RETRY_INDEXES = (
    IndexSpec(
        "state_due_at",
        ((ScheduledRetry.STATE, pymongo.ASCENDING), (ScheduledRetry.DUE_AT, pymongo.ASCENDING)),
        "delayed retries: the pending ones that are due",
    ),
)


def ensure_indexes(collection: Collection[Any], specs: Iterable[IndexSpec]) -> list[str]:
    """Create the missing indexes among ``specs``; return the names created.

    An index with the same keys already there (ours or the deployment's) is
    reused as it is; nothing is ever dropped or modified.
    """
    existing = collection.index_information()
    existing_keys = {tuple(info["key"]) for info in existing.values()}
    created = []
    for spec in specs:
        if spec.full_name in existing or _normalized(spec.keys) in {_normalized(k) for k in existing_keys}:
            continue
        try:
            spec.create(collection)
        except pymongo.errors.DuplicateKeyError:  # existing duplicates: the lookup still needs the index
            collection.create_index(list(spec.keys), name=spec.full_name)
        created.append(spec.full_name)
    return created


def _normalized(keys: Iterable[tuple[str, Any]]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (field, str(int(direction)) if isinstance(direction, (int, float)) else str(direction))
        for field, direction in keys
    )
