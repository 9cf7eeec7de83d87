"""A period's durations read from the finished jobs, where the queue keeps them (before 2023-12).

Finished jobs are read by ``(status, finished_at)``, one finished status of the
queue's generation at a time (a job of any other status is counted once per
window, over the whole collection: :func:`count_undated_jobs`), projected to the
few fields needed and read in batches. Each batch is read once into columns
(Arrow, through ``pymongoarrow``), checked and timed on whole arrays, and folded
into the period's tallies; a status whose documents hold a value that does not
fit a column is read as documents instead, each judged by :func:`classify_job`.
Memory grows with the jobs of the period only, by four bytes per job.
"""

from __future__ import annotations

import datetime as dt
import itertools
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bson import ObjectId
from pymongo.collection import Collection
from pymongoarrow.api import Schema, find_arrow_all
from pymongoarrow.types import ObjectIdType

from zombie_pipeline.queue.audit_documents import ZombieEvent
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.jobs import FINISHED_STATUSES, ID, STATUSES, Job, JobDocument, Status
from zombie_pipeline.queue.times import as_utc, utc
from zombie_pipeline.statistics.tallies import (
    EVENT_PROJECTION,
    READ_BATCH_SIZE,
    Audited,
    BadData,
    Period,
    durations_array,
    is_job_type,
    tally_events,
)
from zombie_pipeline.trail import finalized_events

#: Jobs that may finish without ever starting: no duration, but not bad data.
NEVER_STARTED_STATUSES = frozenset({Status.CANCELLED, Status.SKIPPED})

_JOB_PROJECTION = {ID: 1, Job.TYPE: 1, Job.STATUS: 1, Job.STARTED_AT: 1, Job.FINISHED_AT: 1}


def statuses_to_read(generation: QueueGeneration | None = None) -> list[str]:
    """The finished statuses ``generation`` declares (without one, those of every generation).

    Reading one status at a time keeps each query an equality plus a range on the
    ``(status, finished_at)`` index on any server, so that a day examines only its
    own jobs; jobs of any other status are counted by :func:`count_undated_jobs`.
    """
    return sorted(_declared(generation) & FINISHED_STATUSES)


def _declared(generation: QueueGeneration | None) -> frozenset[str]:
    return STATUSES if generation is None else generation.statuses


