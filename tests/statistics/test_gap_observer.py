"""The heartbeat gap observer driven as a watcher drives it: refreshes of the started jobs read by pymongo from the
test's server, time advanced by the test, the jobs written by the simulator and moved by its workers (or, for
planted gaps, heartbeated by the test at chosen moments, as a worker writes its own clock)."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pymongo
import pytest
from pymongo import MongoClient, monitoring

from tests.faults.proxy import REPLY, REQUEST, FaultProxy, Trigger
from tests.helpers import found, logged_store, workload
from tests.simulation.test_workers import VirtualClock
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.cleanup.watch import WATCHED_FIELDS, Listener
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import HEARTBEAT_GAPS_COLLECTION, WORKER_UNTOLD, HeartbeatGaps
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.worker_type_counts import worker_size
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates
from zombie_pipeline.simulation.workload import JOB_TYPES
from zombie_pipeline.statistics.gap_histogram import GapHistogram
from zombie_pipeline.statistics.gap_log import read_day, read_days, read_totals
from zombie_pipeline.statistics.gap_observer import OBSERVED_FIELDS, GapObserver
from zombie_pipeline.statistics.gap_tallies import GapPeriod, GapTally

KEPT = "2023-07"  # finished jobs kept, difficulty recorded
DELETED = "2026-05"  # finished jobs deleted, SIGTERMs recorded
BEAT = 4.0  # the simulated workers' heartbeat, in seconds
START = dt.datetime(2024, 3, 5, 23, 57, tzinfo=dt.UTC)  # three minutes before midnight: gaps of two days
TWO_DAYS = (dt.datetime(2024, 3, 5, tzinfo=dt.UTC), dt.datetime(2024, 3, 7, tzinfo=dt.UTC))


def refresh(store: Store) -> list[dict[str, Any]]:
    """The started jobs as the watcher reads them: one query, its projection."""
    return [dict(job) for job in store.jobs.find({Job.STATUS: Status.STARTED}, dict.fromkeys(WATCHED_FIELDS, 1))]


def test_the_watchers_refresh_reads_every_field_the_observer_needs():
    assert set(OBSERVED_FIELDS) <= {ID, *WATCHED_FIELDS}


def watch(listener: Listener, store: Store, now: dt.datetime) -> None:
    listener.observe(refresh(store), now)


def whole(period: GapPeriod) -> GapTally:
    total = GapTally()
    for tally in period.tallies.values():
        total = total + tally
    return total


class HeartbeatWrites(monitoring.CommandListener):
    """The heartbeats a client wrote: every update of ``last_heartbeat``, counted by the documents it modified."""

    def __init__(self) -> None:
        self.beats = 0
        self._pending: set[int] = set()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        updates = event.command.get("updates", []) if event.command_name == "update" else []
        if any(Job.LAST_HEARTBEAT in (update.get("u") or {}).get("$set", {}) for update in updates):
            self._pending.add(event.request_id)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.request_id in self._pending:
            self._pending.discard(event.request_id)
            self.beats += event.reply.get("nModified", 0)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._pending.discard(event.request_id)


@pytest.fixture
def beats(mongo_url: str, store: Store) -> Iterator[tuple[Store, HeartbeatWrites]]:
    """``store`` through a client of its own whose heartbeat writes are counted: the workers' side."""
    listener = HeartbeatWrites()
    client: MongoClient[Any] = MongoClient(mongo_url, tz_aware=True, event_listeners=[listener])
    try:
        yield Store.of(client[store.jobs.database.name], client[store.cache.database.name]), listener
    finally:
        client.close()


def run_watched(
    store: Store,
    workers_store: Store,
    generation: str,
    rates: WorkerRates,
    policy: ZombiePolicy,
    ticks: int,
    cleanup_every: int | None = None,
) -> tuple[GapObserver, WorkerPool, VirtualClock]:
    """Workers moving a simulated queue for ``ticks`` seconds of virtual time, watched every second and flushed every
    20; a cleanup every ``cleanup_every`` seconds. The pool is stopped, watched once more and flushed at the end."""
    clock = VirtualClock(START)
    simulate(
        store,
        workload(
            finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0, waiting=12,
            generation=generation, cache_generation=None, policy=policy, seed=4,
        ),
        now=clock.now(),
    )  # fmt: skip
    pool = WorkerPool(
        workers_store, QUEUE_GENERATIONS[generation], policy, rates, seed=8, clock=clock.monotonic, now=clock.now
    )
    observer = GapObserver(policy)
    for second in range(1, ticks + 1):
        pool.tick()
        watch(observer, store, clock.now())
        if cleanup_every and second % cleanup_every == 0:
            run_cleanup(store, policy, f"cleanup-{second}", now=clock.now())
        if second % 20 == 0:
            observer.flush(store, clock.now())
        clock.advance(1.0)
    pool.stop()
    watch(observer, store, clock.now())
    observer.flush(store, clock.now())
    return observer, pool, clock


