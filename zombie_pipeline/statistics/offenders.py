"""Repeat offenders: the datasets and job types the cleanup finalizes again and again.

Retries are capped, but a cap alone hides *which* datasets keep killing their
workers (a dataset too big for its pod, a step that always hangs on it). The
audit trail knows: every finalization is an event in ``zombieEvents``. Over a
window ``[start, end)`` one aggregation, on the ``finalized_at`` index, groups
the events on the server, by (dataset, job type, reason) and then by dataset,
so Python receives one small document per dataset and keeps only the
offenders: the datasets finalized at least ``threshold`` times, at most
``limit`` of them (the most finalized). For those, one indexed read of the
cache per chunk of datasets gives the error users see now.

A malformed event (its dataset or job type missing or not a name, a reason we
do not know) is counted by its problem and left out, never a crash: the audit
trail may hold documents of older versions or of hand edits.

The (dataset, job type) pairs quarantined at the window's end (``cleanup.quarantine``:
their workers kept crashing, they are not re-enqueued) are listed beside, and
marked on their offenses; so are the pairs that used up their free re-runs in the
window (``cleanup.budget``: SIGTERMed alone more often than deployments explain).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zombie_pipeline.cleanup.budget import spent_budgets
from zombie_pipeline.cleanup.quarantine import quarantine_row
from zombie_pipeline.queue.audit_documents import Event, RetryOutcome
from zombie_pipeline.queue.cache import CACHE_CONTENT_ERROR, Cache
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import ID, Job, job_type_problem, name_problem
from zombie_pipeline.queue.reasons import ERROR_CODE_OF_REASON, REASONS, Reason
from zombie_pipeline.queue.store import Store, aggregate_rows
from zombie_pipeline.queue.times import as_utc, utc
from zombie_pipeline.trail import active_quarantines, finalized_between

#: Finalizations of one dataset in the window that make it an offender, unless told otherwise.
DEFAULT_THRESHOLD = 3
#: Offenders kept in full (the most finalized first); the others are only counted.
DEFAULT_LIMIT = 1_000
#: A cache error message is cut here: a traceback is not needed to recognize a dataset.
MESSAGE_LIMIT = 500
#: Datasets whose cache entries are read in one query.
CACHE_CHUNK = 200
READ_BATCH = 1_000

# Names of the aggregation's own output (never document fields).
_PROBLEM, _DATASET, _TYPE, _REASON = "problem", "dataset", "type", "reason"
_EVENTS, _FIRST, _LAST, _LIMIT, _CODE, _ITEMS, _TOTAL = "events", "first", "last", "limit", "code", "items", "total"


class Problem:
    """Why an event of the window was left out; each is counted."""

    INVALID_DATASET = "invalid_dataset"  # missing, not a string, or not a name (documents.name_problem)
    INVALID_JOB_TYPE = "invalid_job_type"  # missing, not a string, or not a type (documents.job_type_problem)
    UNKNOWN_REASON = "unknown_reason"


class ErrorSource:
    CACHE = "cache"  # the entry users read now
    EVENT = "event"  # no error entry in the cache: the code of the last finalization


@dataclass
class Offense:
    """One job type of one dataset over the window."""

    dataset: str
    job_type: str
    reasons: Counter[Any] = field(default_factory=Counter)  # reason -> finalizations
    first_seen: dt.datetime | None = None
    last_seen: dt.datetime | None = None
    retry_limit_reached: bool = False
    last_error_code: str | None = None
    last_error_message: str | None = None
    last_error_source: str = ErrorSource.EVENT
    quarantined: bool = False  # its pair is quarantined at the window's end

    @property
    def finalizations(self) -> int:
        return sum(self.reasons.values())

    def add(self, reason: str, events: int, first: dt.datetime, last: dt.datetime, limit: bool, code: Any) -> None:
        """Fold in one (reason) group; the error code is the one of the latest finalization."""
        self.reasons[reason] += events
        self.retry_limit_reached = self.retry_limit_reached or limit
        if self.first_seen is None or first < self.first_seen:
            self.first_seen = first
        if self.last_seen is None or last >= self.last_seen:
            self.last_seen = last
            self.last_error_code = code if isinstance(code, str) else ERROR_CODE_OF_REASON[Reason(reason)]


@dataclass
class Offender:
    """A dataset finalized at least the threshold's number of times, with each of its job types."""

    dataset: str
    offenses: list[Offense]  # the most finalized type first

    @property
    def finalizations(self) -> int:
        return sum(offense.finalizations for offense in self.offenses)

    @property
    def reasons(self) -> Counter[Any]:
        return sum((offense.reasons for offense in self.offenses), Counter())

    @property
    def first_seen(self) -> dt.datetime:
        return min(offense.first_seen for offense in self.offenses if offense.first_seen is not None)

    @property
    def last_seen(self) -> dt.datetime:
        return max(offense.last_seen for offense in self.offenses if offense.last_seen is not None)

    @property
    def retry_limit_reached(self) -> bool:
        return any(offense.retry_limit_reached for offense in self.offenses)

    @property
    def latest(self) -> Offense:
        """The job type finalized last: its error is the dataset's last error."""
        return max(self.offenses, key=lambda offense: offense.last_seen or dt.datetime.min.replace(tzinfo=dt.UTC))


