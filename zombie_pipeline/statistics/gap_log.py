"""The heartbeat gaps a watcher saw, kept in ``zombieHeartbeatGaps``: small, exact, and written once per flush.

One document per (UTC day, job type, worker size) holds that day's :class:`~.gap_tallies.GapTally` (sparse
histograms, :mod:`.gap_histogram`); one more per (job type, worker size), of no day, holds the totals since the
first watch (the Prometheus histogram counts from it, so it never goes down). Days older than
:data:`RETENTION_DAYS` are removed by the first flush of each day: the storage is bounded by the job types, the
worker sizes and the retention, never by the traffic.

A flush is a set of ``$inc`` (and ``$max``) updates, each upserting its document, each **keyed by the flush's
id**: an update applies only where the document does not list that id yet, and lists it as it applies (the last
:data:`KEPT_FLUSHES`). So a flush sent again after a lost reply changes nothing it already changed: the document
that holds the id refuses the update (an upsert that then collides on the ``_id`` is answered by reading the
document: it holds the id, or another writer created it meanwhile and the update applies to it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pymongo import UpdateOne
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError

from zombie_pipeline.queue.audit_documents import HeartbeatGaps
from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.queue.store import Document, duplicate_indexes
from zombie_pipeline.statistics.gap_histogram import MalformedHistogram, bucket_field, histogram_of
from zombie_pipeline.statistics.gap_tallies import GapKey, GapPeriod, GapTally

#: Days kept: the longest statistics window (28 days) and two months to backfill its daily tallies.
RETENTION_DAYS = 90
#: Flush ids each document remembers: a flush is sent again right after its reply was lost, long before this many more.
KEPT_FLUSHES = 32

#: (ISO day or None for the totals, job type, worker size): a document's ``_id``.
LogKey = tuple[str | None, str, str]


@dataclass
class GapBatch:
    """What a flush writes: the tallies since the last one by (day, job type, worker size), under one id."""

    flush_id: str
    tallies: dict[LogKey, GapTally] = field(default_factory=dict)

    def tally(self, day: str, key: GapKey) -> GapTally:
        return self.tallies.setdefault((day, *key), GapTally())

    @property
    def empty(self) -> bool:
        return all(tally.empty for tally in self.tallies.values())


def _document_id(key: LogKey) -> dict[str, Any]:
    day, job_type, worker = key
    return {HeartbeatGaps.DAY: day, HeartbeatGaps.TYPE: job_type, HeartbeatGaps.WORKER: worker}


def _with_totals(batch: GapBatch) -> dict[LogKey, GapTally]:
    """The batch's days, and the totals each of its (job type, worker size) adds to."""
    tallies = dict(batch.tallies)
    for (_, job_type, worker), tally in batch.tallies.items():
        total = (None, job_type, worker)
        tallies[total] = tallies.get(total, GapTally()) + tally
    return tallies


def _update(tally: GapTally, flush_id: str, now: dt.datetime) -> dict[str, Any]:
    increments: dict[str, float] = {
        HeartbeatGaps.GAP_COUNT: tally.gaps.count,
        HeartbeatGaps.GAP_SECONDS: tally.gaps.total_seconds,
        HeartbeatGaps.FINISHED_COUNT: tally.finished.count,
        HeartbeatGaps.FINISHED_SECONDS: tally.finished.total_seconds,
        HeartbeatGaps.PARTLY_WATCHED: tally.partly_watched,
        HeartbeatGaps.FINALIZED: tally.finalized,
        HeartbeatGaps.ENDED_UNSEEN: tally.ended_unseen,
        HeartbeatGaps.UNOBSERVED: tally.unobserved,
    }
    for parent, histogram in ((HeartbeatGaps.GAPS, tally.gaps), (HeartbeatGaps.FINISHED, tally.finished)):
        increments.update({bucket_field(parent, key): count for key, count in histogram.counts.items()})
    update: dict[str, Any] = {
        "$push": {HeartbeatGaps.FLUSHES: {"$each": [flush_id], "$slice": -KEPT_FLUSHES}},
        "$set": {HeartbeatGaps.UPDATED_AT: now},
    }
    if any(increments.values()):
        update["$inc"] = {name: value for name, value in increments.items() if value}
    longest = {HeartbeatGaps.LONGEST_GAP: tally.gaps.longest, HeartbeatGaps.LONGEST_FINISHED: tally.finished.longest}
    if any(longest.values()):
        update["$max"] = {name: value for name, value in longest.items() if value}
    return update


