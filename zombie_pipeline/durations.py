"""How long each job type runs, and which maximum duration (T2) the data supports.

Reading. A period (one UTC day for a Dagster partition, or any window) is read
with indexed queries: finished jobs by ``(status, finished_at)``, one status at
a time, and audit events by ``finalized_at``, each projected to the few fields
needed and read in batches. Each batch is read once into columns, checked and
timed on whole arrays, and folded into a :class:`Tally` per job type; memory
grows with the jobs of the period only, by four bytes per job.

Storing durations, and why exactly. A tally keeps the durations themselves,
as float32 arrays (success, error, stopped-for-exceeding-T2), rather than a
histogram or a quantile sketch: combining days is then a concatenation, and the
window's percentiles are *exact* (float32 has a 24-bit mantissa: below 8192 s
the rounding is under a millisecond, the precision of BSON dates; at one day it
is 8 ms). A week of a million successful jobs a day is 28 MB. If a deployment
outgrows that, the tally is the one place to swap in a log-binned histogram.

Percentiles are the linear interpolation between order statistics (pandas'
and numpy's default, Hyndman-Fan type 7).

Suggesting T2 (see :func:`suggest`): the configured quantile of the successful
durations, times a safety margin, rounded up to a readable value
(:func:`readable_round_up`), never below the heartbeat timeout. Only successful
durations are used: error durations include the hangs a T2 is there to catch.
Below ``min_samples`` successes the suggestion is "not enough data" and the
current T2 stays. The quantile gets a distribution-free confidence interval
from order statistics (:func:`quantile_interval`).

Censoring: a job stopped at T2 never finished, so its true duration is only
known to be longer. Stopped jobs are the audited ``exceeded_max_duration``
zombies plus error jobs that ran at least the current T2 (stopped by an earlier
killer, such as the deployment's own). When they are at least ``1 - quantile``
of the jobs (by default), the true quantile may lie beyond T2: the suggestion is
flagged as a lower bound, never lowers T2, and the advice is to raise T2 and
measure again.

Backtest, beside each suggestion: how many of the window's successful jobs ran
longer than the suggested T2 (they would have been killed), and for the stopped
jobs, how many would have been stopped sooner and how many seconds of worker
time that saves (or, for a higher T2, how many would have been given more time).

The latest suggestions are kept in ``zombieT2Suggestions`` (one document per
window); the cleanup opts in through :func:`policy_with_suggestions`.

No Dagster here: the assets in ``orchestration/assets.py`` call these functions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
from pymongo.collection import Collection

from zombie_pipeline.documents import (
    FINISHED_STATUSES,
    ID,
    REASONS,
    STATUSES,
    Event,
    EventState,
    Job,
    Reason,
    Status,
    T2Suggestion,
    as_utc,
)
from zombie_pipeline.policy import ZombiePolicy

DEFAULT_WINDOW_DAYS = 7
DEFAULT_QUANTILE = 0.99
DEFAULT_MARGIN = 1.5
DEFAULT_MIN_SAMPLES = 30
DEFAULT_CONFIDENCE = 0.95
READ_BATCH_SIZE = 5_000
#: The percentiles every report shows, beside the mean and the maximum.
PERCENTILES = (0.50, 0.90, 0.95, 0.99)
#: Jobs that may finish without ever starting: no duration, but not bad data.
NEVER_STARTED_STATUSES = frozenset({Status.CANCELLED, Status.SKIPPED})
#: (upper bound in seconds, step in seconds) of :func:`readable_round_up`.
READABLE_STEPS = ((600, 30), (1_800, 60), (7_200, 300), (43_200, 900), (math.inf, 3_600))

_DURATIONS = np.float32
_EMPTY = np.empty(0, dtype=_DURATIONS)


class BadData:
    """Why a document was left out of the statistics; each is counted in the report."""

    UNKNOWN_STATUS = "unknown_status"
    MISSING_TYPE = "missing_type"
    MISSING_STARTED_AT = "missing_started_at"
    STARTED_AT_AS_STRING = "started_at_stored_as_string"
    STARTED_AT_NOT_A_DATE = "started_at_not_a_date"
    FINISHED_BEFORE_STARTED = "finished_before_started"
    # Undated: no day can hold these jobs, so they are counted over the whole collection.
    MISSING_FINISHED_AT = "missing_finished_at"
    FINISHED_AT_AS_STRING = "finished_at_stored_as_string"
    INCOMPLETE_AUDIT_EVENT = "incomplete_audit_event"


# --- what a period holds ---------------------------------------------------------


def _durations(values: Iterable[float] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=_DURATIONS).ravel()


@dataclass
class Tally:
    """One job type over one period; tallies of several periods add up exactly."""

    statuses: Counter = field(default_factory=Counter)  # final status -> jobs
    started: int = 0  # jobs that ran: a valid start, or an audited zombie whose job is gone
    success: np.ndarray = field(default_factory=lambda: _EMPTY)  # seconds, float32
    error: np.ndarray = field(default_factory=lambda: _EMPTY)  # errors not audited as exceeded
    killed: np.ndarray = field(default_factory=lambda: _EMPTY)  # audited exceeded_max_duration: ran this long
    zombies: Counter = field(default_factory=Counter)  # reason -> audited zombies

    def __add__(self, other: "Tally") -> "Tally":
        return Tally.total([self, other])

    @classmethod
    def total(cls, tallies: Sequence["Tally"]) -> "Tally":
        """The tallies as one, each array joined once: adding them in turn would copy the running total every time."""
        return cls(
            statuses=sum((Counter(tally.statuses) for tally in tallies), Counter()),
            started=sum(tally.started for tally in tallies),
            success=np.concatenate([_EMPTY, *(tally.success for tally in tallies)]),
            error=np.concatenate([_EMPTY, *(tally.error for tally in tallies)]),
            killed=np.concatenate([_EMPTY, *(tally.killed for tally in tallies)]),
            zombies=sum((Counter(tally.zombies) for tally in tallies), Counter()),
        )

    def stopped_at(self, max_duration_seconds: float) -> np.ndarray:
        """Durations of the jobs stopped for running too long: audited, or errors that reached T2."""
        return np.concatenate([self.killed, self.error[self.error >= max_duration_seconds]])


@dataclass
class Period:
    """Tallies per job type over ``[start, end)``, with the documents left out."""

    start: dt.datetime
    end: dt.datetime
    tallies: dict[str, Tally] = field(default_factory=dict)
    bad_data: Counter = field(default_factory=Counter)
    jobs_read: int = 0
    events_read: int = 0

    def tally(self, job_type: str) -> Tally:
        return self.tallies.setdefault(job_type, Tally())


def combine(periods: Iterable[Period]) -> Period:
    """The periods as one: counts added, durations concatenated, so percentiles stay exact."""
    periods = sorted(periods, key=lambda period: period.start)
    if not periods:
        raise ValueError("combine needs at least one period")
    result = Period(start=periods[0].start, end=max(period.end for period in periods))
    by_type: dict[str, list[Tally]] = {}
    for period in periods:
        for job_type, tally in period.tallies.items():
            by_type.setdefault(job_type, []).append(tally)
        result.bad_data += Counter(period.bad_data)
        result.jobs_read += period.jobs_read
        result.events_read += period.events_read
    result.tallies = {job_type: Tally.total(tallies) for job_type, tallies in by_type.items()}
    return result


# --- reading ---------------------------------------------------------------------

_JOB_PROJECTION = {ID: 1, Job.TYPE: 1, Job.STATUS: 1, Job.STARTED_AT: 1, Job.FINISHED_AT: 1}
_EVENT_PROJECTION = {
    ID: 1,
    Event.REASON: 1,
    Event.FINALIZED_AT: 1,
    f"{Event.JOB}.{Job.TYPE}": 1,
    f"{Event.JOB}.{Job.STARTED_AT}": 1,
}


def statuses_to_read(jobs: Collection) -> list[Any]:
    """The finished statuses, any unknown status present, and None (missing or null).

    Reading one status at a time keeps each query an equality plus a range on the
    ``(status, finished_at)`` index on any server; unknown statuses are read so
    that they are counted, not silently ignored.
    """
    present = jobs.distinct(Job.STATUS)
    unknown = {value for value in present if isinstance(value, str)} - STATUSES
    return sorted(FINISHED_STATUSES) + sorted(unknown) + [None]


def finished_jobs_filter(status: Any, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Jobs of one status finished in ``[start, end)``: bounded on the ``(status, finished_at)`` index."""
    return {Job.STATUS: status, Job.FINISHED_AT: {"$gte": start, "$lt": end}}


