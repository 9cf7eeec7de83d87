"""Why a zombie's worker stopped: the cause of each finalization, told from the queue alone.

The deployment counts every dead job as a crash: one of its three runs spent, +20
difficulty, whether its pod was OOM-killed or rolled by a release. The queue
holds enough to tell them apart:

- ``timeout``: the worker is alive but the job ran past its maximum duration
  (reason ``exceeded_max_duration``);
- ``deploy``: the worker stopped in a **wave**: at least ``wave_min_workers`` dead
  workers, of as many datasets, whose last signs of life (last heartbeat, else
  start) fall within ``wave_window_seconds`` of each other. A release or a node
  drain stops workers by the dozen within a minute or two; a worker that dies of
  its job dies alone. Jobs of one dataset count once: a dataset whose split jobs
  all OOM together is a poison pill, not a deploy. A worker SIGTERMed
  (``terminated_at``, 2026-05 on) is a deploy death too, wave or not; but alone,
  only within its (dataset, job type)'s free re-runs (``budget``): past them, it
  is charged as a crash;
- ``never_started``: no heartbeat ever, and alone;
- ``crash``: a worker that died alone.

The wave counts the candidates of the run and the deaths finalized in the last
:data:`RECENT_DEATHS` (their events), so that a wave whose workers are detected
by two runs is still one wave for the second run. The first run's part of it, if
fewer than the threshold, stays a crash: an event is never rewritten.

:func:`verdicts_of` is pure; :func:`recent_deaths` is the one read it needs (the
budget reads once more where a job was SIGTERMed alone).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pymongo.collection import Collection as MongoCollection

from zombie_pipeline.cleanup import budget
from zombie_pipeline.cleanup.detection import Candidate
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, ZombieEvent
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.queue.times import as_utc

#: How far back finalized deaths still count towards a wave of this run's candidates.
RECENT_DEATHS = dt.timedelta(hours=1)

_CAUSE_VALUES = frozenset(str(cause) for cause in Cause)
_SOLITARY = {
    Reason.TERMINATED: Cause.DEPLOY,
    Reason.MISSING_HEARTBEAT: Cause.CRASH,
    Reason.NEVER_HEARTBEATED: Cause.NEVER_STARTED,
    Reason.EXCEEDED_MAX_DURATION: Cause.TIMEOUT,
}


def solitary_cause(reason: str) -> Cause:
    """The cause of a zombie judged alone (no wave known): SIGTERM is a deploy, a live job past T2 a timeout."""
    return _SOLITARY[Reason(reason)]


def cause_of_event(event: Mapping[str, Any]) -> Cause:
    """The cause an event records; an event written before causes were recorded gets its reason's, judged alone."""
    recorded = event.get(Event.CAUSE)
    if isinstance(recorded, str) and recorded in _CAUSE_VALUES:
        return Cause(recorded)
    return solitary_cause(event[Event.REASON])


@dataclass(frozen=True)
class Death:
    """A dead worker's last sign of life, and the dataset its job was on."""

    at: dt.datetime
    dataset: str


def last_sign_of_life(job: Mapping[str, Any]) -> dt.datetime | None:
    """The job's last heartbeat, else its start."""
    return as_utc(job.get(Job.LAST_HEARTBEAT)) or as_utc(job.get(Job.STARTED_AT))


def death_of(job: Mapping[str, Any]) -> Death | None:
    at = last_sign_of_life(job)
    dataset = job.get(Job.DATASET)
    return Death(at, dataset) if at is not None and isinstance(dataset, str) else None


def in_waves(deaths: Sequence[Death], window_seconds: float, min_workers: int) -> list[bool]:
    """For each death, whether it falls in a wave: a span of ``window_seconds`` holding the deaths of at least
    ``min_workers`` datasets.

    One pass over the deaths in time order with a sliding span: every span that reaches the threshold marks all
    its deaths.
    """
    order = sorted(range(len(deaths)), key=lambda index: deaths[index].at)
    window = dt.timedelta(seconds=window_seconds)
    marks = [0] * (len(order) + 1)  # +1 where a marked run of the order starts, -1 where it ends
    datasets: Counter[str] = Counter()
    end = 0
    for start, first in enumerate(order):
        while end < len(order) and deaths[order[end]].at - deaths[first].at <= window:
            datasets[deaths[order[end]].dataset] += 1
            end += 1
        if len(datasets) >= min_workers:
            marks[start] += 1
            marks[end] -= 1
        datasets[deaths[first].dataset] -= 1
        if not datasets[deaths[first].dataset]:
            del datasets[deaths[first].dataset]
    waves = [False] * len(deaths)
    running = 0
    for position, index in enumerate(order):
        running += marks[position]
        waves[index] = running > 0
    return waves


