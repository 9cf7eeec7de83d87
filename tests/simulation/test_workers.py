"""Simulated workers, in every queue generation: a queue that moves as the deployment's does, and dies as it does.

A virtual clock drives each pool through two minutes of work in a moment: the dates the workers write
and the ones detection judges by come from the same clock, so heartbeats, timeouts and maximum durations
are real for every party.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from pymongo import MongoClient, monitoring

from tests.helpers import found, workload
from tests.servers import running_server
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.detection import detect
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.cache import Cache
from zombie_pipeline.queue.connections import client_for, close_clients
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.locks import LOCKS_COLLECTION, Lock
from zombie_pipeline.queue.reasons import Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.marks import SIMULATED_WORKERS_COLLECTION, WorkersClaim
from zombie_pipeline.simulation.shapes import cache_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import QueueClaim, WorkerPool, WorkerRates, WorkersRunning
from zombie_pipeline.simulation.workload import WorkloadError

#: Jobs of a few seconds (their type's duration times 0.02), dead after 10 s of silence, overdue after 30 s.
POLICY = ZombiePolicy(heartbeat_timeout_seconds=10, max_duration_seconds=30)
#: Crashes and overruns every few seconds of a worker's work: the whole life of a queue within two minutes.
RATES = WorkerRates(
    workers=3,
    crashes_per_worker_hour=60,
    overruns_per_worker_hour=900,
    max_overrunning_share=1.0,
    restart_seconds=4,
    speed=0.02,
    heartbeat_seconds=4,
    waiting_target=6,
)
TICK_SECONDS = 2.0
MAX_TICKS = 300  # 10 minutes at most; both kinds of zombie usually show within two


class VirtualClock:
    """Seconds for the pool's schedule and the dates it writes, moved by the test only."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.start = start or utc_now()
        self.seconds = 0.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> dt.datetime:
        return self.start + dt.timedelta(seconds=self.seconds)

    def advance(self, seconds: float) -> dt.datetime:
        self.seconds += seconds
        return self.now()


def alive(pool: WorkerPool) -> set:
    """The jobs the pool's living workers hold (a worker that died holds nothing: its job is in ``pool.died``)."""
    return {run.job[ID] for run in pool.runs if run is not None}


def both_kinds_of_zombie(store: Store, pool: WorkerPool, now: dt.datetime) -> bool:
    """A live job past its maximum duration, and a dead worker's job silent for longer than the timeout."""
    limit, timeout = (dt.timedelta(seconds=s) for s in (POLICY.max_duration_seconds, POLICY.heartbeat_timeout_seconds))
    started = {job[ID]: job for job in store.jobs.find({Job.STATUS: Status.STARTED})}
    overdue = any(now - started[i][Job.STARTED_AT] > limit for i in alive(pool) if i in started)
    dead = any(now - silent_since(started[i]) > timeout for i in pool.died if i in started)
    return overdue and dead


def silent_since(job: Mapping[str, Any]) -> dt.datetime:
    """Since when a dead worker's job has said nothing: its SIGTERM, else its last heartbeat, else its start."""
    return job.get(Job.TERMINATED_AT) or job.get(Job.LAST_HEARTBEAT) or job[Job.STARTED_AT]


def declared_fields_only(store: Store, generation_name: str) -> None:
    generation = QUEUE_GENERATIONS[generation_name]
    cache_generation = CACHE_GENERATIONS[generation.cache_generation]
    for job in store.jobs.find():
        assert set(job) - {ID} <= generation.job_fields, job
        assert job[Job.STATUS] in generation.statuses, job
    for entry in store.cache.find():
        assert set(entry) - {ID} <= cache_generation.fields, entry
    locks = list(store.locks.find())
    assert not locks or generation.keeps(LOCKS_COLLECTION)
    for lock in locks:
        assert set(lock) - {ID} <= generation.lock_fields, lock


