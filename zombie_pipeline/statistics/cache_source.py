"""A period's durations read from the cache, where the queue deletes finished jobs (2023-12 on).

Each cache entry holds its latest run's ``duration`` (2024-07 on), ``http_status``
and ``error_code``, and ``updated_at`` says when that run ended: one duration per
artifact. The cache of a production deployment holds tens of millions of
entries, so a day is read one ``kind`` at a time on the deployment's own
``(kind, updated_at, ...)`` index, never by a scan; without that index the read
is refused, with the command that creates it (we never create an index on the
deployment's large collections unasked).

Every entry gets one reason, whatever its neighbours hold: the server computes
each entry's row (the BSON type of its kind and duration, the duration as a
double only when it is a number, the status only when it is an integer), so
every value decodes into its column and one rule, :func:`_fold_table`, judges
it. Entries whose kind is not a job type (missing, null, not a string, not a
name) are counted in the day too, by an indexed equality on each such value.

Our own zombies are counted from ``zombieEvents`` (:func:`tallies.tally_events`),
their entries skipped; an entry the deployment's own killer wrote counts as a
zombie too, and one stopped at the maximum duration is a censored duration.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pymongo.collection import Collection
from pymongoarrow.api import Schema, aggregate_arrow_all

from zombie_pipeline.queue.audit_documents import ZombieEvent
from zombie_pipeline.queue.cache import HTTP_OK, Cache, CacheEntry, ErrorCode
from zombie_pipeline.queue.cache_entries import DETAIL_JOB_ID
from zombie_pipeline.queue.indexes import CACHE_UPDATED_INDEX, on_index
from zombie_pipeline.queue.jobs import Status
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.store import aggregate_rows
from zombie_pipeline.queue.times import as_utc
from zombie_pipeline.statistics.tallies import (
    EVENT_PROJECTION,
    READ_BATCH_SIZE,
    BadData,
    Period,
    durations_array,
    is_job_type,
    tally_events,
)
from zombie_pipeline.trail import finalized_events

# The columns of an entry's row, as the server computes them.
_KIND_TYPE = "kind_type"
_DURATION_TYPE = "duration_type"
_SECONDS = "seconds"
_OURS = "ours"
#: ``$type`` of a field that is absent, or null: no duration at all.
_NO_VALUE = pa.array(["missing", "null"])
#: The longest duration a tally holds (float32); NaN, infinities and negative numbers fail ``0 <= seconds <=`` it too.
_LONGEST = float(np.finfo(np.float32).max)


def _type_of(name: str) -> dict[str, Any]:
    return {"$type": f"${name}"}


def _where(condition: dict[str, Any], value: Any) -> dict[str, Any]:
    return {"$cond": [condition, value, None]}


#: One entry as the rules read it, a projection the server computes (MongoDB 4.4 on). Given the stored values,
#: pymongoarrow would decode a NaN duration as null, a boolean as 1.0, and fail on a string or a decimal: the
#: types tell those apart, and no value can fail to fit its column.
_ROW = {
    "_id": 0,
    _KIND_TYPE: _type_of(Cache.KIND),  # "string", or "array" for an entry holding several kinds
    _DURATION_TYPE: _type_of(Cache.DURATION),
    _SECONDS: _where(
        {"$isNumber": f"${Cache.DURATION}"},
        {"$convert": {"input": f"${Cache.DURATION}", "to": "double", "onError": None}},
    ),
    Cache.HTTP_STATUS: _where({"$in": [_type_of(Cache.HTTP_STATUS), ["int", "long"]]}, f"${Cache.HTTP_STATUS}"),
    Cache.ERROR_CODE: _where({"$eq": [_type_of(Cache.ERROR_CODE), "string"]}, f"${Cache.ERROR_CODE}"),
    _OURS: {"$eq": [_type_of(f"{Cache.DETAILS}.{DETAIL_JOB_ID}"), "string"]},  # our error entries name their job
}
_SCHEMA = Schema(
    {
        _KIND_TYPE: pa.string(),
        _DURATION_TYPE: pa.string(),
        _SECONDS: pa.float64(),
        Cache.HTTP_STATUS: pa.int64(),
        Cache.ERROR_CODE: pa.string(),
        _OURS: pa.bool_(),
    }
)


class CacheIndexMissing(RuntimeError):
    """The cache has no index to read a day by kind; the message says how to create it."""


def updated_index(cache: Collection[CacheEntry]) -> str | None:
    """The name of an index on ``(kind, updated_at, ...)``, if the cache has one."""
    for name, info in cache.index_information().items():
        if [key for key, _ in info["key"][:2]] == [Cache.KIND, Cache.UPDATED_AT]:
            return name
    return None


def ensure_updated_index(cache: Collection[CacheEntry], create: bool) -> str:
    """The index the read needs: found, or created as the deployment declares it when the operator asked."""
    name = updated_index(cache)
    if name is not None:
        return name
    if create:
        return CACHE_UPDATED_INDEX.create(cache)
    keys = ", ".join(f"{key}: 1" for key, _ in CACHE_UPDATED_INDEX.keys)
    raise CacheIndexMissing(
        f"the cache {cache.full_name} has no index on (kind, updated_at): reading a day of durations would scan every "
        f"entry. Create the index the deployment declares from 2026 (db.{cache.name}.createIndex({{{keys}}}, "
        f"{{name: '{CACHE_UPDATED_INDEX.full_name}'}})), or let the statistics create it (create_cache_index: true)."
    )


def read_cache_period(
    cache: Collection[CacheEntry],
    events: Collection[ZombieEvent],
    start: dt.datetime,
    end: dt.datetime,
    batch_size: int = READ_BATCH_SIZE,
    create_index: bool = False,
) -> Period:
    """Tallies of the runs whose cache entry was last updated in ``[start, end)``, and of the zombies finalized then."""
    period_start, period_end = as_utc(start), as_utc(end)
    if period_start is None or period_end is None or not period_start < period_end:
        raise ValueError("read_cache_period needs two dates, start before end")
    start, end = period_start, period_end
    ensure_updated_index(cache, create_index)  # the planner takes it: an equality on kind, a range on updated_at
    period = Period(start=start, end=end, source="cache")
    tally_events(period, finalized_events(events, start, end, EVENT_PROJECTION, batch_size))
    values = cache.distinct(
        Cache.KIND
    )  # each value once, by the server's equality (MongoDB: 1 and 1.0 are one, true another)
    for kind in sorted(value for value in values if is_job_type(value)):
        table = aggregate_arrow_all(cache, [*entries_of(kind, start, end), {"$project": _ROW}], schema=_SCHEMA)
        _fold_table(period, kind, table)
    for value in [value for value in values if value is not None and not is_job_type(value)] + [None]:
        counted = aggregate_rows(cache, [*entries_of(value, start, end), {"$count": "n"}])  # None: no kind, or null
        unnamed = next(counted, {"n": 0})["n"]
        period.jobs_read += unnamed
        period.bad_data.update(+Counter({BadData.INVALID_TYPE: unnamed}))
    return period


def entries_of(kind: Any, start: dt.datetime, end: dt.datetime) -> list[dict[str, Any]]:
    """The stages matching the entries of one ``kind`` value updated in ``[start, end)``.

    First an equality and a range that the server serves from the ``(kind, updated_at)`` index (a hint
    costs the embedded server 0.1 s a query, and MongoDB's planner takes that index for such a query).
    An entry whose kind is an array matches the query of each value it holds (and ``distinct`` lists
    each): the ``$expr``, a second stage checked on the entries the index found, keeps it in the query of
    its least value only, so that it is counted once.
    """
    return on_index(
        {Cache.KIND: kind, Cache.UPDATED_AT: {"$gte": start, "$lt": end}},
        {"$expr": {"$eq": [{"$min": f"${Cache.KIND}"}, {"$literal": kind}]}},
    )


def _fold_table(period: Period, kind: str, table: pa.Table) -> None:
    """One kind's entries into its tally: success and error durations, kills, and each entry left out by its reason.

    In this order: a kind that is an array (``invalid_type``); no duration, or a
    null one (``missing_duration``); a duration that is not a number of
    seconds a tally holds: NaN, an infinity, negative, a boolean, a string ...
    (``invalid_duration``); a status that is not an integer
    (``invalid_http_status``).
    """
    rows = table.num_rows
    period.jobs_read += rows
    if not rows:
        return
    named = _flags(pc.equal(table[_KIND_TYPE].combine_chunks(), "string"))
    no_value = _flags(pc.is_in(table[_DURATION_TYPE].combine_chunks(), value_set=_NO_VALUE))
    seconds = pc.fill_null(table[_SECONDS].combine_chunks(), np.nan).to_numpy(zero_copy_only=False).astype(np.float64)
    timed = (seconds >= 0) & (seconds <= _LONGEST)  # False for NaN, which a NaN duration arrives as
    http = table[Cache.HTTP_STATUS].combine_chunks()
    no_status = _flags(pc.is_null(http))
    period.bad_data.update(
        +Counter(
            {
                BadData.INVALID_TYPE: int(np.count_nonzero(~named)),
                BadData.MISSING_DURATION: int(np.count_nonzero(named & no_value)),
                BadData.INVALID_DURATION: int(np.count_nonzero(named & ~no_value & ~timed)),
                BadData.INVALID_HTTP_STATUS: int(np.count_nonzero(named & timed & no_status)),
            }
        )
    )
    counted = named & timed & ~no_status & ~_flags(table[_OURS].combine_chunks())  # our own entries: from their events
    if not counted.any():
        return
    succeeded = (pc.fill_null(http, 0).to_numpy(zero_copy_only=False) == HTTP_OK) & counted
    codes = table[Cache.ERROR_CODE].combine_chunks()
    crashed = _flags(pc.equal(codes, ErrorCode.CRASHED.value)) & counted
    exceeded = _flags(pc.equal(codes, ErrorCode.EXCEEDED_MAX_DURATION.value)) & counted
    tally = period.tally(kind)
    tally.statuses.update(
        +Counter(
            {
                Status.SUCCESS: int(np.count_nonzero(succeeded)),
                Status.ERROR: int(np.count_nonzero(counted & ~succeeded)),
            }
        )
    )
    tally.started += int(np.count_nonzero(counted))
    tally.zombies.update(
        +Counter(
            {
                Reason.MISSING_HEARTBEAT: int(np.count_nonzero(crashed)),
                Reason.EXCEEDED_MAX_DURATION: int(np.count_nonzero(exceeded)),
            }
        )
    )
    killed = crashed | exceeded  # the deployment's own killer finished these runs
    for name, chosen in (
        ("success", succeeded & ~killed),
        ("error", counted & ~succeeded & ~killed),
        ("stopped", exceeded),
    ):
        if chosen.any():
            setattr(tally, name, np.concatenate([getattr(tally, name), durations_array(seconds[chosen])]))


def _flags(column: pa.Array) -> np.ndarray:
    """A boolean column as a numpy array, null read as False."""
    flags: np.ndarray = pc.fill_null(column, False).to_numpy(zero_copy_only=False)
    return flags