POLICY = ZombiePolicy(
    heartbeat_timeout_seconds=12,
    heartbeat_interval_seconds=4,
    deployment_max_missing_heartbeats=5,  # the deployment's killer would act after 20 s
    max_duration_seconds=120,
    termination_grace_seconds=None,
)
STEADY = WorkerRates(
    workers=6,
    crashes_per_worker_hour=0,
    overruns_per_worker_hour=0,
    speed=0.3,
    heartbeat_seconds=BEAT,
    waiting_target=10,
)


def test_every_heartbeat_the_workers_write_ends_one_gap_the_first_counted_from_the_jobs_start(store: Store, beats):
    workers_store, written = beats

    observer, pool, _ = run_watched(store, workers_store, KEPT, STEADY, POLICY, ticks=240)

    days = read_days(store.heartbeat_gaps, *TWO_DAYS)
    tally = whole(days)
    assert written.beats > 100
    assert tally.gaps.count == written.beats  # one gap per heartbeat, none from the jobs' ends
    assert tally.gaps.counts == {4_000: written.beats}  # each exactly the workers' 4 s, the first from the start
    finished = pool.counts["finished_success"] + pool.counts["finished_error"]
    assert tally.finished.count == finished > 30  # every one watched from its start: its longest silence known
    assert tally.finished.longest <= BEAT  # the silence before a finish is shorter than the next heartbeat
    assert (tally.partly_watched, tally.finalized, tally.ended_unseen, tally.unobserved) == (0, 0, 0, 0)
    sizes = {job_type.name: worker_size(job_type.difficulty) for job_type in JOB_TYPES}
    assert set(days.tallies) <= set(sizes.items())  # each type on the worker size its difficulty says
    assert len({worker for _, worker in days.tallies}) >= 2
    assert set(days.tallies) == set(read_totals(store.heartbeat_gaps).tallies)
    assert whole(read_totals(store.heartbeat_gaps)) == tally
    assert all(read_day(store.heartbeat_gaps, day.date()).gaps for day in (START, START + dt.timedelta(days=1)))
    assert observer.watched == 0 and not observer.skipped


def test_a_job_our_cleanup_finalized_leaves_its_last_gap_open_never_a_sample(store: Store, beats):
    workers_store, written = beats
    crashing = WorkerRates(
        workers=6, crashes_per_worker_hour=90, overruns_per_worker_hour=0, terminated_share=0.5, restart_seconds=3,
        speed=0.3, heartbeat_seconds=BEAT, waiting_target=10,
    )  # fmt: skip

    _, pool, _ = run_watched(store, workers_store, DELETED, crashing, POLICY, ticks=240, cleanup_every=4)

    tally = whole(read_days(store.heartbeat_gaps, *TWO_DAYS))
    finalized = store.events.count_documents({})
    assert pool.counts["died"] >= 5 and pool.counts["terminated"] >= 1
    assert tally.finalized == finalized == len(pool.died) - store.jobs.count_documents({ID: {"$in": pool.died}})
    assert tally.gaps.counts == {4_000: written.beats}  # the dead jobs' silences never became gaps
    assert tally.finished.count == pool.counts["finished_success"] + pool.counts["finished_error"]
    assert tally.finished.longest <= BEAT and tally.ended_unseen == 0


def plant(rng: random.Random, jobs: int) -> list[tuple[list[float], float]]:
    """Per job, its gaps (a minute, a few seconds late; one in 20 stalled up to 3 minutes; the first from its start)
    and the silence between its last heartbeat and its finish, in whole milliseconds."""
    schedule = []
    for _ in range(jobs):
        gaps = [
            round(rng.uniform(60, 180) if rng.random() < 0.05 else 60 + rng.gammavariate(2.0, 2.0), 3)
            for _ in range(rng.randrange(3, 9))
        ]
        schedule.append((gaps, round(rng.uniform(1, 59), 3)))
    return schedule