@pytest.mark.parametrize("generation", list(QUEUE_GENERATIONS))
def test_workers_move_the_queue_as_the_generation_does_and_their_crashes_and_overruns_become_zombies(
    store: Store, generation: str
):
    clock = VirtualClock()
    simulate(
        store,
        workload(
            finished=0,
            crashed=0,
            never_heartbeated=0,
            terminated=0,
            overdue=0,
            running=6,
            waiting=8,
            generation=generation,
            cache_generation=None,
            policy=POLICY,
            seed=5,
        ),
        now=clock.now(),
    )
    pool = WorkerPool(store, QUEUE_GENERATIONS[generation], POLICY, RATES, seed=3, clock=clock.monotonic, now=clock.now)
    assert pool.adopt_running() == 6  # the simulated healthy jobs are the pool's to beat and finish

    for _ in range(MAX_TICKS):  # until both kinds of zombie are there to judge (an overrun is one for a while only)
        pool.tick()
        clock.advance(TICK_SECONDS)
        if both_kinds_of_zombie(store, pool, clock.now()):
            break
    generation_ = QUEUE_GENERATIONS[generation]

    assert counters.stored(store, generation_) == counters.recount(store, generation_)
    declared_fields_only(store, generation)
    assert pool.counts["finished_success"] > 5 and pool.counts["died"] == len(pool.died) > 0
    # Judged now: a dead worker's job silent for longer than the timeout is a zombie (a crash, whatever its age); a
    # live job running past its maximum duration is one too; every other live job beats and is spared.
    now = clock.now()
    reasons = {candidate.id: candidate.reason for candidate in detect(store.jobs, POLICY, now).candidates}
    jobs = {job[ID]: job for job in store.jobs.find({ID: {"$in": list(alive(pool) | set(pool.died))}})}
    overdue = {i for i in alive(pool) if (now - jobs[i][Job.STARTED_AT]).total_seconds() > POLICY.max_duration_seconds}
    dead = {i for i in pool.died if (now - silent_since(jobs[i])).total_seconds() > POLICY.heartbeat_timeout_seconds}
    assert overdue and dead
    assert set(reasons) == overdue | dead
    assert {reasons[i] for i in overdue} == {Reason.EXCEEDED_MAX_DURATION}
    assert {reasons[i] for i in dead} <= {Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.TERMINATED}
    if generation_.declares(Job.TERMINATED_AT):
        assert pool.counts["terminated"] > 0
        assert Reason.TERMINATED in {reasons[i] for i in dead}

    report = run_cleanup(store, POLICY, "cleanup-amid-workers", now=now)
    assert report.counts["finalized"] == len(overdue | dead)
    for _ in range(15):  # 30 s: the workers holding the overruns the cleanup finished see it at their next beat
        pool.tick()
        clock.advance(TICK_SECONDS)
    pool.stop()

    assert pool.counts["finished_by_someone_else"] >= len(overdue)
    left = {job[ID] for job in store.jobs.find({Job.STATUS: Status.STARTED}, {ID: 1})}
    assert left == set(pool.died) - dead  # the dead the cleanup did not judge yet stay zombies; nobody else is started
    assert counters.stored(store, generation_) == counters.recount(store, generation_)
    declared_fields_only(store, generation)


@pytest.mark.parametrize(
    ("rates", "named"),
    [
        ({"workers": 0}, "workers"),
        ({"crashes_per_worker_hour": -1}, "crashes_per_worker_hour"),
        ({"overruns_per_worker_hour": -0.1}, "overruns_per_worker_hour"),
        ({"max_overrunning_share": 1.5}, "max_overrunning_share"),
        ({"restart_seconds": -1}, "restart_seconds"),
        ({"speed": 0}, "speed"),
        ({"heartbeat_seconds": -1}, "heartbeat_seconds"),
        ({"waiting_target": -1}, "waiting_target"),
    ],
)
def test_a_bad_rate_is_refused_naming_it(rates: dict, named: str):
    with pytest.raises(WorkloadError, match=named):
        WorkerRates(**rates)


# --- run for hours: a line a minute, a database outage, one process per queue, a lock another worker holds ---------

#: The policy the steady queue is simulated with, and judged by: jobs of the default durations and thresholds.
DEFAULT_POLICY = ZombiePolicy()
#: Jobs of a minute or more, beating every second, never crashing nor overrunning: who holds what stays known.
STEADY = WorkerRates(workers=2, crashes_per_worker_hour=0, overruns_per_worker_hour=0, heartbeat_seconds=1)


def steady_queue(store: Store) -> None:
    """A simulated queue of today: 4 healthy started jobs, 6 waiting, beside the simulator's marker."""
    simulate(
        store,
        workload(
            finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=4, waiting=6,
            generation=NEWEST, cache_generation=None,
        ),
    )  # fmt: skip


NEWEST = list(QUEUE_GENERATIONS)[-1]
#: What a pool says it was doing when a database error meets it.
STEPS = (
    "heartbeating the jobs in flight",
    "finishing a job",
    "starting a job",
    "letting a worker die",
    "topping the waiting jobs up",
)
STARTED = {Job.STATUS: Status.STARTED}


def test_a_pool_run_for_long_says_what_its_workers_did_once_a_period(store: Store):
    steady_queue(store)
    lines: list[str] = []
    pool = WorkerPool(store, QUEUE_GENERATIONS[NEWEST], DEFAULT_POLICY, STEADY, say=lines.append, report_seconds=1.0)
    pool.adopt_running()

    pool.run(3.6, interval=0.2)

    reports = [line for line in lines if " UTC, the last 1 s: " in line]
    assert 2 <= len(reports) <= 4, lines
    assert all(re.fullmatch(REPORT_LINE, line) for line in reports), reports
    assert all(f" in flight on {pool.workers} workers" in line for line in reports)
    assert sum(int(found(re.search(r"(\d+) enqueued", line)).group(1)) for line in reports) <= pool.counts["enqueued"]


