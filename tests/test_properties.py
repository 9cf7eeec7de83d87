"""Property: whatever the interleaving of workers and cleanup steps, and wherever a step dies,
a success is never turned into an error, a job is finalized at most once, a reconcile leaves
every finalized zombie with its cache entry, and no entry fresher than a zombie is overwritten.

Hypothesis draws a small queue (1 to 5 started jobs of every kind, each with or without an
older or a fresher cache entry) and a sequence of actions: worker heartbeats, worker
completions (the response is written, then the job is marked finished, as a datasets-server
worker does), and the cleanup's steps called one by one — detect and claim, finalize, cache
errors, retries, reconcile — by two runs, each step possibly dying after its k-th write.
``claim_lease_seconds=0``: any run may take over any unfinished event, so the steps of two
runs interleave on the same events. The invariants are checked after every action.

``ZOMBIE_PROPERTY_EXAMPLES`` sets the number of examples (default 40).
"""

from __future__ import annotations

import datetime as dt
import os
from collections import Counter
from dataclasses import dataclass, field

from bson import ObjectId
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import helpers
from tests.figures import report_figures
from tests.helpers import Crash, crashing, found, job_document
from zombie_pipeline.cleanup import run
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import CacheOutcome, Event, EventState
from zombie_pipeline.queue.cache import CACHE_KEY, HTTP_OK, Cache, CacheEntry, cache_key_of_job
from zombie_pipeline.queue.cache_entries import failed_runs_after_crash, stored_failed_runs
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import cache_document

EXAMPLES = int(os.environ.get("ZOMBIE_PROPERTY_EXAMPLES", "40"))
POLICY = ZombiePolicy(heartbeat_timeout_seconds=300, max_duration_seconds=1200, claim_lease_seconds=0, batch_size=2)
RUNS = ("run-A", "run-B")
TYPES = ("/splits", "/first-rows", "/config-names")

#: started, last heartbeat: seconds before the example starts (None: never beat)
KINDS = {
    "stale": (900, 800),
    "never_beat": (900, None),
    "overdue": (5_000, 10),
    "healthy": (900, 10),
}
#: the cache entry already there: (seconds relative to the job's start, http status)
CACHES = {
    "none": None,
    "older_error": (-86_400, 500),
    "older_success": (-86_400, HTTP_OK),
    "fresher_success": (60, HTTP_OK),
    "fresher_error": (60, 500),
}


# --- strategies ---------------------------------------------------------------------------------

budgets = st.one_of(st.none(), st.integers(min_value=0, max_value=4))  # a pass writes jobs, cache, retries, events
runs = st.sampled_from(RUNS)
actions = st.one_of(
    st.tuples(st.just("claim"), runs, budgets),  # twice: most sequences should claim early
    st.tuples(st.just("beat"), st.integers(0, 4)),
    st.tuples(st.just("complete"), st.integers(0, 4), st.booleans()),
    st.tuples(st.just("claim"), runs, budgets),
    st.tuples(st.just("finalize"), runs, budgets),
    st.tuples(st.just("finalize"), runs, budgets),
    st.tuples(st.just("reconcile"), runs, budgets),
)
#: each job: its kind, its cache entry, and whether it shares the previous job's unicity_id (a queue whose
#: one-started-job-per-unicity_id rule was broken by a race: both jobs then write the same cache entry)
queues = st.lists(
    st.tuples(
        st.sampled_from(sorted(KINDS)), st.sampled_from(sorted(CACHES)), st.sampled_from([False, False, False, True])
    ),
    min_size=1,
    max_size=5,
)


# --- the model ------------------------------------------------------------------------------------


@dataclass
class World:
    store: Store
    jobs: list[JobDocument]
    started_at: dict[ObjectId, dt.datetime]
    prior_failed_runs: dict[ObjectId, int]
    succeeded: set = field(default_factory=set)  # the worker marked the job success
    worker_finished: set = field(default_factory=set)  # the worker marked the job success or error
    completed: set = field(default_factory=set)
    finalized_stamp: dict[ObjectId, dt.datetime] = field(default_factory=dict)
    trace: list = field(default_factory=list)
    figures: Counter = field(default_factory=Counter)

    def key_of(self, job: JobDocument) -> tuple:
        return tuple(cache_key_of_job(job).values())