def events_filter(start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Zombies finalized in ``[start, end)``; a claim that lost its race never reaches these states."""
    return {
        Event.FINALIZED_AT: {"$gte": start, "$lt": end},
        Event.STATE: {"$in": [EventState.FINALIZED, EventState.DONE]},
    }


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
    if not isinstance(job_type, str) or not job_type:
        return BadData.MISSING_TYPE
    started_at = job.get(Job.STARTED_AT)
    if started_at is None and status in NEVER_STARTED_STATUSES:
        return job_type, status, None
    problem = _date_problem(started_at)
    if problem:
        return problem
    finished_at = as_utc(job.get(Job.FINISHED_AT))
    if finished_at is None:  # the date-range query only returns dates; guard for other callers
        return BadData.FINISHED_AT_AS_STRING if isinstance(job.get(Job.FINISHED_AT), str) else BadData.MISSING_FINISHED_AT
    seconds = (finished_at - as_utc(started_at)).total_seconds()
    if seconds < 0:
        return BadData.FINISHED_BEFORE_STARTED
    return job_type, status, seconds


_NONE = type(None)
_TZINFO = operator.attrgetter("tzinfo")
_ID = operator.itemgetter(ID)
#: Stands for every value that cannot be hashed (a list or a document where a string belongs).
_UNHASHABLE = object()
#: Job id -> (type, reason) of the zombies audited in a period; they are few.
_Audited = Mapping[Any, tuple[str, str]]
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
    def of(cls, documents: Sequence[Mapping[str, Any]]) -> "_Batch":
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
    return np.fromiter(map(rule, distinct), dtype=bool, count=len(distinct))[codes]


def _is_job_type(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _of_type(values: list[Any], kind: type) -> np.ndarray:
    """Which values are exactly of ``kind``; a subclass is left to :func:`classify_job`."""
    return np.fromiter(map(type, values), dtype=object, count=len(values)) == kind


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


def _classify(batch: _Batch) -> tuple[np.ndarray, np.ndarray, Counter]:
    """:func:`classify_job` over a batch: which documents count, their seconds (NaN: never started), the bad data.

    The common documents (a type, a finished status, and two dates, or no
    start for a status that may never start) are checked and timed on whole
    arrays; any other document, rare, goes through :func:`classify_job` itself.
    """
    named = batch.type_is(_is_job_type) & batch.status_is(FINISHED_STATUSES.__contains__)
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
        outcome = classify_job(batch.documents[index])
        if isinstance(outcome, str):
            bad_data[outcome] += 1
        else:
            valid[index] = True
            seconds[index] = np.nan if outcome[2] is None else outcome[2]
    return valid, seconds, +bad_data


def _stopped_at_t2(batch: _Batch, valid: np.ndarray, audited: _Audited, found: set[Any]) -> np.ndarray:
    """Which valid jobs are audited as stopped for exceeding T2; every valid audited job is added to ``found``."""
    stopped = np.zeros(len(batch.documents), dtype=bool)
    if not audited:
        return stopped
    rows = np.flatnonzero(valid)
    ids = map(_ID, itertools.compress(batch.documents, valid.tolist()))
    for row in rows[np.fromiter(map(audited.__contains__, ids), dtype=bool, count=len(rows))]:
        job_id = batch.documents[row][ID]
        found.add(job_id)
        stopped[row] = audited[job_id][1] == Reason.EXCEEDED_MAX_DURATION
    return stopped


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
        self._pieces.setdefault((job_type, kind), []).append(_durations(seconds))

    def join_into(self, period: Period) -> None:
        for (job_type, kind), pieces in self._pieces.items():
            tally = period.tally(job_type)
            setattr(tally, kind, np.concatenate([getattr(tally, kind), *pieces]))


def _fold(period: Period, pieces: _Pieces, batch: _Batch, audited: _Audited, found: set[Any]) -> None:
    """Count one batch of jobs per (type, status), jobs started per type, and gather their durations.

    A job audited as stopped for exceeding T2 already has its duration in
    ``killed``, from its event: it counts as started, without a duration here.
    """
    valid, seconds, bad_data = _classify(batch)
    period.bad_data.update(bad_data)
    stopped = _stopped_at_t2(batch, valid, audited, found)
    ran = ~np.isnan(seconds)
    width = len(batch.status_names)
    pairs = np.bincount(batch.types[valid] * width + batch.statuses[valid], minlength=len(batch.type_names) * width)
    pairs = pairs.reshape(len(batch.type_names), width)
    started = np.bincount(batch.types[valid & (ran | stopped)], minlength=len(batch.type_names))
    for code in np.flatnonzero(pairs.sum(axis=1)):
        tally = period.tally(batch.type_names[code])
        tally.statuses.update({status: int(count) for status, count in zip(batch.status_names, pairs[code]) if count})
        tally.started += int(started[code])
    timed = valid & ran & ~stopped
    for status_code, status in enumerate(batch.status_names):
        kind = _DURATIONS_OF_STATUS.get(status)
        if kind is None:
            continue
        chosen = timed & (batch.statuses == status_code)
        for code, values in _groups(batch.types[chosen], seconds[chosen]):
            pieces.add(batch.type_names[code], kind, values)


def read_period(
    jobs: Collection,
    events: Collection,
    start: dt.datetime,
    end: dt.datetime,
    batch_size: int = READ_BATCH_SIZE,
) -> Period:
    """Tallies of the jobs finished and the zombies finalized in ``[start, end)``."""
    start, end = as_utc(start), as_utc(end)
    if start is None or end is None or not start < end:
        raise ValueError("read_period needs two dates, start before end")
    period = Period(start=start, end=end)
    audited = tally_events(period, events.find(events_filter(start, end), _EVENT_PROJECTION, batch_size=batch_size))
    cursors = (
        jobs.find(finished_jobs_filter(status, start, end), _JOB_PROJECTION, batch_size=batch_size)
        for status in statuses_to_read(jobs)
    )
    return tally_jobs(period, itertools.chain.from_iterable(cursors), audited, batch_size)


def tally_events(period: Period, events: Iterable[Mapping[str, Any]]) -> _Audited:
    """Count the period's audited zombies; return ``job id -> (type, reason)`` for :func:`tally_jobs`.

    The duration of a job stopped for exceeding T2 comes from its event, which
    outlives the job document's 7-day TTL.
    """
    audited: dict[Any, tuple[str, str]] = {}  # zombies are few
    for event in events:
        period.events_read += 1
        snapshot = event.get(Event.JOB) if isinstance(event.get(Event.JOB), Mapping) else {}
        job_type, reason = snapshot.get(Job.TYPE), event.get(Event.REASON)
        if not isinstance(job_type, str) or not job_type or reason not in REASONS:
            period.bad_data[BadData.INCOMPLETE_AUDIT_EVENT] += 1
            continue
        if reason == Reason.EXCEEDED_MAX_DURATION:
            started_at, finalized_at = as_utc(snapshot.get(Job.STARTED_AT)), as_utc(event.get(Event.FINALIZED_AT))
            if started_at is None or finalized_at is None or finalized_at < started_at:
                period.bad_data[BadData.INCOMPLETE_AUDIT_EVENT] += 1
                continue
            tally = period.tally(job_type)
            tally.killed = np.concatenate([tally.killed, _durations([(finalized_at - started_at).total_seconds()])])
        period.tally(job_type).zombies[reason] += 1
        audited[event[ID]] = (job_type, reason)
    return audited


def tally_jobs(
    period: Period,
    documents: Iterable[Mapping[str, Any]],
    audited: _Audited | None = None,
    batch_size: int = READ_BATCH_SIZE,
) -> Period:
    """Fold the period's finished jobs into its tallies, a batch at a time, as :func:`classify_job` rules.

    A job audited as stopped for exceeding T2 is counted once: its duration is
    already in ``killed``, never also in ``error``. An audited job whose
    document is gone (TTL) counts as started and ended in error.
    """
    audited = audited or {}
    pieces, found = _Pieces(), set()
    for batch in _batches(documents, batch_size):
        period.jobs_read += len(batch)
        _fold(period, pieces, _Batch.of(batch), audited, found)
    pieces.join_into(period)
    for job_id, (job_type, _) in audited.items():
        if job_id not in found:
            period.tally(job_type).started += 1
            period.tally(job_type).statuses[Status.ERROR] += 1
    return period


def count_undated_jobs(jobs: Collection) -> Counter:
    """Finished jobs no day can hold (no ``finished_at``, or a string), over the whole collection.

    Each count is bounded on the ``(status, finished_at)`` index.
    """
    counts: Counter = Counter()
    for status in sorted(FINISHED_STATUSES):
        counts[BadData.MISSING_FINISHED_AT] += jobs.count_documents({Job.STATUS: status, Job.FINISHED_AT: None})
        counts[BadData.FINISHED_AT_AS_STRING] += jobs.count_documents(
            {Job.STATUS: status, Job.FINISHED_AT: {"$type": "string"}}
        )
    return +counts  # drop the zeros


# --- statistics ------------------------------------------------------------------


def percentile_name(quantile: float) -> str:
    """``0.99`` -> ``"p99"``, ``0.995`` -> ``"p99.5"``."""
    return "p" + f"{quantile * 100:.4f}".rstrip("0").rstrip(".")


def success_statistics(durations: np.ndarray) -> dict[str, float | int | None]:
    """Count, mean, :data:`PERCENTILES` and max; None for each value when there are no durations."""
    values = pd.Series(durations, dtype="float64")
    names = [percentile_name(q) for q in PERCENTILES]
    if values.empty:
        return {"count": 0, "mean": None, **{name: None for name in names}, "max": None}
    quantiles = values.quantile(list(PERCENTILES))
    return {
        "count": int(values.size),
        "mean": float(values.mean()),
        **{name: float(quantiles.loc[q]) for name, q in zip(names, PERCENTILES)},
        "max": float(values.max()),
    }


def binomial_cdf(n: int, p: float, counts: range | None = None) -> np.ndarray:
    """``P(B <= k)`` for ``k`` in ``counts`` (all of ``0..n`` by default), ``B ~ Binomial(n, p)``; log-space.

    Given a range that leaves out only tails of negligible mass
    (:func:`_likely_counts`), the probabilities are those within the range and
    cost its length rather than n: at a million durations, a few thousand.
    """
    counts = range(n + 1) if counts is None else counts
    k = np.arange(counts.start, counts.stop - 1, dtype=np.float64)
    steps = np.log(n - k) - np.log(k + 1) + math.log(p) - math.log1p(-p)
    log_pmf = np.concatenate([[0.0], np.cumsum(steps)])  # up to a constant: normalized below
    pmf = np.exp(log_pmf - log_pmf.max())
    return np.minimum(np.cumsum(pmf) / pmf.sum(), 1.0)


def _likely_counts(n: int, p: float) -> range:
    """The counts of ``Binomial(n, p)`` outside which lies less than 1e-30 of its mass.

    Thirteen standard deviations and 50 on each side of the mean: Bernstein's
    inequality bounds each tail by ``exp(-75)``.
    """
    spread = 13 * math.sqrt(n * p * (1 - p)) + 50
    return range(max(0, math.floor(n * p - spread)), min(n, math.ceil(n * p + spread)) + 1)


def quantile_interval(
    sorted_durations: np.ndarray, quantile: float, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float | None, float | None]:
    """A distribution-free confidence interval for a quantile, from order statistics.

    ``[X(l), X(u)]`` covers the true quantile with probability at least
    ``confidence``, the ranks chosen from the binomial law of how many
    durations fall below it. A side is None when the data cannot bound it
    (an upper bound for p99 needs a few hundred durations). Both ranks lie
    among the :func:`_likely_counts`, the only ones computed.
    """
    n = len(sorted_durations)
    if n == 0:
        return None, None
    alpha = 1.0 - confidence
    counts = _likely_counts(n, quantile)
    cdf = binomial_cdf(n, quantile, counts)  # P(fewer than k+1 durations below the quantile), k in counts
    ranks = np.arange(counts.start, counts.stop)
    low_ranks = ranks[(ranks < n) & (cdf <= alpha / 2)]  # l - 1 with P(B <= l-1) <= alpha/2
    high_ranks = ranks[(ranks < n) & (cdf >= 1 - alpha / 2)]  # u - 1 with P(B <= u-1) >= 1-alpha/2
    low = float(sorted_durations[low_ranks[-1]]) if len(low_ranks) else None
    high = float(sorted_durations[high_ranks[0]]) if len(high_ranks) else None
    return low, high


def readable_round_up(seconds: float) -> int:
    """Up to a value an operator reads at a glance, at most about 17 % above ``seconds``.

    Multiples of 30 s up to 10 min, of 1 min up to 30 min, of 5 min up to 2 h,
    of 15 min up to 12 h, then of 1 h. Decimal 1-2-5 steps would overshoot by
    up to 100 %, and durations are read in minutes anyway.
    """
    if seconds <= 0:
        return 0
    for upper, step in READABLE_STEPS:
        if seconds <= upper:
            return int(math.ceil(seconds / step - 1e-9) * step)
    raise AssertionError("unreachable: the last step has no upper bound")


# --- suggestions -----------------------------------------------------------------


@dataclass(frozen=True)
class SuggestionRules:
    """How a suggestion is derived; validated, so a bad setting fails before anything is read."""

    quantile: float = DEFAULT_QUANTILE
    margin: float = DEFAULT_MARGIN
    min_samples: int = DEFAULT_MIN_SAMPLES
    confidence: float = DEFAULT_CONFIDENCE
    censored_fraction: float | None = None  # None: 1 - quantile

    def __post_init__(self) -> None:
        problems = []
        if not 0.5 <= self.quantile < 1:
            problems.append(f"quantile must be in [0.5, 1), got {self.quantile!r}")
        if not self.margin >= 1:
            problems.append(f"margin must be at least 1, got {self.margin!r}")
        if not isinstance(self.min_samples, int) or self.min_samples < 1:
            problems.append(f"min_samples must be a positive integer, got {self.min_samples!r}")
        if not 0 < self.confidence < 1:
            problems.append(f"confidence must be in (0, 1), got {self.confidence!r}")
        if self.censored_fraction is not None and not 0 < self.censored_fraction < 1:
            problems.append(f"censored_fraction must be in (0, 1) or unset, got {self.censored_fraction!r}")
        if problems:
            raise ValueError("invalid suggestion rules: " + "; ".join(problems))

    @property
    def censoring_threshold(self) -> float:
        """Stopped jobs from this share on may hide the quantile itself beyond T2."""
        return self.censored_fraction if self.censored_fraction is not None else 1.0 - self.quantile

    def as_dict(self) -> dict[str, Any]:
        return {
            "quantile": self.quantile,
            "margin": self.margin,
            "min_samples": self.min_samples,
            "confidence": self.confidence,
            "censored_fraction": self.censoring_threshold,
        }


@dataclass
class TypeReport:
    """Statistics, suggestion, backtest and flags of one job type over the window."""

    job_type: str
    statuses: dict[str, int]
    started: int
    statistics: dict[str, float | int | None]
    zombies: dict[str, int]
    current_t2_seconds: int
    suggested_t2_seconds: int
    enough_data: bool
    quantile_seconds: float | None
    quantile_low_seconds: float | None
    quantile_high_seconds: float | None
    stopped_at_t2: int
    stopped_share: float | None
    censored: bool
    backtest_successes_killed: int
    backtest_successes_killed_share: float | None
    backtest_stopped_sooner: int
    backtest_seconds_saved: float
    backtest_given_more_time: int
    flags: list[str]
    success_durations: np.ndarray = field(repr=False, default_factory=lambda: _EMPTY)
    stopped_durations: np.ndarray = field(repr=False, default_factory=lambda: _EMPTY)

    @property
    def successes(self) -> int:
        return int(self.statistics["count"] or 0)

    @property
    def zombie_count(self) -> int:
        return sum(self.zombies.values())

    @property
    def zombie_rate(self) -> float | None:
        return self.zombie_count / self.started if self.started else None

    @property
    def change(self) -> str:
        """``keep``, ``raise`` or ``lower``: what the suggestion does to the current T2."""
        if self.suggested_t2_seconds > self.current_t2_seconds:
            return "raise"
        if self.suggested_t2_seconds < self.current_t2_seconds:
            return "lower"
        return "keep"

    def as_record(self, quantile: float) -> dict[str, Any]:
        """One flat row: the CSV line, the JSON entry."""
        q = percentile_name(quantile)
        return {
            "type": self.job_type,
            **{f"jobs_{status}": self.statuses.get(status, 0) for status in sorted(FINISHED_STATUSES)},
            "started": self.started,
            **{f"success_{name}": value for name, value in self.statistics.items()},
            **{f"zombies_{reason}": self.zombies.get(reason, 0) for reason in REASONS},
            "zombie_rate": self.zombie_rate,
            "current_t2_seconds": self.current_t2_seconds,
            "suggested_t2_seconds": self.suggested_t2_seconds,
            "change": self.change,
            "enough_data": self.enough_data,
            f"{q}_seconds": self.quantile_seconds,
            f"{q}_low_seconds": self.quantile_low_seconds,
            f"{q}_high_seconds": self.quantile_high_seconds,
            "stopped_at_t2": self.stopped_at_t2,
            "stopped_share": self.stopped_share,
            "censored": self.censored,
            "backtest_successes_killed": self.backtest_successes_killed,
            "backtest_successes_killed_share": self.backtest_successes_killed_share,
            "backtest_stopped_sooner": self.backtest_stopped_sooner,
            "backtest_seconds_saved": self.backtest_seconds_saved,
            "backtest_given_more_time": self.backtest_given_more_time,
            "flags": "; ".join(self.flags),
        }


def suggest(
    job_type: str,
    tally: Tally,
    current_t2_seconds: int,
    heartbeat_timeout_seconds: int,
    rules: SuggestionRules = SuggestionRules(),
) -> TypeReport:
    """The suggested T2 of one type, with its evidence (see the module docstring for the rules)."""
    success = np.sort(tally.success)
    stopped = tally.stopped_at(current_t2_seconds)
    statistics = success_statistics(success)
    n = len(success)
    enough_data = n >= rules.min_samples
    q_value = float(pd.Series(success, dtype="float64").quantile(rules.quantile)) if n else None
    low, high = quantile_interval(success, rules.quantile, rules.confidence)
    stopped_share = len(stopped) / (n + len(stopped)) if n + len(stopped) else None
    censored = bool(len(stopped)) and stopped_share >= rules.censoring_threshold
    flags = []
    if enough_data:
        suggested = max(readable_round_up(q_value * rules.margin), heartbeat_timeout_seconds)
        if suggested == heartbeat_timeout_seconds:
            flags.append("at the heartbeat-timeout floor")
        if censored and suggested < current_t2_seconds:
            suggested = current_t2_seconds  # a lower bound cannot justify cutting a tail we never saw
    else:
        suggested = current_t2_seconds
        flags.append(f"not enough data: {n} successful jobs, {rules.min_samples} needed; current T2 kept")
    if censored:
        flags.append(
            f"censored: {len(stopped)} jobs ({stopped_share:.1%}) were stopped at the current T2, their true "
            "durations unknown; the suggestion is a lower bound: raise T2 and measure again"
        )
    killed_successes = int(np.count_nonzero(success > suggested))
    sooner = stopped[stopped > suggested]
    return TypeReport(
        job_type=job_type,
        statuses=dict(tally.statuses),
        started=tally.started,
        statistics=statistics,
        zombies=dict(tally.zombies),
        current_t2_seconds=int(current_t2_seconds),
        suggested_t2_seconds=int(suggested),
        enough_data=enough_data,
        quantile_seconds=q_value,
        quantile_low_seconds=low,
        quantile_high_seconds=high,
        stopped_at_t2=int(len(stopped)),
        stopped_share=stopped_share,
        censored=censored,
        backtest_successes_killed=killed_successes,
        backtest_successes_killed_share=killed_successes / n if n else None,
        backtest_stopped_sooner=int(len(sooner)),
        backtest_seconds_saved=float(np.sum(sooner.astype(np.float64) - suggested)),
        backtest_given_more_time=int(np.count_nonzero(stopped <= suggested)) if suggested > current_t2_seconds else 0,
        flags=flags,
        success_durations=success,
        stopped_durations=np.sort(stopped),
    )


@dataclass
class DurationReport:
    """Everything a report shows about one window."""

    window_start: dt.datetime
    window_end: dt.datetime
    computed_at: dt.datetime
    rules: SuggestionRules
    heartbeat_timeout_seconds: int
    default_t2_seconds: int
    configured_t2_by_type: dict[str, int]
    types: list[TypeReport]
    bad_data: dict[str, int]
    missing_days: list[str] = field(default_factory=list)
    jobs_read: int = 0
    events_read: int = 0

    def type_report(self, job_type: str) -> TypeReport:
        for report in self.types:
            if report.job_type == job_type:
                return report
        raise KeyError(job_type)

    def records(self) -> list[dict[str, Any]]:
        return [report.as_record(self.rules.quantile) for report in self.types]

    def statistics_frame(self) -> pd.DataFrame:
        """One row per job type: the table written to CSV (with its header even when empty)."""
        columns = list(suggest("", Tally(), 1, 1, self.rules).as_record(self.rules.quantile))
        return pd.DataFrame.from_records(self.records(), columns=columns)

    def suggested_max_durations(self) -> dict[str, int]:
        """T2 per type where the data was enough; other types keep their current T2."""
        return {report.job_type: report.suggested_t2_seconds for report in self.types if report.enough_data}

    def policy_max_durations(self) -> dict[str, int]:
        """The complete ``max_duration_seconds_by_type`` to configure: overrides kept, suggestions applied.

        The mapping replaces the configured one, so types without a suggestion keep their override.
        """
        return dict(sorted({**self.configured_t2_by_type, **self.suggested_max_durations()}.items()))


def analyze(
    period: Period,
    policy: ZombiePolicy,
    rules: SuggestionRules = SuggestionRules(),
    undated: Mapping[str, int] | None = None,
    missing_days: Sequence[str] = (),
    computed_at: dt.datetime | None = None,
) -> DurationReport:
    """Statistics and suggestions for every type seen in the period or configured in the policy."""
    job_types = sorted(set(period.tallies) | set(policy.max_duration_seconds_by_type))
    empty = Tally()
    return DurationReport(
        window_start=period.start,
        window_end=period.end,
        computed_at=computed_at or dt.datetime.now(dt.timezone.utc),
        rules=rules,
        heartbeat_timeout_seconds=policy.heartbeat_timeout_seconds,
        default_t2_seconds=policy.max_duration_seconds,
        configured_t2_by_type=dict(policy.max_duration_seconds_by_type),
        types=[
            suggest(
                job_type,
                period.tallies.get(job_type, empty),
                policy.max_duration_of(job_type),
                policy.heartbeat_timeout_seconds,
                rules,
            )
            for job_type in job_types
        ],
        bad_data=dict(sorted((Counter(period.bad_data) + Counter(undated or {})).items())),
        missing_days=list(missing_days),
        jobs_read=period.jobs_read,
        events_read=period.events_read,
    )


def analyze_window(
    jobs: Collection,
    events: Collection,
    policy: ZombiePolicy,
    end: dt.datetime,
    window_days: float = DEFAULT_WINDOW_DAYS,
    rules: SuggestionRules = SuggestionRules(),
    batch_size: int = READ_BATCH_SIZE,
) -> DurationReport:
    """One pass over the ``window_days`` before ``end``: the report without Dagster (the CLI demo)."""
    end = as_utc(end)
    period = read_period(jobs, events, end - dt.timedelta(days=window_days), end, batch_size)
    return analyze(period, policy, rules, undated=count_undated_jobs(jobs))


# --- the suggestions collection ------------------------------------------------------


def save_suggestions(collection: Collection, report: DurationReport) -> None:
    """Record the window's suggestions; recomputing a window replaces its document."""
    document = {
        ID: report.window_end,
        T2Suggestion.WINDOW_START: report.window_start,
        T2Suggestion.WINDOW_END: report.window_end,
        T2Suggestion.COMPUTED_AT: report.computed_at,
        T2Suggestion.SETTINGS: {**report.rules.as_dict(), "heartbeat_timeout_seconds": report.heartbeat_timeout_seconds},
        T2Suggestion.BY_TYPE: [
            {
                T2Suggestion.TYPE: entry.job_type,
                T2Suggestion.SUGGESTED_T2_SECONDS: entry.suggested_t2_seconds,
                T2Suggestion.CURRENT_T2_SECONDS: entry.current_t2_seconds,
                T2Suggestion.ENOUGH_DATA: entry.enough_data,
                T2Suggestion.CENSORED: entry.censored,
                T2Suggestion.SAMPLES: entry.successes,
            }
            for entry in report.types
        ],
    }
    collection.replace_one({ID: report.window_end}, document, upsert=True)


def latest_suggested_max_durations(collection: Collection, minimum_seconds: int = 0) -> dict[str, int]:
    """T2 per job type from the most recent window with enough data; {} when there is none.

    Types without enough data are left out, so the policy's own value stays.
    ``minimum_seconds`` (e.g. the current heartbeat timeout) raises any value
    below it, so the result always passes policy validation.
    """
    latest = collection.find_one({}, {T2Suggestion.BY_TYPE: 1}, sort=[(ID, -1)])
    if latest is None:
        return {}
    suggestions = {}
    for entry in latest.get(T2Suggestion.BY_TYPE) or []:
        job_type, seconds = entry.get(T2Suggestion.TYPE), entry.get(T2Suggestion.SUGGESTED_T2_SECONDS)
        if entry.get(T2Suggestion.ENOUGH_DATA) is True and isinstance(job_type, str) and job_type:
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
                suggestions[job_type] = max(int(seconds), minimum_seconds)
    return suggestions


def policy_with_suggestions(policy: ZombiePolicy, collection: Collection) -> ZombiePolicy:
    """``policy`` with the latest suggested T2 per type in force (the cleanup's opt-in).

    A suggestion replaces the configured value of its type; types without one
    keep their configured value. Never below the heartbeat timeout, so the
    result always validates.
    """
    suggested = latest_suggested_max_durations(collection, minimum_seconds=policy.heartbeat_timeout_seconds)
    if not suggested:
        return policy
    return dataclasses.replace(
        policy, max_duration_seconds_by_type={**policy.max_duration_seconds_by_type, **suggested}
    )