@dataclass
class RepeatOffenders:
    """The offenders of a window, and what the window held."""

    start: dt.datetime
    end: dt.datetime
    threshold: int
    offenders: list[Offender] = field(default_factory=list)  # the most finalized first, at most ``limit``
    offenders_total: int = 0  # every dataset at or over the threshold, kept or not
    events: int = 0  # finalizations counted (malformed events excepted)
    datasets: int = 0  # distinct datasets finalized in the window
    malformed: Counter[Any] = field(default_factory=Counter)  # problem -> events left out
    quarantined: list[dict[str, Any]] = field(default_factory=list)  # the quarantines holding at the end, as rows
    free_runs_spent: list[dict[str, Any]] = field(default_factory=list)  # pairs SIGTERMed alone past their free re-runs

    @property
    def truncated(self) -> bool:
        return self.offenders_total > len(self.offenders)

    @property
    def skipped(self) -> int:
        return sum(self.malformed.values())

    def window_text(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M} – {self.end:%Y-%m-%d %H:%M} UTC"

    def rows(self) -> list[dict[str, Any]]:
        """One row per (offending dataset, job type): plain values for a table."""
        return [
            {
                "dataset": offense.dataset,
                "type": offense.job_type,
                "finalizations": offense.finalizations,
                **{reason.value: offense.reasons.get(reason, 0) for reason in REASONS},
                "first_seen": _stamp(offense.first_seen),
                "last_seen": _stamp(offense.last_seen),
                "retry_limit_reached": offense.retry_limit_reached,
                "last_error": offense.last_error_code,
                "last_error_message": offense.last_error_message,
                "error_from": offense.last_error_source,
                "quarantined": offense.quarantined,
            }
            for offender in self.offenders
            for offense in offender.offenses
        ]

    def by_job_type(self) -> dict[str, dict[str, Any]]:
        """Per job type, over the offenders kept: how many datasets, finalizations by reason, limits reached."""
        types: dict[str, dict[str, Any]] = {}
        for offender in self.offenders:
            for offense in offender.offenses:
                entry = types.setdefault(
                    offense.job_type,
                    {"datasets": 0, "finalizations": 0, "reasons": Counter(), "retry_limit_reached": 0},
                )
                entry["datasets"] += 1
                entry["finalizations"] += offense.finalizations
                entry["reasons"].update(offense.reasons)
                entry["retry_limit_reached"] += offense.retry_limit_reached
        return dict(sorted(types.items(), key=lambda item: (-item[1]["finalizations"], item[0])))