def test_planted_gaps_are_recorded_as_numpy_counts_them_each_in_the_day_it_ended(store: Store):
    """The test starts simulated waiting jobs and heartbeats them at planted moments, across midnight, watched every
    2 s: the recorded gaps are the planted ones, each in the day its heartbeat ended it, and each finished job's
    longest silence is its longest gap or the silence its finish ended, as last seen."""
    clock = VirtualClock(START)
    simulate(store, workload(finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0,
                             waiting=15, generation=DELETED, cache_generation=None, seed=2), now=clock.now())  # fmt: skip
    schedule = plant(random.Random(5), 15)
    jobs = [job[ID] for job in store.jobs.find({Job.STATUS: Status.WAITING}).sort(ID, 1)]
    events = []  # (moment, job, what): its start, each heartbeat, its finish
    for index, (job_id, (gaps, last_silence)) in enumerate(zip(jobs, schedule)):
        moment = START + dt.timedelta(seconds=3 * index)
        events.append((moment, job_id, "start"))
        for gap in gaps:
            moment += dt.timedelta(seconds=gap)
            events.append((moment, job_id, "beat"))
        events.append((moment + dt.timedelta(seconds=last_silence), job_id, "finish"))
    events.sort(key=lambda event: event[0])
    observer, refreshes = GapObserver(POLICY.model_copy(update={"deployment_max_missing_heartbeats": None})), []
    while events:
        now = clock.advance(2.0)
        while events and events[0][0] <= now:
            moment, job_id, what = events.pop(0)
            if what == "start":
                store.jobs.update_one({ID: job_id}, {"$set": {Job.STATUS: Status.STARTED, Job.STARTED_AT: moment}})
            elif what == "beat":
                store.jobs.update_one({ID: job_id}, {"$set": {Job.LAST_HEARTBEAT: moment}})
            else:
                store.jobs.delete_one({ID: job_id})  # as today's queue finishes a job
        watch(observer, store, now)
        refreshes.append(now)
    observer.flush(store, clock.now())

    planted = [gap for gaps, _ in schedule for gap in gaps]
    recorded = read_days(store.heartbeat_gaps, *TWO_DAYS)
    tally = whole(recorded)
    assert tally.gaps.counts == GapHistogram.of(planted).counts
    assert tally.gaps.longest == max(planted) and tally.gaps.total_seconds == pytest.approx(sum(planted))
    first_day = whole(read_day(store.heartbeat_gaps, START.date()))
    ended_first_day = [
        gap
        for index, (gaps, _) in enumerate(schedule)
        for count, gap in enumerate(gaps, 1)
        if (START + dt.timedelta(seconds=3 * index + sum(gaps[:count]))).date() == START.date()
    ]
    assert first_day.gaps.counts == GapHistogram.of(ended_first_day).counts and 0 < len(ended_first_day) < len(planted)
    longest_silences = []
    for index, (gaps, last_silence) in enumerate(schedule):
        last_beat = START + dt.timedelta(seconds=3 * index + sum(gaps))
        finish = last_beat + dt.timedelta(seconds=last_silence)
        last_seen = max(moment for moment in refreshes if moment < finish)
        longest_silences.append(max(max(gaps), (last_seen - last_beat).total_seconds()))
    assert tally.finished.counts == GapHistogram.of(longest_silences).counts
    assert tally.finished.longest == max(longest_silences)


def test_a_refresh_after_the_watcher_looked_away_too_long_ends_no_gap_and_its_job_is_no_longer_watched_whole(
    store: Store,
):
    clock = VirtualClock(START)
    simulate(store, workload(finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0,
                             waiting=1, generation=DELETED, cache_generation=None), now=clock.now())  # fmt: skip
    [job] = store.jobs.find({Job.STATUS: Status.WAITING})
    store.jobs.update_one({ID: job[ID]}, {"$set": {Job.STATUS: Status.STARTED, Job.STARTED_AT: clock.now()}})
    observer = GapObserver(POLICY)
    watch(observer, store, clock.now())
    for seconds in (10, 10, 30):  # the last refresh comes 30 s after the one before: two heartbeats may hide in it
        now = clock.advance(seconds)
        store.jobs.update_one({ID: job[ID]}, {"$set": {Job.LAST_HEARTBEAT: now - dt.timedelta(seconds=1)}})
        watch(observer, store, now)
    store.jobs.delete_one({ID: job[ID]})
    watch(observer, store, clock.advance(2))
    observer.flush(store, clock.now())

    tally = whole(read_totals(store.heartbeat_gaps))
    assert tally.gaps.counts == GapHistogram.of([9.0, 10.0]).counts  # from its start, then between two beats
    assert tally.unobserved == 1 and tally.finished.count == 0 and tally.partly_watched == 1