def build(store: Store, queue: list[tuple[str, str, bool]]) -> World:
    for collection in (store.jobs, store.cache, store.events):
        collection.delete_many({})
    now = utc_now()
    jobs: list[JobDocument] = []
    entries: list[CacheEntry] = []
    world = World(store=store, jobs=jobs, started_at={}, prior_failed_runs={})
    for i, (kind, cache, shared) in enumerate(queue):
        started, beat = KINDS[kind]
        target = i - 1 if shared and i > 0 else i
        while target > 0 and queue[target][2]:  # follow a chain of shared targets to its first job
            target -= 1
        job = job_document(
            job_type=TYPES[target % len(TYPES)],
            dataset=f"user/d{target}",
            started_at=now - dt.timedelta(seconds=started),
            last_heartbeat=None if beat is None else now - dt.timedelta(seconds=beat),
        )
        jobs.append(job)
        world.started_at[job[ID]] = job[Job.STARTED_AT]
        spec = CACHES[cache] if target == i else None  # one entry per key (the cache's unique index)
        entry = None
        if spec is not None:
            offset, status = spec
            entry = cache_document(
                job,
                job[Job.STARTED_AT] + dt.timedelta(seconds=offset),
                http_status=status,
                error_code=None if status == HTTP_OK else "UnexpectedError",
                failed_runs=0 if status == HTTP_OK else 1,
            )
            entries.append(entry)
        # what the cache counted before the zombie, as the deployment counts it on a crash
        world.prior_failed_runs[job[ID]] = (
            failed_runs_after_crash(entry, job) - 1 if target == i else world.prior_failed_runs[jobs[target][ID]]
        )
    store.jobs.insert_many(jobs)
    if entries:
        store.cache.insert_many(entries)
    return world


def act(world: World, action: tuple) -> None:
    store = world.store
    name = action[0]
    world.trace.append(action)
    if name == "beat":
        job = world.jobs[action[1] % len(world.jobs)]
        # unconditional, as the early-2023 worker beat: even a job already finalized gets a newer heartbeat
        store.jobs.update_one({ID: job[ID]}, {"$set": {Job.LAST_HEARTBEAT: utc_now()}})
        return
    if name == "complete":
        job = world.jobs[action[1] % len(world.jobs)]
        if job[ID] in world.completed:
            return
        world.completed.add(job[ID])
        success = action[2]
        stamp = utc_now()
        entry = cache_document(
            job,
            stamp,
            http_status=HTTP_OK if success else 500,
            error_code=None if success else "UnexpectedError",
            failed_runs=0 if success else 1,
        )
        entry[Cache.DETAILS] = {**entry.get(Cache.DETAILS, {}), "written_by": "worker", "job_id": str(job[ID])}
        store.cache.replace_one(cache_key_of_job(job), entry, upsert=True)
        marked = store.jobs.update_one(
            {ID: job[ID], Job.STATUS: Status.STARTED},
            {"$set": {Job.STATUS: Status.SUCCESS if success else Status.ERROR, Job.FINISHED_AT: stamp}},
        )
        if marked.modified_count:
            world.worker_finished.add(job[ID])
            if success:
                world.succeeded.add(job[ID])
        else:
            world.figures["worker_finished_after_finalization"] += 1
        return
    run_id, writes = action[1], action[2]
    steps = crashing(store, writes)
    before = cache_entries(world)
    try:
        if name == "claim":
            detection = helpers.find(steps, POLICY, override_brake=True)
            helpers.finalizer_for(steps, POLICY, run_id).claim(detection.candidates, utc_now())
        elif name == "finalize":
            helpers.finalizer_for(steps, POLICY, run_id).finalize()
        elif name == "reconcile":
            run.reconcile(steps, helpers.plan_for(steps, POLICY, run_id), now=utc_now() + dt.timedelta(seconds=1))
    except Crash:
        world.figures["crashes"] += 1
        check_cache_changes(world, before)
        return
    check_cache_changes(world, before)
    world.figures[f"{name}_completed"] += 1
    if name == "reconcile":
        check_after_reconcile(world)


# --- invariants ------------------------------------------------------------------------------------


def cache_entries(world: World) -> dict[tuple, CacheEntry]:
    return {tuple(entry.get(name) for name in CACHE_KEY): entry for entry in world.store.cache.find()}


def check_cache_changes(world: World, before: dict[tuple, CacheEntry]) -> None:
    """What one cleanup step did to the cache: only error entries replacing entries older than their zombie."""
    after = cache_entries(world)
    where = f"after {world.trace}"
    assert set(before) <= set(after), f"a cache entry disappeared {where}"
    for key, entry in after.items():
        old = before.get(key)
        if old == entry:
            continue
        details = entry.get(Cache.DETAILS) or {}
        assert "written_by" not in details and "job_id" in details, where
        zombie_started = world.started_at[ObjectId(details["job_id"])]
        # no cache entry newer than the zombie's start is overwritten
        assert old is None or old[Cache.UPDATED_AT] < zombie_started, f"a fresher entry was overwritten {where}"
        world.figures["cache_entries_replaced" if old else "cache_entries_created"] += 1


