"""Which started jobs are zombies, decided by one indexed MongoDB query.

Every stale job started before the heartbeat cutoff, or the SIGTERM rule's (a
maximum duration is never shorter than the heartbeat timeout), so the query's first
stage is a range of the ``(status, started_at)`` index over old started jobs only:
finished history, however long, is never examined. The per-type maximum durations are branches of the second
stage's ``$or``. Python then only names the reason of the few jobs that come back.

The reason is the deployment's own: its workers finish the jobs of *dead* workers
as crashed (``kill_stuck_jobs``: heartbeat stale, never sent, or SIGTERM recorded),
whatever their age, and only a worker still running its own job past the maximum
duration stops it as exceeded (``kill_long_job``). So a dead job is a crash even
when it started longer ago than T2 (the event says it was past T2 too), and
"exceeded" is for a job whose worker is still alive.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson import ObjectId
from pymongo.collection import Collection

from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import FreeRunsRecord
from zombie_pipeline.queue.cache import Cache, CacheEntry
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import (
    ID,
    STATUSES,
    Job,
    JobDocument,
    JobSnapshot,
    Status,
    job_row,
    job_type_problem,
    name_problem,
)
from zombie_pipeline.queue.reasons import ERROR_CODE_OF_REASON, Cause, Reason
from zombie_pipeline.queue.store import aggregate_rows
from zombie_pipeline.queue.times import as_utc, utc

if TYPE_CHECKING:
    from zombie_pipeline.cleanup.brake import Brake


@dataclass(frozen=True)
class Candidate:
    """A zombie as detection saw it: the evidence finalization must find unchanged."""

    job: JobSnapshot  # the job's own fields, as read
    reason: Reason
    threshold_seconds: int
    detected_at: dt.datetime
    due_at: dt.datetime  # the moment its rules first allowed finalizing it (:func:`deadline_of`)
    past_max_duration: bool = False  # also started longer ago than its type's T2 (a dead job stays a crash)
    cause: Cause | None = None  # why its worker stopped, once judged with the others (``causes.judged``)
    in_wave: bool = False  # its death fell in a wave of workers stopped at once
    free_runs: FreeRunsRecord | None = None  # SIGTERMed alone: its pair's free re-runs (``budget``)

    @property
    def id(self) -> ObjectId:
        return self.job[ID]

    @property
    def job_type(self) -> str:
        return self.job[Job.TYPE]

    @property
    def started_at(self) -> dt.datetime:
        return self.job[Job.STARTED_AT]

    @property
    def last_heartbeat(self) -> dt.datetime | None:
        return self.job.get(Job.LAST_HEARTBEAT)

    @property
    def terminated_at(self) -> dt.datetime | None:
        return self.job.get(Job.TERMINATED_AT)

    @property
    def error_code(self) -> str:
        return ERROR_CODE_OF_REASON[self.reason]

    @property
    def last_sign_of_life(self) -> dt.datetime:
        """The job's latest start, heartbeat or SIGTERM: its worker was alive then."""
        signs = (self.job.get(name) for name in (Job.STARTED_AT, Job.LAST_HEARTBEAT, Job.TERMINATED_AT))
        return max(utc(sign) for sign in signs if sign is not None)

    def detection_seconds(self, finalized_at: dt.datetime) -> float:
        """How late the finalization comes: since the last sign of life of a dead job, since the deadline (its T2)
        of one still running."""
        if self.reason is Reason.EXCEEDED_MAX_DURATION:
            since = utc(self.started_at) + dt.timedelta(seconds=self.threshold_seconds)
        else:
            since = self.last_sign_of_life
        return round(max((finalized_at - since).total_seconds(), 0.0), 3)

    def release_lag_seconds(self, finalized_at: dt.datetime) -> float:
        """How long after the moment its rules allowed it the job was finalized: what a cleanup adds to the rule."""
        return round((finalized_at - self.due_at).total_seconds(), 3)

    @property
    def age_seconds(self) -> float:
        return (self.detected_at - self.started_at).total_seconds()

    def row(self) -> dict[str, Any]:
        """The candidate as one row of a table (a dry run's, a check's): the evidence it was judged on."""
        return job_row(
            self.id,
            self.job,
            reason=self.reason,
            age_seconds=round(self.age_seconds, 1),
            last_heartbeat=self.last_heartbeat.isoformat() if self.last_heartbeat else None,
            terminated_at=self.terminated_at.isoformat() if self.terminated_at else None,
            threshold_seconds=self.threshold_seconds,
            past_max_duration=self.past_max_duration,
            cause=self.cause,
        )


