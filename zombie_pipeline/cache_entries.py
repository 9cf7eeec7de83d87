"""Finding the cache entries of a batch of jobs, in a few indexed queries."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from zombie_pipeline.documents import CACHE_KEY, Cache, cache_key_of_job

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
    """The current entry of each job that has one, by key: one query per job type.

    ``kind`` by equality keeps every query on the key index, also on servers whose
    planner scans the collection for an ``$in`` on the first field of an index.
    Type names are only ever values.
    """
    if any(projection.values()):  # fields named to be returned: the key must come back too
        projection = {**projection, **{name: 1 for name in CACHE_KEY}}
    keys = {key_of(cache_key_of_job(job)) for job in jobs}
    datasets_by_kind: dict[str, set[str]] = {}
    for kind, dataset, _, _ in keys:
        datasets_by_kind.setdefault(kind, set()).add(dataset)
    found: dict[tuple, dict[str, Any]] = {}
    for kind, datasets in sorted(datasets_by_kind.items()):
        query = {Cache.KIND: kind, Cache.DATASET: {"$in": sorted(datasets)}}
        for entry in cache.find(query, dict(projection), session=session).batch_size(_READ_BATCH):
            if key_of(entry) in keys:
                found[key_of(entry)] = entry
    return found
