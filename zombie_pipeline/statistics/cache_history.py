"""A period's durations read from the cache, where the queue deletes finished jobs (2023-12 on).

Each cache entry holds its latest run's ``duration`` (2024-07 on), ``http_status``
and ``error_code``, and ``updated_at`` says when that run ended: one duration per
artifact. The cache of a production deployment holds tens of millions of
entries, so a day is read one ``kind`` at a time on the deployment's own
``(kind, updated_at, ...)`` index, never by a scan; without that index the read
is refused, with the command that creates it (we never create an index on the
deployment's large collections unasked).

Our own zombies are counted from ``zombieEvents`` (:func:`tallies.tally_events`),
their entries skipped; an entry the deployment's own killer wrote counts as a
zombie too, and one stopped at the maximum duration is a censored duration.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pymongo.collection import Collection
from pymongoarrow.api import Schema, find_arrow_all

from zombie_pipeline.cleanup.cache_errors import DETAIL_JOB_ID
from zombie_pipeline.queue.documents import (
    HTTP_OK,
    Cache,
    ErrorCode,
    Reason,
    Status,
    as_utc,
)
from zombie_pipeline.queue.indexes import CACHE_UPDATED_INDEX
from zombie_pipeline.statistics.tallies import (
    EVENT_PROJECTION,
    READ_BATCH_SIZE,
    BadData,
    Period,
    durations_array,
    events_filter,
    is_job_type,
    tally_events,
)

_PROJECTION = {Cache.HTTP_STATUS: 1, Cache.ERROR_CODE: 1, Cache.DURATION: 1, f"{Cache.DETAILS}.{DETAIL_JOB_ID}": 1}
_SCHEMA = Schema(
    {
        Cache.HTTP_STATUS: pa.int64(),
        Cache.ERROR_CODE: pa.string(),
        Cache.DURATION: pa.float64(),
        Cache.DETAILS: pa.struct([(DETAIL_JOB_ID, pa.string())]),
    }
)
_REASON_OF_KILL = {ErrorCode.CRASHED: Reason.MISSING_HEARTBEAT, ErrorCode.EXCEEDED_MAX_DURATION: Reason.EXCEEDED_MAX_DURATION}


class CacheIndexMissing(RuntimeError):
    """The cache has no index to read a day by kind; the message says how to create it."""


def updated_index(cache: Collection) -> str | None:
    """The name of an index on ``(kind, updated_at, ...)``, if the cache has one."""
    for name, info in cache.index_information().items():
        if [key for key, _ in info["key"][:2]] == [Cache.KIND, Cache.UPDATED_AT]:
            return name
    return None


def ensure_updated_index(cache: Collection, create: bool) -> str:
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
    cache: Collection,
    events: Collection,
    start: dt.datetime,
    end: dt.datetime,
    batch_size: int = READ_BATCH_SIZE,
    create_index: bool = False,
) -> Period:
    """Tallies of the runs whose cache entry was last updated in ``[start, end)``, and of the zombies finalized then."""
    start, end = as_utc(start), as_utc(end)
    if start is None or end is None or not start < end:
        raise ValueError("read_cache_period needs two dates, start before end")
    index = ensure_updated_index(cache, create_index)
    period = Period(start=start, end=end, source="cache")
    tally_events(period, events.find(events_filter(start, end), EVENT_PROJECTION, batch_size=batch_size))
    for kind in sorted(value for value in cache.distinct(Cache.KIND) if isinstance(value, str)):
        query = {Cache.KIND: kind, Cache.UPDATED_AT: {"$gte": start, "$lt": end}}
        try:  # decoded straight into columns ...
            table = find_arrow_all(cache, query, schema=_SCHEMA, batch_size=batch_size, hint=index)
        except (TypeError, ValueError, OverflowError):  # ... unless a value does not fit them: then entry by entry
            _fold(period, kind, cache.find(query, _PROJECTION, batch_size=batch_size).hint(index))
        else:
            _fold_table(period, kind, table)
    return period


def _fold_table(period: Period, kind: str, table: pa.Table) -> None:
    """:func:`_fold`'s rules over a table of one kind's entries, on whole columns."""
    rows = table.num_rows
    period.jobs_read += rows
    if not rows:
        return
    if not is_job_type(kind):
        period.bad_data[BadData.INVALID_TYPE] += rows
        return
    duration = table[Cache.DURATION].combine_chunks()
    seconds = pc.fill_null(duration, np.nan).to_numpy(zero_copy_only=False).astype(np.float64)
    http = table[Cache.HTTP_STATUS].combine_chunks()
    ours = pc.is_valid(pc.struct_field(table[Cache.DETAILS].combine_chunks(), [0])).to_numpy(zero_copy_only=False)
    missing = pc.is_null(duration).to_numpy(zero_copy_only=False)
    invalid = ~missing & ~(np.isfinite(seconds) & (seconds >= 0))
    no_status = pc.is_null(http).to_numpy(zero_copy_only=False)
    period.bad_data.update(
        +Counter(
            {
                BadData.MISSING_DURATION: int(np.count_nonzero(missing)),
                BadData.INVALID_DURATION: int(np.count_nonzero(invalid)),
                BadData.INVALID_HTTP_STATUS: int(np.count_nonzero(~missing & ~invalid & no_status)),
            }
        )
    )
    counted = ~missing & ~invalid & ~no_status & ~ours  # our own error entries: counted from their events
    if not counted.any():
        return
    succeeded = (pc.fill_null(http, 0).to_numpy(zero_copy_only=False) == HTTP_OK) & counted
    codes = table[Cache.ERROR_CODE].combine_chunks()
    crashed = pc.fill_null(pc.equal(codes, ErrorCode.CRASHED.value), False).to_numpy(zero_copy_only=False) & counted
    exceeded = pc.fill_null(pc.equal(codes, ErrorCode.EXCEEDED_MAX_DURATION.value), False).to_numpy(zero_copy_only=False) & counted
    tally = period.tally(kind)
    tally.statuses.update(+Counter({Status.SUCCESS: int(np.count_nonzero(succeeded)), Status.ERROR: int(np.count_nonzero(counted & ~succeeded))}))
    tally.started += int(np.count_nonzero(counted))
    tally.zombies.update(+Counter({Reason.MISSING_HEARTBEAT: int(np.count_nonzero(crashed)), Reason.EXCEEDED_MAX_DURATION: int(np.count_nonzero(exceeded))}))
    killed = crashed | exceeded
    for name, chosen in (("success", succeeded & ~killed), ("error", counted & ~succeeded & ~killed), ("stopped", exceeded)):
        if chosen.any():
            setattr(tally, name, np.concatenate([getattr(tally, name), durations_array(seconds[chosen])]))


def _fold(period: Period, kind: str, entries: Any) -> None:
    """One kind's entries into its tally: success and error durations, kills, bad data."""
    success, error, stopped = [], [], []
    statuses = {Status.SUCCESS: 0, Status.ERROR: 0}
    started = 0
    zombies: dict[str, int] = {}
    for entry in entries:
        period.jobs_read += 1
        problem = _problem(kind, entry)
        if problem:
            period.bad_data[problem] += 1
            continue
        details = entry.get(Cache.DETAILS)
        if isinstance(details, Mapping) and DETAIL_JOB_ID in details:
            continue  # our own error entry: the zombie is counted from its event
        seconds = float(entry[Cache.DURATION])
        succeeded = entry[Cache.HTTP_STATUS] == HTTP_OK
        statuses[Status.SUCCESS if succeeded else Status.ERROR] += 1
        started += 1
        reason = _REASON_OF_KILL.get(entry.get(Cache.ERROR_CODE))
        if reason is not None:  # the deployment's own killer finished this run
            zombies[reason] = zombies.get(reason, 0) + 1
            if reason == Reason.EXCEEDED_MAX_DURATION:
                stopped.append(seconds)
        else:
            (success if succeeded else error).append(seconds)
    if not started:
        return
    tally = period.tally(kind)
    tally.statuses.update({status: count for status, count in statuses.items() if count})
    tally.started += started
    tally.zombies.update(zombies)
    for name, values in (("success", success), ("error", error), ("stopped", stopped)):
        if values:
            setattr(tally, name, np.concatenate([getattr(tally, name), durations_array(values)]))


def _problem(kind: str, entry: Mapping[str, Any]) -> str | None:
    if not is_job_type(kind):
        return BadData.INVALID_TYPE
    duration = entry.get(Cache.DURATION)
    if duration is None:
        return BadData.MISSING_DURATION
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not np.isfinite(duration) or duration < 0:
        return BadData.INVALID_DURATION
    if not isinstance(entry.get(Cache.HTTP_STATUS), int):
        return BadData.INVALID_HTTP_STATUS
    return None
