"""Past days as a deployment cleaned daily leaves them: the audit trail of its cleanups, their cache errors.

On each of the ``days`` before today a few workers died (crashed, never
heartbeated, SIGTERMed, or alive far past their maximum duration) and the
day's cleanup finalized them, and one dataset, :data:`OFFENDER`, crashed its
``/first-rows`` worker every day: a repeat offender at its retry limit. Each
day is done by the cleanup's own code: detection at that day's moment, the
claim as the cleanup builds it (``events.event_of``) stamped at that moment,
then the cleanup's finalization, which finishes each job as the generation
does and writes its cache error at the claim's time. What the cleanup stamps
with the present instead is set back to that day (the event's completion), and
what the deployment would have forgotten since is removed (``pastJobs`` older
than an hour: the rate limiter's TTL). Retries are left to the deployment, as
the cleanup does by default from 2023-12 on, so that no day's retry waits in
today's queue.

The statistics' windows, their daily trends and ``repeat_offenders`` have
content from the first run on.

Running the cleanup's own code here (detection, events, the finalizer, and with
it the cleanup's bookkeeping) is what these days are: past runs of our cleanup.
What the deployment itself wrote that day (the zombies' starts and their
counters) goes through the simulated deployment's model, as the workers'
writes do (``deployment_writes.py``), never the cleanup's.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from dataclasses import dataclass

from zombie_pipeline.cleanup import compensations
from zombie_pipeline.cleanup.detection import detect
from zombie_pipeline.cleanup.events import event_of
from zombie_pipeline.cleanup.finalizer import Finalizer
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event
from zombie_pipeline.queue.generations import CacheGeneration, QueueGeneration
from zombie_pipeline.queue.jobs import ID, Job, JobDocument
from zombie_pipeline.queue.past_jobs import PAST_JOBS_TTL, PastJob
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms
from zombie_pipeline.simulation.deployment_writes import DeploymentWrites

#: The dataset whose ``/first-rows`` worker dies every day: (type, dataset, config, split).
OFFENDER = ("/first-rows", "user42/endless-audio", "default", "train")
#: Other zombies of a day, at random in this range.
ZOMBIES_PER_DAY = (2, 5)
#: The run id of a past day's cleanup: this, then the moment it ran (``20261130T1932``).
RUN_ID_PREFIX = "simulated-cleanup-"
#: How long ``pastJobs`` keeps a run (the deployment's TTL index).

#: Makes a started job of a kind (``crashed``, ``overdue``, ...) as it stands at a moment: a zombie then.
JobMaker = Callable[[str, dt.datetime], JobDocument]


@dataclass(frozen=True)
class PastCleanups:
    """What the past days' cleanups finalized."""

    days: int
    finalized: int
    offender_finalized: int
    run_ids: tuple[str, ...]


def clean_past_days(
    store: Store,
    generation: QueueGeneration,
    cache: CacheGeneration,
    policy: ZombiePolicy,
    days: int,
    now: dt.datetime,
    zombie: JobMaker,
    offender: Callable[[dt.datetime], JobDocument],
    rng: random.Random,
) -> PastCleanups:
    """On each of the ``days`` before ``now``'s, place that day's zombies and finalize them as its cleanup did."""
    policy = policy.model_copy(update={"enqueue_retries": False})
    writes = DeploymentWrites(store, generation)
    midnight = dt.datetime.combine(now.date(), dt.time(), tzinfo=dt.UTC)
    kinds = ["crashed", "never_heartbeated", "overdue"] + (
        ["terminated"] if generation.declares(Job.TERMINATED_AT) else []
    )
    finalized = offended = 0
    run_ids = []
    for days_ago in range(days, 0, -1):
        at = truncate_ms(midnight - dt.timedelta(days=days_ago, hours=-rng.uniform(6, 20)))
        jobs = [zombie(rng.choice(kinds), at) for _ in range(rng.randint(*ZOMBIES_PER_DAY))] + [offender(at)]
        store.jobs.insert_many(jobs)
        writes.count_started(jobs)
        placed = {job[ID] for job in jobs}
        candidates = [c for c in detect(store.jobs, policy, at).candidates if c.id in placed]
        run_id = f"{RUN_ID_PREFIX}{at:%Y%m%dT%H%M}"
        finalized_at = truncate_ms(at + dt.timedelta(seconds=rng.uniform(1, 30)))
        claims = [event_of(candidate, policy, run_id, finalized_at, at, generation) for candidate in candidates]
        if claims:
            store.events.insert_many(claims)
            Finalizer.build(store, run_id, policy, generation, cache, compensations.registry(policy)).finalize()
            store.events.update_many({Event.RUN_ID: run_id}, {"$set": {Event.COMPLETED_AT: finalized_at}})
        finalized += len(claims)
        offended += sum(1 for job in jobs if job[ID] in {c.id for c in candidates} and job[Job.DATASET] == OFFENDER[1])
        run_ids.append(run_id)
    if store.past_jobs.name in store.queue_collection_names():
        store.past_jobs.delete_many({PastJob.FINISHED_AT: {"$lt": now - PAST_JOBS_TTL}})
    return PastCleanups(days=days, finalized=finalized, offender_finalized=offended, run_ids=tuple(run_ids))