def finished_jobs_filter(status: Any, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Jobs of one status finished in ``[start, end)``: bounded on the ``(status, finished_at)`` index."""
    return {Job.STATUS: status, Job.FINISHED_AT: {"$gte": start, "$lt": end}}


def _batches(documents: Iterable[Mapping[str, Any]], size: int) -> Iterator[list[Mapping[str, Any]]]:
    """Lists of up to ``size`` documents; ``islice`` keeps the per-document loop out of Python code."""
    iterator = iter(documents)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _date_problem(value: Any) -> str | None:
    if value is None:
        return BadData.MISSING_STARTED_AT
    if isinstance(value, str):
        return BadData.STARTED_AT_AS_STRING
    if as_utc(value) is None:
        return BadData.STARTED_AT_NOT_A_DATE
    return None


def classify_job(job: Mapping[str, Any]) -> tuple[str, str, float | None] | str:
    """``(type, status, seconds)`` of a finished job, or the :class:`BadData` reason to skip it.

    ``seconds`` is None for a job cancelled or skipped before it started. This
    is the rule; :func:`_classify` applies it to a whole batch at once, and
    calls it for the odd documents its array checks leave aside.
    """
    status = job.get(Job.STATUS)
    if not isinstance(status, str) or status not in FINISHED_STATUSES:  # an array would not even hash
        return BadData.UNKNOWN_STATUS
    job_type = job.get(Job.TYPE)
    if not is_job_type(job_type):
        return BadData.INVALID_TYPE
    started_at = job.get(Job.STARTED_AT)
    if started_at is None and status in NEVER_STARTED_STATUSES:
        return job_type, status, None
    problem = _date_problem(started_at)
    if problem:
        return problem
    finished_at = as_utc(job.get(Job.FINISHED_AT))
    if finished_at is None:  # the date-range query only returns dates; guard for other callers
        return (
            BadData.FINISHED_AT_AS_STRING if isinstance(job.get(Job.FINISHED_AT), str) else BadData.MISSING_FINISHED_AT
        )
    seconds = (finished_at - utc(started_at)).total_seconds()
    if seconds < 0:
        return BadData.FINISHED_BEFORE_STARTED
    return job_type, status, seconds


_NONE = type(None)


_TZINFO = operator.attrgetter("tzinfo")


_ID = operator.itemgetter(ID)


#: Stands for every value that cannot be hashed (a list or a document where a string belongs).
_UNHASHABLE = object()


#: The tally array each status's durations go to; other statuses keep no duration.
_DURATIONS_OF_STATUS = {Status.SUCCESS: "success", Status.ERROR: "error"}


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return _UNHASHABLE
    return value


def _codes(documents: Sequence[Mapping[str, Any]], name: str) -> tuple[np.ndarray, list[Any]]:
    """A field of every document as codes into its distinct values: rules are then asked once per distinct value.

    Values that cannot be hashed share one stand-in: whatever they hold,
    they are not a job type or a status.
    """
    distinct: dict[Any, int] = {}
    try:
        codes = [distinct.setdefault(document.get(name), len(distinct)) for document in documents]
    except TypeError:
        distinct = {}
        codes = [distinct.setdefault(_hashable(document.get(name)), len(distinct)) for document in documents]
    return np.fromiter(codes, dtype=np.intp, count=len(codes)), list(distinct)


@dataclass
class _Batch:
    """A batch of job documents as columns: each field read once; types and statuses as codes."""

    documents: Sequence[Mapping[str, Any]]
    types: np.ndarray  # codes into type_names
    type_names: list[Any]
    statuses: np.ndarray  # codes into status_names
    status_names: list[Any]
    started: list[Any]  # the values as stored
    finished: list[Any]

    @classmethod
    def of(cls, documents: Sequence[Mapping[str, Any]]) -> _Batch:
        types, type_names = _codes(documents, Job.TYPE)
        statuses, status_names = _codes(documents, Job.STATUS)
        started = [document.get(Job.STARTED_AT) for document in documents]
        finished = [document.get(Job.FINISHED_AT) for document in documents]
        return cls(documents, types, type_names, statuses, status_names, started, finished)

    def type_is(self, rule: Callable[[Any], bool]) -> np.ndarray:
        return _holds(self.types, self.type_names, rule)

    def status_is(self, rule: Callable[[Any], bool]) -> np.ndarray:
        return _holds(self.statuses, self.status_names, rule)


def _holds(codes: np.ndarray, distinct: list[Any], rule: Callable[[Any], bool]) -> np.ndarray:
    """``rule`` of each value, asked once per distinct value."""
    held: np.ndarray = np.fromiter(map(rule, distinct), dtype=bool, count=len(distinct))[codes]
    return held


def _of_type(values: list[Any], kind: type) -> np.ndarray:
    """Which values are exactly of ``kind``; a subclass is left to :func:`classify_job`."""
    exactly: np.ndarray = np.fromiter(map(type, values), dtype=object, count=len(values)) == kind
    return exactly


def _seconds_between(started: list[dt.datetime], finished: list[dt.datetime]) -> np.ndarray | None:
    """``finished - started`` in seconds, as :func:`classify_job` computes it from UTC dates.

    Python subtracts two dates of one time zone on their wall clocks, which is
    UTC arithmetic only for a fixed offset (or naive dates, read as UTC): with
    a zone that has daylight saving, or a naive date beside an aware one, the
    answer is None and the caller falls back to :func:`classify_job`. Dates
    of two zones are converted to UTC by Python, so the zones of ``started``
    alone tell.
    """
    zones = set(map(_TZINFO, started))
    if not all(zone is None or zone.utcoffset(None) is not None for zone in zones):
        return None
    try:
        deltas = map(operator.sub, finished, started)
        return np.fromiter(map(dt.timedelta.total_seconds, deltas), dtype=np.float64, count=len(started))
    except TypeError:  # naive beside aware
        return None


def _classify(batch: _Batch) -> tuple[np.ndarray, np.ndarray, Counter[Any]]:
    """:func:`classify_job` over a batch: which documents count, their seconds (NaN: never started), the bad data.

    The common documents (a type, a finished status, and two dates, or no
    start for a status that may never start) are checked and timed on whole
    arrays; any other document, rare, goes through :func:`classify_job` itself.
    """
    named = batch.type_is(is_job_type) & batch.status_is(FINISHED_STATUSES.__contains__)
    timed = named & _of_type(batch.started, dt.datetime) & _of_type(batch.finished, dt.datetime)
    never_started = named & batch.status_is(NEVER_STARTED_STATUSES.__contains__)
    never_started[never_started] = _of_type([batch.started[index] for index in np.flatnonzero(never_started)], _NONE)
    seconds = np.full(len(batch.documents), np.nan)
    selected = timed.tolist()
    started, finished = (list(itertools.compress(dates, selected)) for dates in (batch.started, batch.finished))
    durations = _seconds_between(started, finished)
    if durations is None:
        timed[:] = False
    else:
        seconds[timed] = durations
    backwards = seconds < 0  # False for NaN
    valid = (timed & ~backwards) | never_started
    bad_data = Counter({BadData.FINISHED_BEFORE_STARTED: int(np.count_nonzero(backwards))})
    for index in np.flatnonzero(~(timed | never_started)):
        outcome = classify_job(batch.documents[int(index)])
        if isinstance(outcome, str):
            bad_data[outcome] += 1
        else:
            valid[index] = True
            seconds[index] = np.nan if outcome[2] is None else outcome[2]
    return valid, seconds, +bad_data


def _audited_rows(batch: _Batch, valid: np.ndarray, audited: Audited, found: set[Any]) -> np.ndarray:
    """Which valid jobs are audited zombies (their job's duration is not a run's); each is added to ``found``."""
    rows = np.flatnonzero(valid)
    marked = np.zeros(len(batch.documents), dtype=bool)
    if not audited:
        return marked
    ids = map(_ID, itertools.compress(batch.documents, valid.tolist()))
    marked[rows[np.fromiter(map(audited.__contains__, ids), dtype=bool, count=len(rows))]] = True
    found.update(batch.documents[int(row)][ID] for row in np.flatnonzero(marked))
    return marked


def _groups(codes: np.ndarray, values: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """``(code, its values)`` for each code present; values keep their order."""
    order = np.argsort(codes, kind="stable")
    codes, values = codes[order], values[order]
    starts = np.flatnonzero(np.diff(codes, prepend=-1))
    return zip(codes[starts].tolist(), np.split(values, starts[1:]))


class _Pieces:
    """Durations gathered batch by batch and joined once per tally: appending at each batch would copy it each time."""

    def __init__(self) -> None:
        self._pieces: dict[tuple[str, str], list[np.ndarray]] = {}

    def add(self, job_type: str, kind: str, seconds: Iterable[float] | np.ndarray) -> None:
        self._pieces.setdefault((job_type, kind), []).append(durations_array(seconds))

    def join_into(self, period: Period) -> None:
        for (job_type, kind), pieces in self._pieces.items():
            tally = period.tally(job_type)
            setattr(tally, kind, np.concatenate([getattr(tally, kind), *pieces]))


@dataclass
class _Columns:
    """A batch of jobs as the counting needs it, however it was read: codes, masks and seconds."""

    types: np.ndarray  # codes into type_names
    type_names: list[Any]
    statuses: np.ndarray  # codes into status_names
    status_names: list[Any]
    valid: np.ndarray  # counted: a job type, a finished status, and usable dates (or none, never started)
    seconds: np.ndarray  # NaN: never started
    audited: np.ndarray  # audited zombies: stopped at T2 (their duration comes from the event) or crashed (none)


def _fold(period: Period, pieces: _Pieces, batch: _Batch, audited: Audited, found: set[Any]) -> None:
    """Count one batch of documents (the rules of :func:`classify_job`, on arrays where they can be)."""
    valid, seconds, bad_data = _classify(batch)
    period.bad_data.update(bad_data)
    zombies = _audited_rows(batch, valid, audited, found)
    _count(
        period,
        pieces,
        _Columns(batch.types, batch.type_names, batch.statuses, batch.status_names, valid, seconds, zombies),
    )


def _count(period: Period, pieces: _Pieces, columns: _Columns) -> None:
    """Count jobs per (type, status), jobs started per type, and gather their durations.

    An audited zombie counts as started, without a duration here: stopped for
    exceeding T2, its duration is in ``stopped`` already, from its event; crashed,
    it has none that means anything.
    """
    valid, seconds, audited = columns.valid, columns.seconds, columns.audited
    ran = ~np.isnan(seconds)
    width = len(columns.status_names)
    pairs = np.bincount(
        columns.types[valid] * width + columns.statuses[valid], minlength=len(columns.type_names) * width
    )
    pairs = pairs.reshape(len(columns.type_names), width)
    started = np.bincount(columns.types[valid & (ran | audited)], minlength=len(columns.type_names))
    for code in np.flatnonzero(pairs.sum(axis=1)):
        tally = period.tally(columns.type_names[code])
        tally.statuses.update({status: int(count) for status, count in zip(columns.status_names, pairs[code]) if count})
        tally.started += int(started[code])
    timed = valid & ran & ~audited
    for status_code, status in enumerate(columns.status_names):
        kind = _DURATIONS_OF_STATUS.get(status)
        if kind is None:
            continue
        chosen = timed & (columns.statuses == status_code)
        for type_code, values in _groups(columns.types[chosen], seconds[chosen]):
            pieces.add(columns.type_names[type_code], kind, values)


_JOB_SCHEMA = Schema(
    {ID: ObjectIdType(), Job.TYPE: pa.string(), Job.STARTED_AT: pa.timestamp("ms"), Job.FINISHED_AT: pa.timestamp("ms")}
)


def _arrow_table(jobs: Collection[JobDocument], query: Mapping[str, Any], batch_size: int) -> pa.Table | None:
    """The query's jobs decoded straight into columns, or None when a value does not fit them (a date stored
    as a string, a type that is a number ...): those documents then go through the rules one by one."""
    try:
        return find_arrow_all(jobs, dict(query), schema=_JOB_SCHEMA, batch_size=batch_size)
    except (TypeError, ValueError, OverflowError):
        return None


def _table_columns(period: Period, table: pa.Table, status: Any, audited: Audited, found: set[Any]) -> _Columns | None:
    """:func:`classify_job`'s rules over a table of jobs of one ``status``, on whole columns; the bad data counted."""
    rows = table.num_rows
    if not isinstance(status, str) or status not in FINISHED_STATUSES:
        if rows:
            period.bad_data[BadData.UNKNOWN_STATUS] += rows
        return None
    encoded = table[Job.TYPE].combine_chunks().dictionary_encode()
    type_names = [*encoded.dictionary.to_pylist(), None]  # the last code: no type at all
    types = pc.fill_null(encoded.indices, len(type_names) - 1).to_numpy(zero_copy_only=False).astype(np.intp)
    typed = np.fromiter(map(is_job_type, type_names), dtype=bool, count=len(type_names))[types]
    started, has_start = _milliseconds(table[Job.STARTED_AT])
    finished, has_finish = _milliseconds(table[Job.FINISHED_AT])
    never_started = typed & ~has_start & (status in NEVER_STARTED_STATUSES)
    timed = typed & has_start & has_finish
    seconds = np.full(rows, np.nan)
    seconds[timed] = (finished[timed] - started[timed]) / 1_000.0
    backwards = timed & (seconds < 0)
    valid = (timed & ~backwards) | never_started
    period.bad_data.update(
        +Counter(
            {
                BadData.INVALID_TYPE: int(np.count_nonzero(~typed)),
                BadData.MISSING_STARTED_AT: int(np.count_nonzero(typed & ~has_start & ~never_started)),
                BadData.MISSING_FINISHED_AT: int(np.count_nonzero(typed & has_start & ~has_finish)),
                BadData.FINISHED_BEFORE_STARTED: int(np.count_nonzero(backwards)),
            }
        )
    )
    zombies = np.zeros(rows, dtype=bool)
    if audited:
        ids = table[ID].combine_chunks().storage
        known = pa.array([job_id.binary for job_id in audited], type=ids.type)
        zombies = pc.is_in(ids, value_set=known).to_numpy(zero_copy_only=False) & valid
        found.update(ObjectId(ids[int(row)].as_py()) for row in np.flatnonzero(zombies))
    return _Columns(types, type_names, np.zeros(rows, dtype=np.intp), [status], valid, seconds, zombies)