def find_offenders(
    store: Store,
    start: dt.datetime,
    end: dt.datetime,
    threshold: int = DEFAULT_THRESHOLD,
    limit: int = DEFAULT_LIMIT,
) -> RepeatOffenders:
    """The datasets finalized at least ``threshold`` times in ``[start, end)``, each with its job types, and the
    quarantines holding at ``end``.

    ``limit`` bounds what is kept (and looked up in the cache): the most
    finalized offenders; ``offenders_total`` counts them all. ``limit=0`` only
    counts, without reading the cache.
    """
    window_start, window_end = as_utc(start), as_utc(end)
    if window_start is None or window_end is None or not window_start < window_end:
        raise ValueError("find_offenders needs two dates, start before end")
    start, end = window_start, window_end
    if threshold < 1:
        raise ValueError("threshold must be at least 1 finalization")
    if limit < 0:
        raise ValueError("limit must not be negative")
    result = RepeatOffenders(start=start, end=end, threshold=threshold)
    kept: list[Offender] = []
    for group in store.events.aggregate(offenders_pipeline(start, end), allowDiskUse=True, batchSize=READ_BATCH):
        offender = _offender_of(group, result.malformed)
        if offender is None:
            continue
        result.events += offender.finalizations
        result.datasets += 1
        if offender.finalizations >= threshold:
            result.offenders_total += 1
            if limit:
                kept.append(offender)
                if len(kept) >= 2 * limit:  # memory stays within twice the limit
                    kept = _most_finalized(kept, limit)
    result.offenders = _most_finalized(kept, limit)
    _attach_cache_errors(store, result.offenders)
    quarantines = active_quarantines(store, end)
    result.quarantined = [quarantine_row(quarantine) for quarantine in quarantines]
    held = {(row["dataset"], row["type"]) for row in result.quarantined}
    for offender in result.offenders:
        for offense in offender.offenses:
            offense.quarantined = (offense.dataset, offense.job_type) in held
    result.free_runs_spent = spent_budgets(store, start, end)
    return result


def offenders_pipeline(start: dt.datetime, end: dt.datetime) -> list[dict[str, Any]]:
    """The window's events on the ``finalized_at`` index, grouped by (dataset, type, reason), then by dataset.

    Sorted by ``finalized_at`` first (the index's order, no sort in memory) so
    that ``$last`` is the error code of the latest finalization. An event that
    is malformed is grouped by its problem only.
    """
    dataset, job_type, reason = f"${Event.JOB}.{Job.DATASET}", f"${Event.JOB}.{Job.TYPE}", f"${Event.REASON}"
    problem = _first_problem(
        (_is_string(dataset), Problem.INVALID_DATASET),
        (_is_string(job_type), Problem.INVALID_JOB_TYPE),
        ({"$in": [reason, [str(value) for value in REASONS]]}, Problem.UNKNOWN_REASON),
    )
    valid = {"$eq": [f"${_PROBLEM}", None]}
    finalized = finalized_between(start, end)  # the statistics' rule: a claim lost to a live worker is no finalization
    in_window = {Event.FINALIZED_AT: finalized.pop(Event.FINALIZED_AT)}
    return on_index(
        in_window,
        finalized,
        {"$sort": {Event.FINALIZED_AT: 1}},
        {
            "$project": {
                ID: 0,
                _PROBLEM: problem,
                _DATASET: dataset,
                _TYPE: job_type,
                _REASON: reason,
                Event.FINALIZED_AT: 1,
                _CODE: {"$cond": [_is_string(f"${Event.ERROR_CODE}"), f"${Event.ERROR_CODE}", None]},
                _LIMIT: {"$cond": [{"$eq": [f"${Event.RETRY_OUTCOME}", str(RetryOutcome.LIMIT_REACHED)]}, 1, 0]},
            }
        },
        {
            "$group": {
                ID: {
                    _PROBLEM: f"${_PROBLEM}",
                    **{name: {"$cond": [valid, f"${name}", None]} for name in (_DATASET, _TYPE, _REASON)},
                },
                _EVENTS: {"$sum": 1},
                _FIRST: {"$min": f"${Event.FINALIZED_AT}"},
                _LAST: {"$max": f"${Event.FINALIZED_AT}"},
                _LIMIT: {"$max": f"${_LIMIT}"},
                _CODE: {"$last": f"${_CODE}"},
            }
        },
        {
            "$group": {
                ID: {_PROBLEM: f"${ID}.{_PROBLEM}", _DATASET: f"${ID}.{_DATASET}"},
                _TOTAL: {"$sum": f"${_EVENTS}"},
                _ITEMS: {
                    "$push": {
                        _TYPE: f"${ID}.{_TYPE}",
                        _REASON: f"${ID}.{_REASON}",
                        **{name: f"${name}" for name in (_EVENTS, _FIRST, _LAST, _LIMIT, _CODE)},
                    }
                },
            }
        },
    )