#: What a report line says: what the workers did in the period, and what they hold.
REPORT_LINE = (
    r"\d\d:\d\d:\d\d UTC, the last 1 s: \d+ started, \d+ finished \(\d+ in error, \d+ stopped at (its|their) maximum "
    r"duration\), \d+ died, \d+ finalized by a cleanup, \d+ enqueued; \d+ jobs? in flight on \d+ workers?"
)


def test_the_stop_summary_counts_the_deaths_that_happened_not_the_crashes_planned_for_jobs_finished_at_the_stop(
    store: Store,
):
    steady_queue(store)
    doomed = replace(STEADY, crashes_per_worker_hour=3_600.0)  # a crash planned within a second or so of each job
    pool = WorkerPool(store, QUEUE_GENERATIONS[NEWEST], DEFAULT_POLICY, doomed, seed=2)
    pool.adopt_running()
    pool.tick()
    planned = [run for run in pool.runs if run is not None and run.fate.name == "CRASH"]
    assert planned, "no crash planned: another seed"

    pool.stop()  # before any of them came

    assert pool.counts["died"] == len(pool.died) == 0 and "crashed" not in pool.counts
    assert ", 0 died, " in pool.summary() and "crash" not in pool.summary()


def test_a_pool_outlives_a_database_outage_saying_so_once_and_beats_again_once_it_answers(tmp_path):
    """The test's own server is stopped for 6 s and started again on the same port and storage."""
    with running_server(tmp_path / "server") as server:
        client = client_for(server.url, timeout_ms=1_000, retry_writes=False)
        store = Store.of(client["queue"], client["cache"])
        store.ensure_indexes()
        steady_queue(store)
        lines: list[str] = []
        pool = WorkerPool(store, QUEUE_GENERATIONS[NEWEST], DEFAULT_POLICY, STEADY, say=lines.append)
        assert pool.adopt_running() == 4
        stopping = threading.Event()
        running = threading.Thread(target=pool.run, args=(300, stopping.is_set, 0.2), daemon=True)
        running.start()
        try:
            time.sleep(2)
            server.stop()
            time.sleep(6)
            assert running.is_alive()  # not a traceback: the pool waits for the database
            server.start()
            back = utc_now()
            deadline = time.monotonic() + 60  # attempts 1, 2, 4, 8 ... s apart: the next one within 16 s of the start
            while time.monotonic() < deadline and not any("answers again" in line for line in lines):
                time.sleep(0.2)
            time.sleep(2)  # heartbeats every second from then on
            # a job held since before the outage was beaten since; one started since has its start. (A start whose
            # reply the outage cut is not known to the pool: its job is left started, as by a worker that died.)
            held = [run.job[ID] for run in pool.runs if run is not None]
            beats = [job.get(Job.LAST_HEARTBEAT) or job[Job.STARTED_AT] for job in store.jobs.find({ID: {"$in": held}})]
        finally:
            stopping.set()
            running.join(timeout=60)
            close_clients(server.url)

    outages = [line for line in lines if "try again" in line]
    assert len(outages) == 1 and len([line for line in lines if "answers again" in line]) == 1, lines
    assert re.match(rf"({'|'.join(STEPS)}): \w+: ", outages[0]), outages[0]  # what it was doing, then the error
    assert re.search(r"; the workers hold \d jobs and try again, waiting up to 30 s between attempts$", outages[0])
    assert len(beats) >= 2 and all(beat >= back for beat in beats)  # none silent since the outage
    assert not running.is_alive()


def test_a_second_claim_on_a_queue_is_refused_naming_the_process_and_an_expired_one_is_taken_over(store: Store):
    first = QueueClaim.of(store, renew_seconds=0)  # renewed at every tick
    first.take()

    with pytest.raises(WorkersRunning) as refused:
        QueueClaim.of(store).take()
    assert f"simulated workers already run on this queue (pid {os.getpid()} on {socket.gethostname()}, since " in str(
        refused.value
    )
    assert "\n" not in str(refused.value)

    claims = store.jobs.database[SIMULATED_WORKERS_COLLECTION]
    claims.update_one({}, {"$set": {WorkersClaim.RENEWED_AT: utc_now() - dt.timedelta(seconds=61)}})  # killed
    second = QueueClaim.of(store)
    second.take()
    with pytest.raises(WorkersRunning, match="took this queue over"):
        first.renew()  # the first one, back after an outage longer than its claim: it stops
    second.release()
    assert claims.count_documents({}) == 0