def _milliseconds(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A timestamp column as int64 milliseconds, and where it holds a value."""
    values = pc.cast(column.combine_chunks(), pa.int64())
    present = pc.is_valid(values).to_numpy(zero_copy_only=False)
    return pc.fill_null(values, 0).to_numpy(zero_copy_only=False), present


def read_period(
    jobs: Collection[JobDocument],
    events: Collection[ZombieEvent],
    start: dt.datetime,
    end: dt.datetime,
    batch_size: int = READ_BATCH_SIZE,
    generation: QueueGeneration | None = None,
) -> Period:
    """Tallies of the jobs finished and the zombies finalized in ``[start, end)``.

    The jobs read are those of the finished statuses ``generation`` declares
    (:func:`statuses_to_read`).

    One status at a time, the jobs are decoded straight into columns (Arrow); a
    status whose documents hold a value that does not fit a column is read as
    documents instead, and each one judged by :func:`classify_job`: bad data is
    counted by its reason, never a crash.
    """
    period_start, period_end = as_utc(start), as_utc(end)
    if period_start is None or period_end is None or not period_start < period_end:
        raise ValueError("read_period needs two dates, start before end")
    start, end = period_start, period_end
    period = Period(start=start, end=end)
    audited = tally_events(period, finalized_events(events, start, end, EVENT_PROJECTION, batch_size))
    pieces, found = _Pieces(), set[Any]()
    for status in statuses_to_read(generation):
        query = finished_jobs_filter(status, start, end)
        table = _arrow_table(jobs, query, batch_size)
        if table is None:
            documents = jobs.find(query, _JOB_PROJECTION, batch_size=batch_size)
            for batch in _batches(documents, batch_size):
                period.jobs_read += len(batch)
                _fold(period, pieces, _Batch.of(batch), audited, found)
            continue
        period.jobs_read += table.num_rows
        columns = _table_columns(period, table, status, audited, found)
        if columns is not None:
            _count(period, pieces, columns)
    return _close(period, pieces, audited, found)


def tally_jobs(
    period: Period,
    documents: Iterable[Mapping[str, Any]],
    audited: Audited | None = None,
    batch_size: int = READ_BATCH_SIZE,
) -> Period:
    """Fold the period's finished jobs into its tallies, a batch at a time, as :func:`classify_job` rules.

    A job audited as stopped for exceeding T2 is counted once: its duration is
    already in ``stopped``, never also in ``error``; one audited as a crash has no
    duration at all. An audited job whose
    document is gone (TTL) counts as started and ended in error.
    """
    audited = audited or {}
    pieces, found = _Pieces(), set[Any]()
    for batch in _batches(documents, batch_size):
        period.jobs_read += len(batch)
        _fold(period, pieces, _Batch.of(batch), audited, found)
    return _close(period, pieces, audited, found)


def _close(period: Period, pieces: _Pieces, audited: Audited, found: set[Any]) -> Period:
    """The gathered durations joined into the tallies; audited zombies whose job is gone (TTL) counted too."""
    pieces.join_into(period)
    for job_id, (job_type, _) in audited.items():
        if job_id not in found:
            period.tally(job_type).started += 1
            period.tally(job_type).statuses[Status.ERROR] += 1
    return period


def count_undated_jobs(jobs: Collection[JobDocument], generation: QueueGeneration | None = None) -> Counter[Any]:
    """Jobs no daily read holds, over the whole collection: finished jobs without a date to place them in a day
    (no ``finished_at``, or a string), and jobs whose status ``generation`` does not declare.

    Each count is bounded on the ``(status, finished_at)`` index. Which odd
    statuses exist is asked once here, per window, rather than in every daily
    partition: ``distinct`` walks the index on MongoDB (``DISTINCT_SCAN``), but
    the embedded SecantusDB scans the collection for it.
    """
    counts: Counter[Any] = Counter()
    for status in statuses_to_read(generation):
        counts[BadData.MISSING_FINISHED_AT] += jobs.count_documents({Job.STATUS: status, Job.FINISHED_AT: None})
        counts[BadData.FINISHED_AT_AS_STRING] += jobs.count_documents(
            {Job.STATUS: status, Job.FINISHED_AT: {"$type": "string"}}
        )
    declared = _declared(generation)
    odd = [
        value
        for value in jobs.distinct(Job.STATUS)
        if value is not None and not (isinstance(value, str) and value in declared)
    ]
    # None: no status, or a null one. One query, so that a job whose status is an array of odd values counts once.
    counts[BadData.UNKNOWN_STATUS] += jobs.count_documents({Job.STATUS: {"$in": [None, *odd]}})
    return +counts  # drop the zeros