def _is_string(path: str) -> dict[str, Any]:
    return {"$eq": [{"$type": path}, "string"]}


def _first_problem(*tests: tuple[dict[str, Any], str]) -> Any:
    """A ``$cond`` chain: the problem of the first test that fails, else null."""
    expression: Any = None
    for test, problem in reversed(tests):
        expression = {"$cond": [test, expression, problem]}
    return expression


def _offender_of(group: Mapping[str, Any], malformed: Counter[Any]) -> Offender | None:
    """One dataset's groups as an :class:`Offender` (whatever its count), its malformed events counted aside."""
    key = group.get(ID) or {}
    problem, dataset = key.get(_PROBLEM), key.get(_DATASET)
    if problem is not None:
        malformed[problem] += group.get(_TOTAL, 0)
        return None
    if not isinstance(dataset, str) or name_problem(Job.DATASET, dataset):
        malformed[Problem.INVALID_DATASET] += group.get(_TOTAL, 0)
        return None
    offenses: dict[str, Offense] = {}
    for item in group.get(_ITEMS, []):
        job_type = item.get(_TYPE)
        if not isinstance(job_type, str) or job_type_problem(job_type):
            malformed[Problem.INVALID_JOB_TYPE] += item[_EVENTS]
            continue
        offense = offenses.setdefault(job_type, Offense(dataset=dataset, job_type=job_type))
        offense.add(item[_REASON], item[_EVENTS], utc(item[_FIRST]), utc(item[_LAST]), bool(item[_LIMIT]), item[_CODE])
    if not offenses:
        return None
    ordered = sorted(offenses.values(), key=lambda offense: (-offense.finalizations, offense.job_type))
    return Offender(dataset=dataset, offenses=ordered)


def _most_finalized(offenders: list[Offender], limit: int) -> list[Offender]:
    return sorted(offenders, key=lambda offender: (-offender.finalizations, offender.dataset))[:limit]


T = TypeVar("T")


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for index in range(0, len(items), size):
        yield items[index : index + size]


def _attach_cache_errors(store: Store, offenders: Iterable[Offender]) -> None:
    """Give each offense the error of its dataset's latest error entry of that kind, where the cache has one.

    Datasets first, then kinds (``mongo.on_index``): the deployment's ``(dataset, kind, http_status)`` index.
    """
    by_key = {(offense.dataset, offense.job_type): offense for offender in offenders for offense in offender.offenses}
    datasets = sorted({dataset for dataset, _ in by_key})
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    oldest = dt.datetime.min.replace(tzinfo=dt.UTC)
    for chunk in _chunks(datasets, CACHE_CHUNK):
        members = set(chunk)
        kinds = sorted({kind for dataset, kind in by_key if dataset in members})
        pipeline = on_index(
            {Cache.DATASET: {"$in": chunk}},
            {Cache.KIND: {"$in": kinds}, Cache.ERROR_CODE: {"$type": "string"}},
            {
                "$project": {
                    ID: 0,
                    Cache.DATASET: 1,
                    Cache.KIND: 1,
                    Cache.ERROR_CODE: 1,
                    Cache.UPDATED_AT: 1,
                    f"{Cache.CONTENT}.{CACHE_CONTENT_ERROR}": 1,
                }
            },
        )
        for entry in aggregate_rows(store.cache, pipeline, batchSize=READ_BATCH):
            key = (entry.get(Cache.DATASET), entry.get(Cache.KIND))
            if key not in by_key:
                continue
            known = latest.get(key)
            if known is None or (as_utc(entry.get(Cache.UPDATED_AT)) or oldest) > (
                as_utc(known.get(Cache.UPDATED_AT)) or oldest
            ):
                latest[key] = entry
    for key, entry in latest.items():
        offense = by_key[key]
        offense.last_error_code = entry[Cache.ERROR_CODE]
        offense.last_error_message = _message_of(entry)
        offense.last_error_source = ErrorSource.CACHE


def _message_of(entry: Mapping[str, Any]) -> str | None:
    content = entry.get(Cache.CONTENT)
    message = content.get(CACHE_CONTENT_ERROR) if isinstance(content, Mapping) else None
    if not isinstance(message, str):
        return None
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 1] + "…"


def _stamp(moment: dt.datetime | None) -> str | None:
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment is not None else None