def write_batch(collection: Collection[Document], batch: GapBatch, now: dt.datetime) -> int:
    """Apply the batch once, however many times it is sent; the documents it changed this time."""
    keyed = [(key, tally) for key, tally in _with_totals(batch).items() if not tally.empty]
    if not keyed:
        return 0
    updates = [
        UpdateOne(
            {ID: _document_id(key), HeartbeatGaps.FLUSHES: {"$ne": batch.flush_id}},
            {**_update(tally, batch.flush_id, now), "$setOnInsert": _document_id(key)},
            upsert=True,
        )
        for key, tally in keyed
    ]
    try:
        result = collection.bulk_write(updates, ordered=False)
        return result.modified_count + result.upserted_count
    except BulkWriteError as error:
        collided = duplicate_indexes(error)  # any other error is raised
        changed = error.details.get("nModified", 0) + error.details.get("nUpserted", 0)
    for index in sorted(collided):  # the document exists: it holds this flush, or another writer just created it
        key, tally = keyed[index]
        found = collection.update_one(
            {ID: _document_id(key), HeartbeatGaps.FLUSHES: {"$ne": batch.flush_id}},
            _update(tally, batch.flush_id, now),
        )
        changed += found.modified_count
    return int(changed)


def prune(collection: Collection[Document], today: dt.date) -> int:
    """Remove the days older than :data:`RETENTION_DAYS` before ``today`` (never the totals); how many documents."""
    oldest = (today - dt.timedelta(days=RETENTION_DAYS)).isoformat()
    return collection.delete_many({HeartbeatGaps.DAY: {"$lt": oldest}}).deleted_count


def _tallies(documents: Iterator[Mapping[str, Any]], period: GapPeriod) -> GapPeriod:
    for document in documents:
        try:
            key, tally = _read(document)
        except (MalformedHistogram, KeyError, TypeError):
            period.malformed += 1
            continue
        period.tallies[key] = period.tally(key) + tally
    return period


def _read(document: Mapping[str, Any]) -> tuple[GapKey, GapTally]:
    job_type, worker = document[HeartbeatGaps.TYPE], document[HeartbeatGaps.WORKER]
    if not isinstance(job_type, str) or not isinstance(worker, str):
        raise TypeError("type or worker is not a string")
    counts = [
        document.get(name, 0)
        for name in (
            HeartbeatGaps.PARTLY_WATCHED,
            HeartbeatGaps.FINALIZED,
            HeartbeatGaps.ENDED_UNSEEN,
            HeartbeatGaps.UNOBSERVED,
        )
    ]
    if any(isinstance(count, bool) or not isinstance(count, int) or count < 0 for count in counts):
        raise TypeError("a count is not a whole number")
    tally = GapTally(
        gaps=histogram_of(
            document.get(HeartbeatGaps.GAPS),
            document.get(HeartbeatGaps.GAP_SECONDS, 0.0),
            document.get(HeartbeatGaps.LONGEST_GAP, 0.0),
        ),
        finished=histogram_of(
            document.get(HeartbeatGaps.FINISHED),
            document.get(HeartbeatGaps.FINISHED_SECONDS, 0.0),
            document.get(HeartbeatGaps.LONGEST_FINISHED, 0.0),
        ),
        partly_watched=counts[0],
        finalized=counts[1],
        ended_unseen=counts[2],
        unobserved=counts[3],
    )
    return (job_type, worker), tally


_PROJECTION = {HeartbeatGaps.FLUSHES: 0}


def read_day(collection: Collection[Document], day: dt.date) -> GapPeriod:
    """The tallies of one UTC day, by the ``day`` index; documents that cannot be read are counted, not raised."""
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    period = GapPeriod(start=start, end=start + dt.timedelta(days=1))
    return _tallies(collection.find({HeartbeatGaps.DAY: day.isoformat()}, _PROJECTION), period)


def read_days(collection: Collection[Document], start: dt.datetime, end: dt.datetime) -> GapPeriod:
    """The tallies of the whole UTC days within ``[start, end)``, read in one range of the ``day`` index."""
    first = start.date() if start.time() == dt.time() else start.date() + dt.timedelta(days=1)
    days = {HeartbeatGaps.DAY: {"$gte": first.isoformat(), "$lt": end.date().isoformat()}}
    return _tallies(collection.find(days, _PROJECTION), GapPeriod(start=start, end=end))


def read_totals(collection: Collection[Document]) -> GapPeriod:
    """The tallies since the first watch (the documents of no day)."""
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    return _tallies(
        collection.find({HeartbeatGaps.DAY: None}, _PROJECTION), GapPeriod(start=epoch, end=dt.datetime.now(dt.UTC))
    )
