"""Finding the cache entries of a batch of jobs, in one indexed read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from zombie_pipeline.queue.documents import CACHE_KEY, Cache, cache_key_of_job
from zombie_pipeline.queue.indexes import on_index

_READ_BATCH = 10_000  # the entries of a batch come back in one reply


def key_of(document: Mapping[str, Any]) -> tuple:
    """The cache key of an entry, or of ``cache_key_of_job``'s result, as a tuple."""
    return tuple(document.get(name) for name in CACHE_KEY)


def entries_of_jobs(
    cache: Collection,
    jobs: Iterable[Mapping[str, Any]],
    projection: Mapping[str, Any],
    session: ClientSession | None = None,
) -> dict[tuple, dict[str, Any]]:
    """The current entry of each job that has one, by key: one read for the batch, whatever its job types.

    The datasets first, then the kinds (``mongo.on_index``): MongoDB plans the two as one range of the
    deployment's ``(dataset, kind, http_status)`` index; the embedded server reads the datasets' entries
    on that index and filters them (a single ``$in`` on both makes it scan the cache: docs/benchmarks.md).
    Type names are only ever values.
    """
    if any(projection.values()):  # fields named to be returned: the key must come back too
        projection = {**projection, **dict.fromkeys(CACHE_KEY, 1)}
    keys = {key_of(cache_key_of_job(job)) for job in jobs}
    if not keys:
        return {}
    datasets = sorted({dataset for _, dataset, _, _ in keys})
    kinds = sorted({kind for kind, _, _, _ in keys})
    pipeline = on_index(
        {Cache.DATASET: {"$in": datasets}}, {Cache.KIND: {"$in": kinds}}, {"$project": dict(projection)}
    )
    found: dict[tuple, dict[str, Any]] = {}
    for entry in cache.aggregate(pipeline, session=session, batchSize=_READ_BATCH):
        if key_of(entry) in keys:
            found[key_of(entry)] = entry
    return found