@dataclass(frozen=True)
class Verdict:
    """A zombie's cause, and whether its death fell in a wave (a SIGTERMed one is a deploy death either way, but
    only alone does it spend its pair's free re-runs: ``budget``)."""

    cause: Cause
    in_wave: bool


def verdicts_of(
    jobs: Sequence[tuple[Mapping[str, Any], str]],
    recent: Collection[Death],
    window_seconds: float,
    min_workers: int,
) -> list[Verdict]:
    """The verdict on each (job, reason) of a run's candidates, given the deaths finalized recently.

    A dead job (any reason but ``exceeded_max_duration``) in a wave is a deploy death; a job SIGTERMed is one
    anyway; the others are judged alone (:func:`solitary_cause`).
    """
    dead = [
        (index, death)
        for index, (job, reason) in enumerate(jobs)
        if reason != Reason.EXCEEDED_MAX_DURATION and (death := death_of(job)) is not None
    ]
    marked = in_waves([death for _, death in dead] + list(recent), window_seconds, min_workers)
    in_wave = {index for (index, _), wave in zip(dead, marked) if wave}  # the recent deaths come after, unnamed
    verdicts = []
    for index, (_, reason) in enumerate(jobs):
        cause = solitary_cause(reason)
        if cause in (Cause.CRASH, Cause.NEVER_STARTED) and index in in_wave:
            cause = Cause.DEPLOY
        verdicts.append(Verdict(cause, index in in_wave))
    return verdicts


def causes_of(
    jobs: Sequence[tuple[Mapping[str, Any], str]],
    recent: Collection[Death],
    window_seconds: float,
    min_workers: int,
) -> list[Cause]:
    """The cause of each (job, reason) of a run's candidates (:func:`verdicts_of`)."""
    return [verdict.cause for verdict in verdicts_of(jobs, recent, window_seconds, min_workers)]


def recent_deaths(
    events: MongoCollection[ZombieEvent], now: dt.datetime, excluded: Collection[Any] = ()
) -> list[Death]:
    """The dead workers finalized since :data:`RECENT_DEATHS` before ``now`` (on the ``finalized_at`` index), but the
    ``excluded`` jobs (this run's own candidates, claimed by an earlier attempt of it)."""
    query = {
        Event.FINALIZED_AT: {"$gte": now - RECENT_DEATHS},
        Event.REASON: {"$ne": Reason.EXCEEDED_MAX_DURATION},
    }
    fields = {f"{Event.JOB}.{name}": 1 for name in (Job.DATASET, Job.STARTED_AT, Job.LAST_HEARTBEAT)}
    skipped = set(excluded)
    deaths = []
    for event in events.find(query, fields):
        death = death_of(event.get(Event.JOB) or {})
        if event[ID] not in skipped and death is not None:
            deaths.append(death)
    return deaths


def judged(
    candidates: Sequence[Candidate], events: MongoCollection[ZombieEvent], policy: ZombiePolicy, now: dt.datetime
) -> list[Candidate]:
    """The candidates of a run, each with its cause: judged together, with the deaths finalized recently, and a
    job SIGTERMed alone against its pair's free re-runs (``budget``)."""
    if not candidates:
        return []
    recent = recent_deaths(events, now, excluded={candidate.id for candidate in candidates})
    pairs = [(candidate.job, str(candidate.reason)) for candidate in candidates]
    verdicts = verdicts_of(pairs, recent, policy.wave_window_seconds, policy.wave_min_workers)
    judged = [
        replace(candidate, cause=verdict.cause, in_wave=verdict.in_wave)
        for candidate, verdict in zip(candidates, verdicts)
    ]
    return budget.charged_past_free_runs(judged, events, policy, now)