def test_a_start_lock_another_worker_holds_makes_a_worker_look_further_not_crash(store: Store):
    simulate(
        store,
        workload(
            finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0, waiting=2,
            generation=NEWEST, cache_generation=None,
        ),
    )  # fmt: skip
    first, second = store.jobs.find({Job.STATUS: Status.WAITING}).sort(Job.CREATED_AT, 1)
    store.locks.replace_one(
        {ID: first[Job.UNICITY_ID]},
        {Lock.OWNER: "another worker", Lock.UPDATED_AT: utc_now(), Lock.TTL: 600},
        upsert=True,
    )
    pool = WorkerPool(store, QUEUE_GENERATIONS[NEWEST], DEFAULT_POLICY, replace(STEADY, workers=1, waiting_target=0))

    pool.tick()

    started = [job[ID] for job in store.jobs.find({Job.STATUS: Status.STARTED})]
    assert started == [second[ID]]


class SlowServer(monitoring.CommandListener):
    """A server whose every command costs ``seconds`` of the pool's virtual time; the heartbeats written, with when."""

    def __init__(self, clock: VirtualClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds
        self.beats: list[tuple[float, list]] = []  # (virtual seconds, the jobs it beat)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.clock.advance(self.seconds)
        if event.command_name == "update":
            for update in event.command["updates"]:
                if Job.LAST_HEARTBEAT in update["u"].get("$set", {}):
                    self.beats.append((self.clock.seconds, list(update["q"][ID]["$in"])))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_heartbeats_are_never_held_behind_a_ticks_finishes_and_starts_on_a_slow_server(mongo_url, store: Store):
    """Every command takes 100 ms: a tick finishing and starting a few jobs lasts seconds, as on a loaded host, and
    the jobs it does not touch must still beat every second (a cleanup meanwhile would take them for dead)."""
    clock = VirtualClock()
    slow = SlowServer(clock, 0.1)
    client: MongoClient[dict[str, Any]]
    with MongoClient(mongo_url, tz_aware=True, tzinfo=dt.UTC, event_listeners=[slow]) as client:
        slow_store = Store.of(client[store.jobs.database.name], client[store.cache.database.name])
        simulate(
            slow_store,
            workload(
                finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=20, waiting=30,
                generation=NEWEST, cache_generation=None,
            ),
            now=clock.now(),
        )  # fmt: skip
        rates = replace(STEADY, speed=0.05, waiting_target=30)  # jobs of seconds: several end in every tick
        pool = WorkerPool(
            slow_store, QUEUE_GENERATIONS[NEWEST], DEFAULT_POLICY, rates, clock=clock.monotonic, now=clock.now
        )
        pool.adopt_running()
        ticks = []
        for _ in range(8):
            started = clock.seconds
            pool.tick()
            ticks.append(clock.seconds - started)
            clock.advance(0.25)

    last: dict = {}
    gaps = []
    for moment, ids in slow.beats:
        gaps += [moment - last[job] for job in ids if job in last]
        last.update(dict.fromkeys(ids, moment))
    assert max(ticks) > 10 * STEADY.heartbeat_seconds  # each finishes and starts every worker's job: long ticks
    assert pool.counts["finished_success"] + pool.counts["finished_error"] > 10
    # a beat interval, and at most one job's finish or start (about a dozen commands) before the beats due are written
    assert gaps and max(gaps) < STEADY.heartbeat_seconds + 15 * slow.seconds, max(gaps)


@pytest.mark.parametrize(("generation", "after_a_success"), [("2024-06", 0), ("2026-05", 2)])
def test_a_success_sets_the_failed_runs_to_0_until_2026_and_keeps_them_since(
    store: Store, generation: str, after_a_success: int
):
    clock = VirtualClock()
    simulate(
        store,
        workload(
            finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=3, waiting=0,
            generation=generation, cache_generation=None, policy=POLICY, seed=5,
        ),
        now=clock.now(),
    )  # fmt: skip
    running = list(store.jobs.find({Job.STATUS: Status.STARTED}))
    store.cache.delete_many({})
    store.cache.insert_many(
        [cache_document(job, clock.now(), 500, "UnexpectedError", failed_runs=2) for job in running]
    )
    steady = replace(RATES, crashes_per_worker_hour=0, overruns_per_worker_hour=0, waiting_target=0)
    pool = WorkerPool(
        store, QUEUE_GENERATIONS[generation], POLICY, steady, seed=3, clock=clock.monotonic, now=clock.now
    )
    pool.adopt_running()

    for _ in range(MAX_TICKS):
        pool.tick()
        clock.advance(TICK_SECONDS)
        if pool.counts["finished_success"] == len(running):
            break
    pool.stop()

    assert pool.counts["finished_success"] == len(running)
    entries = [(entry[Cache.HTTP_STATUS], entry[Cache.FAILED_RUNS]) for entry in store.cache.find()]
    assert entries == [(200, after_a_success)] * len(running)