def test_a_job_first_seen_after_its_first_heartbeat_counts_its_gaps_from_it_but_not_its_longest_silence(store: Store):
    clock = VirtualClock(START)
    simulate(store, workload(finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=2,
                             waiting=0, generation=KEPT, cache_generation=None), now=clock.now())  # fmt: skip
    running = list(store.jobs.find({Job.STATUS: Status.STARTED}))
    assert all(job.get(Job.LAST_HEARTBEAT) for job in running)  # the simulator's healthy jobs heartbeat already
    observer = GapObserver(POLICY)
    watch(observer, store, clock.now())
    for job in running:
        store.jobs.update_one(
            {ID: job[ID]}, {"$set": {Job.LAST_HEARTBEAT: found(job.get(Job.LAST_HEARTBEAT)) + dt.timedelta(seconds=61)}}
        )
    watch(observer, store, clock.advance(2))
    store.jobs.update_many({ID: {"$in": [job[ID] for job in running]}}, {"$set": {Job.STATUS: Status.SUCCESS}})
    watch(observer, store, clock.advance(2))
    observer.flush(store, clock.now())

    tally = whole(read_totals(store.heartbeat_gaps))
    assert tally.gaps.counts == {61_000: 2}
    assert tally.partly_watched == 2 and tally.finished.count == 0


def test_a_job_gone_after_a_silence_the_deployments_killer_acts_on_is_counted_apart(store: Store):
    clock = VirtualClock(START)
    simulate(store, workload(finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0,
                             waiting=1, generation=DELETED, cache_generation=None), now=clock.now())  # fmt: skip
    [job] = store.jobs.find({Job.STATUS: Status.WAITING})
    store.jobs.update_one({ID: job[ID]}, {"$set": {Job.STATUS: Status.STARTED, Job.STARTED_AT: clock.now()}})
    observer = GapObserver(POLICY)  # the deployment's killer: 5 x 4 s
    for _ in range(11):
        watch(observer, store, clock.advance(2))
    store.jobs.delete_one({ID: job[ID]})  # gone after 22 s of silence, no event of ours: maybe the deployment's killer
    watch(observer, store, clock.advance(2))
    observer.flush(store, clock.now())

    tally = whole(read_totals(store.heartbeat_gaps))
    assert (tally.ended_unseen, tally.finished.count, tally.gaps.count) == (1, 0, 0)


def test_started_jobs_that_cannot_be_read_are_counted_and_left_out(store: Store):
    observer = GapObserver(POLICY)
    now = START
    good: dict[str, Any] = {ID: 1, Job.TYPE: "/splits", Job.STARTED_AT: now, Job.LAST_HEARTBEAT: None}
    bad: list[dict[str, Any]] = [
        {ID: 2, Job.TYPE: None, Job.STARTED_AT: now},
        {ID: 3, Job.TYPE: "/splits", Job.STARTED_AT: "yesterday"},
        {ID: 4, Job.TYPE: "/splits", Job.STARTED_AT: now, Job.LAST_HEARTBEAT: 17},
        {Job.TYPE: "/splits", Job.STARTED_AT: now},
    ]

    for seconds in range(0, 60, 10):
        observer.observe([good, *bad], now + dt.timedelta(seconds=seconds))
    observer.observe(
        [{**good, Job.LAST_HEARTBEAT: now + dt.timedelta(seconds=60)}, *bad], now + dt.timedelta(seconds=61)
    )
    observer.flush(store, now + dt.timedelta(seconds=61))

    assert observer.skipped == Counter(
        {
            "type is missing or not a non-empty string": 7,
            "started_at is not a date": 7,
            "last_heartbeat is not a date": 7,
            "no _id": 7,
        }
    )
    assert read_totals(store.heartbeat_gaps).tallies == {
        ("/splits", WORKER_UNTOLD): GapTally(gaps=GapHistogram.of([60.0]))
    }