@dataclass(frozen=True)
class Malformed:
    """A started job we refuse to touch, and why."""

    id: Any
    problem: str


@dataclass
class Detection:
    now: dt.datetime
    candidates: list[Candidate] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)
    brake: Brake | None = None  # judged when there are candidates: do too many of the started jobs look dead?

    @property
    def stopped_by_brake(self) -> bool:
        return self.brake is not None and self.brake.engaged

    def count_by(self, attribute: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for candidate in self.candidates:
            key = getattr(candidate, attribute)
            counts[key] = counts.get(key, 0) + 1
        return counts


def stale_stages(
    policy: ZombiePolicy, now: dt.datetime, job_types: Iterable[str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The stale query in two parts: the ``(status, started_at)`` index range, then which rule broke.

    Every zombie started before the heartbeat cutoff (a job is terminated after
    it started), so the first part alone bounds
    the index scan; the second only sorts out the few jobs it returns. Job type
    names only ever appear as values (``$in``, equality), never as keys.
    """
    heartbeat_cutoff = now - dt.timedelta(seconds=policy.heartbeat_timeout_seconds)
    fast_termination = termination_cutoffs(policy, now)
    overrides = policy.max_duration_seconds_by_type
    # A job SIGTERMed recently is left to its termination, whatever its age: it becomes a zombie (terminated)
    # once the timeout has passed since the signal, as the deployment decides, or once its grace period has and its
    # heartbeats stopped (the SIGTERM rule). Hence TERMINATED_AT: None below.
    exceeded: list[dict[str, Any]] = [
        {Job.TYPE: job_type, Job.TERMINATED_AT: None, Job.STARTED_AT: {"$lt": now - dt.timedelta(seconds=limit)}}
        for job_type, limit in sorted(overrides.items())
    ]
    exceeded.append(
        {
            Job.TYPE: {"$nin": sorted(overrides)},
            Job.TERMINATED_AT: None,
            Job.STARTED_AT: {"$lt": now - dt.timedelta(seconds=policy.max_duration_seconds)},
        }
    )
    dead: list[dict[str, Any]] = [
        {Job.TERMINATED_AT: {"$lt": heartbeat_cutoff}},  # SIGTERM long ago (only 2026-05 on has the field)
        {Job.TERMINATED_AT: None, Job.LAST_HEARTBEAT: {"$lt": heartbeat_cutoff}},
        # missing or null: never heartbeated (its start bounds it; the index range may reach later, for the SIGTERM rule)
        {Job.TERMINATED_AT: None, Job.LAST_HEARTBEAT: None, Job.STARTED_AT: {"$lt": heartbeat_cutoff}},
    ]
    started_before = heartbeat_cutoff
    if fast_termination is not None:
        # SIGTERM older than the grace period, and silent since: the pod was killed. Such a job started before both
        # cutoffs (before its SIGTERM, before its last heartbeat), so the index range still bounds it.
        signal_cutoff, silence_cutoff = fast_termination
        silent = [
            {Job.LAST_HEARTBEAT: {"$lt": silence_cutoff}},
            {Job.LAST_HEARTBEAT: None, Job.STARTED_AT: {"$lt": silence_cutoff}},
        ]
        dead.append({Job.TERMINATED_AT: {"$lt": signal_cutoff}, "$or": silent})
        started_before = max(heartbeat_cutoff, min(signal_cutoff, silence_cutoff))
    index_range = {Job.STATUS: Status.STARTED, Job.STARTED_AT: {"$lt": started_before}}
    rules: dict[str, Any] = {"$or": [*dead, *exceeded], **_of_types(job_types)}
    return index_range, rules


def termination_cutoffs(policy: ZombiePolicy, now: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
    """The SIGTERM rule's two cutoffs: a job SIGTERMed before the first whose last heartbeat (or start) is older than
    the second is dead. None when the policy leaves SIGTERMed jobs to the deployment's rule alone (the heartbeat
    timeout since the SIGTERM)."""
    if policy.termination_grace_seconds is None:
        return None
    return (
        now - dt.timedelta(seconds=policy.termination_grace_seconds),
        now - dt.timedelta(seconds=policy.termination_silence_seconds()),
    )


def stale_filter(policy: ZombiePolicy, now: dt.datetime, job_types: Iterable[str] | None = None) -> dict[str, Any]:
    """The MongoDB filter matching every zombie under ``policy`` at ``now``, as one document."""
    index_range, rules = stale_stages(policy, now, job_types)
    return {**index_range, **rules}


def stale_pipeline(
    policy: ZombiePolicy, now: dt.datetime, job_types: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    return on_index(*stale_stages(policy, now, job_types))


def _of_types(job_types: Iterable[str] | None) -> dict[str, Any]:
    return {} if job_types is None else {Job.TYPE: {"$in": sorted(job_types)}}


def started_filter(job_types: Iterable[str] | None = None) -> dict[str, Any]:
    return {Job.STATUS: Status.STARTED, **_of_types(job_types)}


def problem_of(job: Mapping[str, Any]) -> str | None:
    """Why a started job cannot be handled safely, or None when it can."""
    problem = (
        job_type_problem(job.get(Job.TYPE))
        or name_problem(Job.DATASET, job.get(Job.DATASET))
        or name_problem(Job.UNICITY_ID, job.get(Job.UNICITY_ID))
    )
    if problem:
        return problem
    for name in (Job.CONFIG, Job.SPLIT):
        value = job.get(name)
        if value is not None and not isinstance(value, str):
            return f"{name} is neither a string nor null"
    if as_utc(job.get(Job.STARTED_AT)) is None:
        return "started_at is missing or not a date"
    for name in (Job.LAST_HEARTBEAT, Job.TERMINATED_AT):
        if job.get(name) is not None and as_utc(job[name]) is None:
            return f"{name} is neither a date nor null"
    return None


@dataclass(frozen=True)
class Rule:
    """One rule a started job can break, and the moment it breaks it: the job is a zombie by it once past ``due_at``."""

    reason: Reason
    threshold_seconds: int
    due_at: dt.datetime


def rules_of(job: Mapping[str, Any], policy: ZombiePolicy) -> list[Rule]:
    """The rules a well-formed started job is judged by, in the deployment's precedence, each with its moment.

    Terminated (SIGTERM older than the timeout; or, sooner, older than the grace period with the heartbeats stopped
    since: :func:`termination_cutoffs`), and nothing else for a SIGTERMed job; then dead (heartbeat stale, or never
    sent since its start); then alive past its type's maximum duration. Every moment is known from the job as read:
    :func:`reason_of` asks which rules have passed, the watcher (``cleanup.watch``) sleeps until the earliest.
    """
    timeout = dt.timedelta(seconds=policy.heartbeat_timeout_seconds)
    terminated_at = as_utc(job.get(Job.TERMINATED_AT))
    started_at = utc(job[Job.STARTED_AT])
    last_heartbeat = as_utc(job.get(Job.LAST_HEARTBEAT))
    if terminated_at is not None:
        rules = [Rule(Reason.TERMINATED, policy.heartbeat_timeout_seconds, terminated_at + timeout)]
        if policy.termination_grace_seconds is not None:
            grace = dt.timedelta(seconds=policy.termination_grace_seconds)
            silence = dt.timedelta(seconds=policy.termination_silence_seconds())
            due = max(terminated_at + grace, (last_heartbeat or started_at) + silence)
            rules.append(Rule(Reason.TERMINATED, policy.termination_grace_seconds, due))
        return rules
    if last_heartbeat is None:
        rules = [Rule(Reason.NEVER_HEARTBEATED, policy.heartbeat_timeout_seconds, started_at + timeout)]
    else:
        rules = [Rule(Reason.MISSING_HEARTBEAT, policy.heartbeat_timeout_seconds, last_heartbeat + timeout)]
    limit = policy.max_duration_of(job[Job.TYPE])
    return [*rules, Rule(Reason.EXCEEDED_MAX_DURATION, limit, started_at + dt.timedelta(seconds=limit))]


def reason_of(job: Mapping[str, Any], policy: ZombiePolicy, now: dt.datetime) -> tuple[Reason, int] | None:
    """The reason a well-formed started job is a zombie, with the threshold it broke; None if it is not one: the
    first of its :func:`rules_of`, in their precedence, whose moment has passed."""
    for rule in rules_of(job, policy):
        if rule.due_at < now:
            return rule.reason, rule.threshold_seconds
    return None


def deadline_of(job: Mapping[str, Any], policy: ZombiePolicy) -> dt.datetime:
    """The moment a well-formed started job becomes a zombie if nothing changes: its earliest rule's."""
    return min(rule.due_at for rule in rules_of(job, policy))


def is_past_max_duration(job: Mapping[str, Any], policy: ZombiePolicy, now: dt.datetime) -> bool:
    """Whether the job started longer ago than its type's maximum duration (T2)."""
    return utc(job[Job.STARTED_AT]) < now - dt.timedelta(seconds=policy.max_duration_of(job[Job.TYPE]))


def detect(
    jobs: Collection[JobDocument],
    policy: ZombiePolicy,
    now: dt.datetime,
    job_types: Iterable[str] | None = None,
) -> Detection:
    """Find the zombies: one query, only the job fields come back, oldest first."""
    detection = Detection(now=now)
    # Whole documents: the few that come back are the snapshot a retry is copied from,
    # in whatever generation the deployment wrote them.
    # one reply for up to a batch of zombies, the cursor closed with it (a batch exactly full would need a getMore)
    for job in jobs.aggregate(stale_pipeline(policy, now, job_types), batchSize=max(policy.batch_size + 1, 101)):
        problem = problem_of(job)
        if problem:
            detection.malformed.append(Malformed(job.get(ID), problem))
            continue
        verdict = reason_of(job, policy, now)
        if verdict is None:  # cannot happen with the same cutoffs; never act on a doubt
            continue
        reason, threshold = verdict
        past = is_past_max_duration(job, policy, now)
        detection.candidates.append(
            Candidate(job, reason, threshold, now, deadline_of(job, policy), past_max_duration=past)
        )
    detection.candidates.sort(key=lambda candidate: (candidate.started_at, candidate.id))
    return detection


def count_stale(
    jobs: Collection[JobDocument], policy: ZombiePolicy, now: dt.datetime, job_types: Iterable[str] | None = None
) -> int:
    """How many zombies there are, counted by the server without fetching them (for sensors)."""
    counted = aggregate_rows(jobs, stale_pipeline(policy, now, job_types) + [{"$count": "stale"}])
    found = next(counted, None)
    return found["stale"] if found else 0


def explain_stale(jobs: Collection[JobDocument], policy: ZombiePolicy, now: dt.datetime) -> dict[str, Any]:
    """The server's plan and execution statistics for detection's query, as detection sends it."""
    command = {"aggregate": jobs.name, "pipeline": stale_pipeline(policy, now), "cursor": {}}
    return query_plan_of(jobs.database.command("explain", command, verbosity="executionStats"))


def query_plan_of(explained: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an aggregation's explain output with ``queryPlanner`` and ``executionStats``.

    A pipeline the server runs as one query reports them at the top; others
    report them in the first stage's ``$cursor``.
    """
    if "queryPlanner" in explained:
        return dict(explained)
    first = (explained.get("stages") or [{}])[0]
    return dict(first.get("$cursor", first))


def find_malformed_started(
    jobs: Collection[JobDocument], job_types: Iterable[str] | None = None, limit: int = 1_000
) -> list[Malformed]:
    """Started jobs whose fields the stale query cannot read (dates as strings, ...).

    They are never finalized: they are reported for an operator to look at.
    """
    odd_fields = {
        "$or": [
            {Job.STARTED_AT: {"$not": {"$type": "date"}}},
            {Job.LAST_HEARTBEAT: {"$exists": True, "$not": {"$type": ["date", "null"]}}},
            {Job.TERMINATED_AT: {"$exists": True, "$not": {"$type": ["date", "null"]}}},
            {Job.TYPE: {"$not": {"$type": "string"}}},
            {Job.DATASET: {"$not": {"$type": "string"}}},
            {Job.UNICITY_ID: {"$not": {"$type": "string"}}},
            {Job.CONFIG: {"$exists": True, "$not": {"$type": ["string", "null"]}}},
            {Job.SPLIT: {"$exists": True, "$not": {"$type": ["string", "null"]}}},
        ],
        **_of_types(job_types),
    }
    checked = (
        Job.TYPE,
        Job.DATASET,
        Job.UNICITY_ID,
        Job.CONFIG,
        Job.SPLIT,
        Job.STARTED_AT,
        Job.LAST_HEARTBEAT,
        Job.TERMINATED_AT,
    )
    projection = {"$project": dict.fromkeys(checked, 1)}
    odd = jobs.aggregate(on_index(started_filter(), odd_fields, projection, {"$limit": limit}))
    found = [Malformed(job.get(ID), problem_of(job) or "a field has an unexpected type") for job in odd]
    return found + find_unknown_statuses(jobs, job_types, limit)


def find_unknown_statuses(
    jobs: Collection[JobDocument], job_types: Iterable[str] | None = None, limit: int = 1_000
) -> list[Malformed]:
    """Jobs whose status is none of the queue's (or missing): no rule applies, an operator should look.

    ``distinct`` on the status, which MongoDB answers from an index with ``status``
    first (a DISTINCT_SCAN: one key per status value, whatever the history), then
    one equality on that index per unknown value.
    """
    unknown = [status for status in jobs.distinct(Job.STATUS) if status not in STATUSES]
    if None not in unknown:
        unknown.append(None)  # distinct leaves missing statuses out; the equality finds them
    found: list[Malformed] = []
    for status in unknown:
        if len(found) >= limit:
            break
        stages = ({"$project": {Job.STATUS: 1}}, {"$limit": limit - len(found)})
        found += [
            Malformed(job[ID], f"unknown status {job.get(Job.STATUS)!r}")
            for job in jobs.aggregate(on_index({Job.STATUS: status}, _of_types(job_types), *stages))
        ]
    return found


def count_started(jobs: Collection[JobDocument], job_types: Iterable[str] | None = None) -> int:
    """The started jobs, counted by the server on the ``(status, started_at)`` index."""
    counted = aggregate_rows(jobs, on_index(started_filter(), _of_types(job_types), {"$count": "started"}))
    found = next(counted, None)
    return found["started"] if found else 0


def count_started_among(
    jobs: Collection[JobDocument], ids: Sequence[Any], job_types: Iterable[str] | None = None
) -> tuple[int, int]:
    """The started jobs, and how many of ``ids`` are still among them, in one read: a concurrent cleanup's
    finalizations since ``ids`` were found take from both counts, not from one."""
    still = {"$cond": [{"$in": [f"${ID}", list(ids)]}, 1, 0]}
    group = {"$group": {ID: None, "started": {"$sum": 1}, "still": {"$sum": still}}}
    found = next(aggregate_rows(jobs, on_index(started_filter(), _of_types(job_types), group)), None)
    return (found["started"], found["still"]) if found else (0, 0)


def known_job_types(jobs: Collection[JobDocument], cache: Collection[CacheEntry]) -> set[str]:
    """The job types the deployment has: those of its jobs, and the kinds of its cache entries (a step whose jobs
    all finished, where finished jobs are deleted)."""
    return {value for value in [*jobs.distinct(Job.TYPE), *cache.distinct(Cache.KIND)] if isinstance(value, str)}


#: What must be unchanged for a job to be finalized: a worker that beat, finished or got SIGTERM since wins.
_AS_SEEN = (Job.STARTED_AT, Job.LAST_HEARTBEAT, Job.TERMINATED_AT)


def as_seen_filter(job: Mapping[str, Any]) -> dict[str, Any]:
    """The filter matching ``job`` only while it is still started exactly as detection saw it (None matches missing)."""
    return {ID: job[ID], Job.STATUS: Status.STARTED, **{name: job.get(name) for name in _AS_SEEN}}


def as_seen_expression(job: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`as_seen_filter` without the ``_id``, as an aggregation expression: an update pipeline's ``$cond``.

    ``$ifNull`` makes a missing field equal to None, as the filter's equality does; ``$literal`` keeps a
    value read from the job a value (a string starting with ``$`` would otherwise be a field path).
    """
    seen: list[dict[str, Any]] = [{"$eq": [f"${Job.STATUS}", Status.STARTED]}]
    seen += [{"$eq": [{"$ifNull": [f"${name}", None]}, {"$literal": job.get(name)}]} for name in _AS_SEEN]
    return {"$and": seen}


def is_as_seen(current: Mapping[str, Any] | None, job: Mapping[str, Any]) -> bool:
    """:func:`as_seen_filter`, asked of a document already read."""
    return (
        current is not None
        and current.get(Job.STATUS) == Status.STARTED
        and all(as_utc(current.get(name)) == as_utc(job.get(name)) for name in _AS_SEEN)
    )