def state(world: World) -> tuple[dict, dict, dict]:
    jobs = {job[ID]: job for job in world.store.jobs.find()}
    entries = {tuple(entry.get(name) for name in CACHE_KEY): entry for entry in world.store.cache.find()}
    events = {event[ID]: event for event in world.store.events.find()}
    return jobs, entries, events


def check(world: World) -> None:
    jobs, entries, events = state(world)
    where = f"after {world.trace}"
    for job_id in world.succeeded:  # a successful job never becomes an error
        assert jobs[job_id][Job.STATUS] == Status.SUCCESS, where
    for job in world.jobs:
        current = jobs[job[ID]]
        event = events.get(job[ID])
        finalized = event is not None and event[Event.STATE] == EventState.DONE
        if finalized:
            # the job is the cleanup's error, stamped with its event's instant
            assert current[Job.STATUS] == Status.ERROR, where
            assert current[Job.FINISHED_AT] == found(event)[Event.FINALIZED_AT], where
            assert job[ID] not in world.worker_finished, where
        if job[ID] in world.finalized_stamp:  # finalized at most once: the stamp never moves
            assert current[Job.STATUS] == Status.ERROR and current[Job.FINISHED_AT] == world.finalized_stamp[job[ID]], (
                where
            )
            assert finalized, f"the event of a finalized job vanished {where}"
        elif finalized:
            world.finalized_stamp[job[ID]] = current[Job.FINISHED_AT]
            world.figures["finalized"] += 1
        if event is not None and event.get(Event.CACHE_OUTCOME) == CacheOutcome.WRITTEN:
            entry = entries.get(world.key_of(job))
            if entry is not None and entry[Cache.UPDATED_AT] == event[Event.FINALIZED_AT]:
                runs = stored_failed_runs(entry)  # the field, or ``details`` where the cache's generation has none
                assert runs == world.prior_failed_runs[job[ID]] + 1, f"failed runs counted twice {where}"
    waiting = Counter(job[Job.UNICITY_ID] for job in jobs.values() if job[Job.STATUS] == Status.WAITING)
    assert all(count == 1 for count in waiting.values()), f"a retry enqueued twice {where}"
    retry_ids = [event[Event.RETRY_JOB_ID] for event in events.values()]
    assert len(retry_ids) == len(set(retry_ids)), where


def check_after_reconcile(world: World) -> None:
    """A reconcile took over every unfinished event: each finalized zombie has its cache entry."""
    jobs, entries, events = state(world)
    where = f"after {world.trace}"
    for event in events.values():
        assert event[Event.STATE] == EventState.DONE, where
        job = jobs[event[ID]]
        entry = entries.get(world.key_of(job))
        assert entry is not None, f"no cache entry for a finalized zombie {where}"
        ours = entry[Cache.UPDATED_AT] == event[Event.FINALIZED_AT]
        fresher = entry[Cache.UPDATED_AT] > world.started_at[job[ID]]
        assert ours or fresher, where
        if event[Event.CACHE_OUTCOME] == CacheOutcome.SKIPPED_FRESHER:
            assert fresher, where
    world.figures["reconciles_checked"] += 1


# --- the property ------------------------------------------------------------------------------------


def test_any_interleaving_of_workers_and_cleanup_steps_keeps_the_invariants(store: Store):
    """Every example is checked as it runs; then what the examples exercised, summed, must cover each kind of event."""
    figures: Counter = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
        derandomize=True,  # the same examples every run: the coverage asserted below cannot vanish by chance
    )
    @given(queue=queues, steps=st.lists(actions, min_size=1, max_size=12))
    def interleaving(queue, steps):
        world = build(store, queue)
        check(world)
        for action in steps:
            act(world, action)
            check(world)
        # then the cleanup runs to the end: every zombie left is finalized, every event completed
        act(world, ("reconcile", "final", None))
        check(world)
        run_cleanup(store, POLICY, "final-run", override_brake=True)
        act(world, ("reconcile", "final-2", None))
        check(world)
        assert helpers.find(store, POLICY, override_brake=True).candidates == []
        figures.update(world.figures)
        figures["examples"] += 1
        figures["actions"] += len(steps)

    interleaving()

    report_figures("property", {"max_examples": EXAMPLES, **dict(sorted(figures.items()))})
    assert figures["finalized"] > 0 and figures["crashes"] > 0 and figures["reconciles_checked"] > 0
