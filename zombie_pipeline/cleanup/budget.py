"""Free re-runs have a budget: a job SIGTERMed alone again and again is the job's doing, not a deploy.

A worker SIGTERMed is a deploy death (``causes``): it costs no failed run and runs
again at once, at the same difficulty. But Kubernetes SIGTERMs single pods for
reasons of their own: a node short of memory evicts its pods (first those using
more than they requested), a failed liveness probe restarts one, the cluster
autoscaler drains an underused node, a pod of higher priority preempts one. A
job whose memory gets its pod evicted every time would run again, free and at
once, forever, on a worker of the same size.

So a (dataset, job type) gets ``lone_sigterm_free_reruns`` (3: the deployment's
own limit of failed runs for a crash) free re-runs within
``quarantine_window_hours`` (72) for the deaths that are deploy deaths only by
their own SIGTERM, not in a wave. Past them, the next one is charged as the crash
it most likely is (cause ``crash``: a failed run, so the backfill's +20
difficulty, and one more towards the quarantine). A death in a wave stays free
and spends nothing: a release that rolls every pod twice in an hour uses up
nobody's runs.

Each lone SIGTERM's event records its budget (``free_runs``): the pair's lone
SIGTERMs in the window, how many of them ran free, the limit, and whether this
one was charged. The budget is read back from those records (one query on the
``dataset_type_finalized_at`` index, only when a run has a job SIGTERMed alone),
decided before the claim, and kept by it: a pass redone never decides again. Two
cleanups at once that each find a lone SIGTERM of one pair may both grant it a
free re-run: the limit is exceeded by at most one per cleanup running at once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pymongo.collection import Collection as MongoCollection

from zombie_pipeline.cleanup.detection import Candidate
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState, FreeRuns, FreeRunsRecord, ZombieEvent
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.queue.store import Store, aggregate_rows
from zombie_pipeline.queue.times import utc

#: A (dataset, job type).
Pair = tuple[str, str]


def _pair(job: Mapping[str, Any]) -> Pair:
    return job[Job.DATASET], job[Job.TYPE]


def terminated_alone(candidate: Candidate) -> bool:
    """Whether the candidate is a deploy death only by its own SIGTERM: SIGTERMed, and not in a wave."""
    return candidate.reason == Reason.TERMINATED and not candidate.in_wave


@dataclass
class _Spent:
    """A pair's lone SIGTERMs in the window so far, and how many of them ran free."""

    alone: int = 0
    free: int = 0


def charged_past_free_runs(
    candidates: Sequence[Candidate], events: MongoCollection[ZombieEvent], policy: ZombiePolicy, now: dt.datetime
) -> list[Candidate]:
    """The candidates, each job SIGTERMed alone with its budget: free (``deploy``) within its pair's free re-runs,
    charged (``crash``) past them; taken in the order of their SIGTERMs, after the pair's earlier ones in the window."""
    limit = policy.lone_sigterm_limit
    alone = [index for index, candidate in enumerate(candidates) if terminated_alone(candidate)]
    if limit is None or not alone:
        return list(candidates)
    window_hours = policy.quarantine_window_hours
    since = now - dt.timedelta(hours=window_hours)
    pairs = {_pair(candidates[index].job) for index in alone}
    spent = _spent_since(events, pairs, since, excluded={candidate.id for candidate in candidates})
    judged = list(candidates)
    for index in sorted(alone, key=lambda index: (candidates[index].last_sign_of_life, candidates[index].id)):
        candidate = candidates[index]
        pair = spent.setdefault(_pair(candidate.job), _Spent())
        pair.alone += 1
        charged = pair.free >= limit
        pair.free += not charged
        record: FreeRunsRecord = {
            FreeRuns.ALONE: pair.alone,
            FreeRuns.FREE: pair.free,
            FreeRuns.LIMIT: limit,
            FreeRuns.WINDOW_HOURS: window_hours,
            FreeRuns.CHARGED: charged,
        }
        judged[index] = replace(candidate, cause=Cause.CRASH if charged else Cause.DEPLOY, free_runs=record)
    return judged