def _planted_observer() -> GapObserver:
    """Two jobs watched every 10 s from their start through two heartbeats each, a minute apart."""
    observer = GapObserver(POLICY)
    jobs = [{ID: index, Job.TYPE: "/splits", Job.DIFFICULTY: 50, Job.STARTED_AT: START} for index in (1, 2)]
    for seconds in range(0, 130, 10):
        beat = START + dt.timedelta(seconds=seconds // 60 * 60) if seconds >= 60 else None
        observer.observe([{**job, Job.LAST_HEARTBEAT: beat} for job in jobs], START + dt.timedelta(seconds=seconds))
    return observer


EXPECTED = GapTally(gaps=GapHistogram.of([60.0] * 4))


@pytest.mark.parametrize("phase", [REPLY, REQUEST])
def test_a_flush_whose_write_failed_is_sent_again_and_applied_once_whether_or_not_the_server_had(
    mongo_url: str, store: Store, phase: str
):
    """The proxy resets the connection on the flush's write, after the server applied it (its reply lost) or before
    it saw it: the flush raises, the next one sends it again under its id, and the log holds every gap once."""
    address = urlsplit(mongo_url)
    if address.hostname not in ("127.0.0.1", "localhost") or address.port is None:
        pytest.skip("the proxy forwards to a server on this host")
    observer = _planted_observer()
    with FaultProxy(address.port) as proxy:
        client: MongoClient[Any] = MongoClient(proxy.url(), tz_aware=True, serverSelectionTimeoutMS=3_000)
        through = Store.of(client[store.jobs.database.name], client[store.cache.database.name])
        observer.flush(through, START)  # the gaps, before the fault
        proxy.on(Trigger("update", HEARTBEAT_GAPS_COLLECTION, nth=1, phase=phase), lambda: proxy.reset())
        later = START + dt.timedelta(seconds=130)
        observer.observe([], later)  # both jobs finished 10 s after their last refresh, watched whole
        with pytest.raises(pymongo.errors.PyMongoError):
            observer.flush(through, later)
        proxy.clear()
        observer.flush(through, later)
        observer.flush(through, later)  # nothing new: nothing written
        client.close()

    days = read_day(store.heartbeat_gaps, START.date())
    assert days.tallies == {("/splits", "medium"): GapTally(gaps=EXPECTED.gaps, finished=GapHistogram.of([60.0, 60.0]))}
    assert read_totals(store.heartbeat_gaps).tallies == days.tallies
    for document in store.heartbeat_gaps.find():  # the gaps' flush, then the finished jobs' one, listed once
        assert len(set(document[HeartbeatGaps.FLUSHES])) == len(document[HeartbeatGaps.FLUSHES]) == 2


def test_days_past_the_retention_are_pruned_by_the_first_flush_of_a_day_and_the_totals_kept(store: Store):
    _planted_observer().flush(store, START)
    later = GapObserver(POLICY)

    later.flush(store, START + dt.timedelta(days=91))

    assert read_day(store.heartbeat_gaps, START.date()).tallies == {}
    assert whole(read_totals(store.heartbeat_gaps)) == EXPECTED


def test_a_stored_document_that_cannot_be_read_is_counted_and_the_others_kept(store: Store):
    _planted_observer().flush(store, START)
    store.heartbeat_gaps.insert_one(
        {ID: "broken", HeartbeatGaps.DAY: START.date().isoformat(), HeartbeatGaps.TYPE: "/x", HeartbeatGaps.WORKER: "light",
         HeartbeatGaps.GAPS: {"sixty": 3}}
    )  # fmt: skip

    day = read_day(store.heartbeat_gaps, START.date())

    assert day.malformed == 1 and whole(day) == EXPECTED


def test_the_day_index_serves_a_days_read(store: Store, mongo_url: str):
    _planted_observer().flush(store, START)
    with logged_store(mongo_url, store) as (logged, log):
        read_day(logged.heartbeat_gaps, START.date())
    [find] = log.named("find")
    assert find["filter"] == {HeartbeatGaps.DAY: START.date().isoformat()}
    plan = store.heartbeat_gaps.find({HeartbeatGaps.DAY: START.date().isoformat()}).explain()
    assert "IXSCAN" in str(plan) or "zombie_pipeline_day" in str(plan)