def _spent_since(
    events: MongoCollection[ZombieEvent], pairs: set[Pair], since: dt.datetime, excluded: set[Any]
) -> dict[Pair, _Spent]:
    """The lone SIGTERMs of ``pairs`` finalized after ``since`` (claimed or done), but the ``excluded`` jobs (this
    run's own candidates, claimed by an earlier attempt of it)."""
    pipeline = on_index(
        {f"{Event.JOB}.{Job.DATASET}": {"$in": sorted({dataset for dataset, _ in pairs})}},
        {
            f"{Event.JOB}.{Job.TYPE}": {"$in": sorted({job_type for _, job_type in pairs})},
            Event.FINALIZED_AT: {"$gt": since},
            Event.FREE_RUNS: {"$type": "object"},
        },
        {"$project": {f"{Event.JOB}.{Job.DATASET}": 1, f"{Event.JOB}.{Job.TYPE}": 1, Event.FREE_RUNS: 1}},
    )
    spent: dict[Pair, _Spent] = {}
    for event in aggregate_rows(events, pipeline):
        pair = _pair(event[Event.JOB])
        if pair in pairs and event[ID] not in excluded:
            counted = spent.setdefault(pair, _Spent())
            counted.alone += 1
            counted.free += not event[Event.FREE_RUNS].get(FreeRuns.CHARGED)
    return spent


# --- reading them ---------------------------------------------------------------------------------------------

_ALONE, _CHARGED, _SPENT, _LIMIT, _WINDOW, _LAST = "alone", "charged", "spent", "limit", "window_hours", "last"


def spent_budgets(store: Store, start: dt.datetime, end: dt.datetime) -> list[dict[str, Any]]:
    """The (dataset, job type) pairs that used up their free re-runs in ``[start, end)``, as rows: their lone
    SIGTERMs in the window, those charged as crashes, the limit; the most charged first. Grouped on the server over
    the ``finalized_at`` index."""
    record = f"${Event.FREE_RUNS}"
    pipeline = on_index(
        {Event.FINALIZED_AT: {"$gte": start, "$lt": end}},
        {Event.STATE: EventState.DONE, Event.FREE_RUNS: {"$type": "object"}},
        {
            "$group": {
                ID: {"dataset": f"${Event.JOB}.{Job.DATASET}", "type": f"${Event.JOB}.{Job.TYPE}"},
                _ALONE: {"$sum": 1},
                _CHARGED: {"$sum": {"$cond": [f"{record}.{FreeRuns.CHARGED}", 1, 0]}},
                _SPENT: {
                    "$max": {
                        "$or": [
                            f"{record}.{FreeRuns.CHARGED}",
                            {"$gte": [f"{record}.{FreeRuns.FREE}", f"{record}.{FreeRuns.LIMIT}"]},
                        ]
                    }
                },
                _LIMIT: {"$last": f"{record}.{FreeRuns.LIMIT}"},
                _WINDOW: {"$last": f"{record}.{FreeRuns.WINDOW_HOURS}"},
                _LAST: {"$max": f"${Event.FINALIZED_AT}"},
            }
        },
        {"$match": {_SPENT: True}},
    )
    rows = [
        {
            "dataset": group[ID]["dataset"],
            "type": group[ID]["type"],
            "terminated_alone": group[_ALONE],
            "charged": group[_CHARGED],
            "free_limit": group[_LIMIT],
            "window_hours": group[_WINDOW],
            "last": f"{utc(group[_LAST]):%Y-%m-%d %H:%M:%S}",
        }
        for group in aggregate_rows(store.events, pipeline)
        if isinstance(group[ID].get("dataset"), str) and isinstance(group[ID].get("type"), str)
    ]
    return sorted(rows, key=lambda row: (-row["charged"], -row["terminated_alone"], row["dataset"], row["type"]))
