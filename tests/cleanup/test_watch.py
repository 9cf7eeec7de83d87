"""The watcher: each dead job finalized at its deadline, by the cleanup's own rules and steps, on a clock the test
drives (minutes in a moment); the jobs' workers beat, die or get SIGTERM at moments the test chooses."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import heapq
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import pytest
from pymongo.collection import Collection
from pymongo.errors import AutoReconnect

from tests.helpers import found, job_document, logged_store, plan_for
from zombie_pipeline.cleanup import run, watch_lease
from zombie_pipeline.cleanup.detection import deadline_of, detect
from zombie_pipeline.cleanup.events import EventLog
from zombie_pipeline.cleanup.watch import TURNED_OFF, Watch, WatchSettings
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import WATCH_LEASE_ID, Event, EventState, WatchState
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import truncate_ms, utc_now

#: Today's queue (SIGTERMs recorded, finished jobs deleted), a heartbeat every 10 s, dead after a minute.
POLICY = ZombiePolicy(
    heartbeat_timeout_seconds=60,
    heartbeat_interval_seconds=10,
    termination_grace_seconds=30,
    queue_generation=NEWEST_QUEUE_GENERATION,
)
FAST = WatchSettings(run_seconds=600, lease_seconds=15, renew_seconds=5)


class World:
    """The test's clock, and what happens at which moment of it: the watch's sleep lets the world move to its end."""

    def __init__(self, store: Store, start: dt.datetime | None = None) -> None:
        self.store = store
        self.now = truncate_ms(start or utc_now())
        self.start = self.now
        self._events: list[tuple[dt.datetime, int, Callable[[], object]]] = []
        self._order = itertools.count()
        self.slept = 0.0

    def clock(self) -> dt.datetime:
        return self.now

    def at(self, seconds: float, action: Callable[[], object]) -> None:
        """``action`` happens ``seconds`` after the start."""
        heapq.heappush(self._events, (self.start + dt.timedelta(seconds=seconds), next(self._order), action))

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        end = self.now + dt.timedelta(seconds=seconds)
        while self._events and self._events[0][0] <= end:
            moment, _, action = heapq.heappop(self._events)
            self.now = max(self.now, moment)
            action()
        self.now = truncate_ms(end)

    def ago(self, seconds: float) -> dt.datetime:
        return truncate_ms(self.now - dt.timedelta(seconds=seconds))

    def job(self, dataset: str, started: float, beat: float | None, terminated: float | None = None) -> JobDocument:
        """A started job: its start, last heartbeat and SIGTERM so many seconds before the start of the world."""
        job = job_document(
            generation=NEWEST_QUEUE_GENERATION,
            dataset=dataset,
            started_at=self.ago(started),
            last_heartbeat=self.ago(beat) if beat is not None else None,
            terminated_at=self.ago(terminated) if terminated is not None else None,
        )
        self.store.jobs.insert_one(job)
        return job

    def beats(self, job: JobDocument, every: float, until: float | None = None) -> None:
        """The job's worker beats every ``every`` seconds from now on (until ``until`` seconds after the start)."""
        moments = itertools.count(every, every)
        for moment in moments:
            if moment > (until if until is not None else 900):
                return
            self.at(moment, functools.partial(self.beat, job, moment))

    def fleet_beats(self, jobs: Sequence[JobDocument], every: float, until: float = 900) -> None:
        """Their workers beat every ``every`` seconds from now on, all at once (one command each time)."""
        ids = [job[ID] for job in jobs]
        for moment in itertools.count(every, every):
            if moment > until:
                return
            at = self.start + dt.timedelta(seconds=moment)
            change = {"$set": {Job.LAST_HEARTBEAT: at}}
            self.at(moment, functools.partial(self.store.jobs.update_many, {ID: {"$in": ids}}, change))

    def beat(self, job: JobDocument, seconds: float) -> None:
        at = self.start + dt.timedelta(seconds=seconds)
        self.store.jobs.update_one({ID: job[ID], Job.STATUS: Status.STARTED}, {"$set": {Job.LAST_HEARTBEAT: at}})

    def until(self, seconds: float) -> Callable[[], bool]:
        return lambda: self.now >= self.start + dt.timedelta(seconds=seconds)


class Said:
    """A log that keeps what the watch said."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, msg: str) -> None:
        self.lines.append(("info", msg))

    def warning(self, msg: str) -> None:
        self.lines.append(("warning", msg))

    def error(self, msg: str) -> None:
        self.lines.append(("error", msg))

    def saying(self, words: str) -> list[str]:
        return [line for _, line in self.lines if words in line]


def watch(
    store: Store,
    world: World,
    policy: ZombiePolicy = POLICY,
    run_id: str = "watch-1",
    settings: WatchSettings = FAST,
    **options: Any,
) -> Watch:
    return Watch(store, lambda: policy, run_id, settings, clock=world.clock, sleep=world.sleep, **options)


def events(store: Store) -> dict[Any, Any]:
    return {event[ID]: event for event in store.events.find({Event.STATE: EventState.DONE})}


class Unreachable:
    """A collection whose every call fails as a server out of reach does, while ``down()``."""

    def __init__(self, collection: Collection[Any], down: Callable[[], bool]) -> None:
        self._collection = collection
        self._down = down

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._down():
                raise AutoReconnect("connection refused")
            return attribute(*args, **kwargs)

        return call


# --- the rules, written once ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "started, beat, terminated",
    [(500, 50, None), (50, None, None), (1300, 5, None), (500, 20, 40), (500, 50, 45), (500, None, 20)],
    ids=["beat", "never-beat", "past-T2", "sigterm-grace", "sigterm-timeout", "sigterm-never-beat"],
)
def test_a_jobs_deadline_is_the_first_moment_detection_calls_it_a_zombie(store, started, beat, terminated):
    world = World(store)
    job = world.job("user/one", started, beat, terminated)
    deadline = deadline_of(job, POLICY)

    assert detect(store.jobs, POLICY, deadline).candidates == []
    [candidate] = detect(store.jobs, POLICY, deadline + dt.timedelta(milliseconds=1)).candidates
    assert candidate.due_at == deadline
    assert candidate.release_lag_seconds(deadline + dt.timedelta(seconds=2)) == 2.0


# --- at the deadline -------------------------------------------------------------------------------------------


def test_a_dead_job_is_finalized_at_its_deadline_with_its_release_lag_and_detection_time(store):
    world = World(store)
    job = world.job("user/dead", started=100, beat=50)  # due 10 s after the start of the world
    report = watch(store, world).run(world.until(30))

    event = events(store)[job[ID]]
    assert event[Event.REASON] == Reason.MISSING_HEARTBEAT
    assert 0 < event[Event.RELEASE_LAG_SECONDS] <= 0.01
    assert event[Event.FINALIZED_AT] - event[Event.JOB][Job.LAST_HEARTBEAT] == dt.timedelta(seconds=60.001)
    assert event[Event.DETECTION_SECONDS] == pytest.approx(60.001)
    assert store.jobs.count_documents({ID: job[ID], Job.STATUS: Status.STARTED}) == 0
    assert report.release_lags == [event[Event.RELEASE_LAG_SECONDS]]
    assert report.result.rows[0]["release_lag_seconds"] == event[Event.RELEASE_LAG_SECONDS]


def test_a_job_whose_worker_beats_again_before_its_deadline_is_left_alone_and_its_new_deadline_kept(store):
    world = World(store)
    job = world.job("user/slow", started=100, beat=50)  # due at 10 s, but beats at 8 s and then dies
    world.at(8, lambda: world.beat(job, 8))
    watch(store, world).run(world.until(120))

    event = events(store)[job[ID]]
    assert event[Event.FINALIZED_AT] == world.start + dt.timedelta(seconds=68.001)  # 8 + 60, not 10


def test_slow_but_alive_workers_beating_at_07_of_the_timeout_are_never_finalized(store):
    world = World(store)
    slow = [world.job(f"user/slow-{n}", started=100, beat=n) for n in range(5)]
    for job in slow:
        world.beats(job, every=0.7 * POLICY.heartbeat_timeout_seconds)
    report = watch(store, world).run(world.until(600))

    assert events(store) == {}
    assert store.jobs.count_documents({ID: {"$in": [job[ID] for job in slow]}, Job.STATUS: Status.STARTED}) == 5
    assert report.refreshes >= 290 and report.passes == 0


def test_a_sigterm_is_finalized_once_its_grace_has_passed_and_its_heartbeats_stopped(store):
    world = World(store)
    job = world.job("user/sigterm", started=300, beat=5, terminated=10)  # SIGTERM 10 s ago, beats on for its grace
    world.beats(job, every=10, until=20)  # the last beat 20 s after the start; the pod killed at its grace's end
    watch(store, world).run(world.until(120))

    event = events(store)[job[ID]]
    assert event[Event.REASON] == Reason.TERMINATED
    # dead once 30 s after the SIGTERM (at 20 s) and 2 x 10 s after the last beat: at 20 + 20 = 40 s
    assert event[Event.FINALIZED_AT] == world.start + dt.timedelta(seconds=40.001)
    assert event[Event.CAUSE] == Cause.DEPLOY


def test_a_live_job_is_stopped_at_its_maximum_duration(store):
    world = World(store)
    job = world.job("user/long", started=1190, beat=1)
    world.beats(job, every=10)
    watch(store, world).run(world.until(60))

    event = events(store)[job[ID]]
    assert (event[Event.REASON], event[Event.CAUSE]) == (Reason.EXCEEDED_MAX_DURATION, Cause.TIMEOUT)
    assert event[Event.FINALIZED_AT] == world.start + dt.timedelta(seconds=10.001)


def test_deaths_within_a_second_of_each_other_are_each_finalized_at_its_deadline(store):
    world = World(store)
    jobs = [world.job(f"user/together-{n}", started=100, beat=50 - n * 0.2) for n in range(4)]  # due 10 to 10.6 s
    healthy = [world.job(f"user/healthy-{n}", started=100, beat=1) for n in range(20)]
    for job in healthy:
        world.beats(job, every=10)
    report = watch(store, world).run(world.until(30))

    finalized = events(store)
    assert set(finalized) == {job[ID] for job in jobs}
    assert report.passes == 4  # within the burst of passes: none waits for another
    assert max(event[Event.RELEASE_LAG_SECONDS] for event in finalized.values()) < 0.01


def test_past_a_burst_of_passes_what_falls_due_waits_for_the_next_pass_a_second_later_as_one_batch(store):
    world = World(store)
    jobs = [world.job(f"user/together-{n}", started=100, beat=50 - n * 0.1) for n in range(8)]  # due 10 to 10.7 s
    report = watch(store, world).run(world.until(30))

    finalized = events(store)
    lags = sorted(event[Event.RELEASE_LAG_SECONDS] for event in finalized.values())
    assert set(finalized) == {job[ID] for job in jobs}
    assert report.passes == FAST.pass_burst + 1  # five at their deadlines, then the three left in one
    assert lags[: FAST.pass_burst] == pytest.approx([0.001] * FAST.pass_burst, abs=0.001)
    assert lags[-1] == pytest.approx(11.001 - 10.5, abs=0.01)  # due at 10.5 s: the budget refilled at 11.0 s


# --- what falls due together -------------------------------------------------------------------------------------


def test_a_fleet_going_quiet_at_once_is_refused_by_the_brake_as_a_whole_not_one_deadline_at_a_time(store):
    world = World(store)
    fleet = [world.job(f"user/fleet-{n}", started=200, beat=1 + n * 0.5) for n in range(40)]  # silent from now on
    said = Said()
    braked: list = []
    report = watch(store, world, log=said, on_brake=braked.append).run(world.until(120))

    assert events(store) == {}, "the brake let some of the quiet fleet go"
    assert store.jobs.count_documents({ID: {"$in": [job[ID] for job in fleet]}, Job.STATUS: Status.STARTED}) == 40
    assert report.holds == 1 and report.brake_refusals >= 1
    assert len(said.saying("brake engaged")) == 1  # said once
    assert [brake.engaged for brake in braked] == [True]
    assert found(watch_lease.read(store.watchers)).state == WatchState.ENDED


def test_a_wave_of_deaths_is_released_as_it_falls_due_the_finalized_ones_counting_towards_the_wave(store):
    """Not held: the first members are crashes until the tenth death makes it a wave, as a cleanup whose tick splits it
    judges them; from then on, deploys."""
    world = World(store)
    wave = [world.job(f"user/wave-{n}", started=200, beat=50 - n) for n in range(12)]  # due from 10 to 21 s
    healthy = [world.job(f"user/healthy-{n}", started=100, beat=1) for n in range(40)]
    world.fleet_beats(healthy, every=10)
    report = watch(store, world).run(world.until(60))

    finalized = events(store)
    assert set(finalized) == {job[ID] for job in wave}
    causes = [finalized[job[ID]][Event.CAUSE] for job in wave]
    assert causes == [Cause.CRASH] * 9 + [Cause.DEPLOY] * 3
    assert report.holds == 0
    assert max(event[Event.RELEASE_LAG_SECONDS] for event in finalized.values()) < 1.01


def test_slow_workers_never_hold_a_death(store):
    """Slow workers fill the look-ahead (silent past half the timeout, alive): a death beside them is released at once."""
    world = World(store)
    slow = [world.job(f"user/slow-{n}", started=100, beat=35 + n * 0.2) for n in range(12)]
    for job in slow:  # their next beat after 55 s of silence: alive
        world.at(20, functools.partial(world.beat, job, 20))
    dead = world.job("user/dead", started=100, beat=55)  # due at 5 s, while the slow ones are silent for 35 s and more
    report = watch(store, world).run(world.until(30))

    assert list(events(store)) == [dead[ID]]
    assert report.holds == 0 and events(store)[dead[ID]][Event.RELEASE_LAG_SECONDS] < 0.01


def test_deaths_apart_are_not_held(store):
    world = World(store)
    deaths = [world.job(f"user/apart-{n}", started=300, beat=50 - n * 15) for n in range(8)]  # one every 15 s
    healthy = [world.job(f"user/healthy-{n}", started=100, beat=1) for n in range(20)]
    for job in healthy:
        world.beats(job, every=10)
    report = watch(store, world).run(world.until(180))

    finalized = events(store)
    assert set(finalized) == {job[ID] for job in deaths}
    assert report.holds == 0
    assert max(event[Event.RELEASE_LAG_SECONDS] for event in finalized.values()) < 0.01


# --- every promise of a cleanup ------------------------------------------------------------------------------------


def test_beside_a_concurrent_cleanup_every_zombie_is_finalized_exactly_once(store):
    """The watch on the wall clock, cleanups in a thread at the same time: one event per zombie, whoever won it."""
    world = World(store)
    zombies = [world.job(f"user/zombie-{n}", started=200, beat=61 + n * 0.05) for n in range(30)]
    for n in range(30):
        world.job(f"user/healthy-{n}", started=100, beat=1)
    stop = threading.Event()
    failures: list[BaseException] = []

    def cleanups() -> None:
        count = 0
        while not stop.is_set():
            try:
                run.run_cleanup(store, POLICY, f"cleanup-{count}")
            except BaseException as error:  # the test's thread: said to the test, not lost in a warning
                failures.append(error)
                return
            count += 1

    thread = threading.Thread(target=cleanups)
    thread.start()
    try:
        report = Watch(store, lambda: POLICY, "watch-1", WatchSettings(run_seconds=3)).run()
    finally:
        stop.set()
        thread.join()

    assert not failures, failures

    finalized = list(store.events.find({ID: {"$in": [job[ID] for job in zombies]}}))
    assert sorted(event[ID] for event in finalized) == sorted(job[ID] for job in zombies)
    assert {event[Event.STATE] for event in finalized} == {EventState.DONE}
    by_watch = [event for event in finalized if event[Event.RUN_ID] == "watch-1"]
    assert len(by_watch) == len(report.result.rows)
    assert store.jobs.count_documents({ID: {"$in": [job[ID] for job in zombies]}, Job.STATUS: Status.STARTED}) == 0


def test_a_database_that_stops_answering_is_waited_out_said_once_and_what_fell_due_is_finalized_once_it_answers(
    store,
):
    world = World(store)
    job = world.job("user/dead", started=100, beat=50)  # due at 10 s, while the database is away (5 s to 25 s)
    down = {"now": False}
    world.at(5, lambda: down.update(now=True))
    world.at(25, lambda: down.update(now=False))
    said = Said()
    flaky = Store(
        **{
            part.name: cast("Collection[Any]", Unreachable(getattr(store, part.name), lambda: down["now"]))
            for part in dataclasses.fields(Store)
        }
    )
    report = Watch(flaky, lambda: POLICY, "watch-1", FAST, clock=world.clock, sleep=world.sleep, log=said).run(
        world.until(60)
    )

    event = events(store)[job[ID]]
    assert 15 <= event[Event.RELEASE_LAG_SECONDS] <= 15 + FAST.outage_max_wait_seconds + 0.01
    assert report.outages == 1 and 20 <= report.outage_seconds <= 25
    assert len(said.saying("does not answer")) == 1 and len(said.saying("answers again")) == 1


def test_the_policy_turning_the_watcher_off_ends_it_before_it_takes_the_lease(store):
    world = World(store)
    world.job("user/dead", started=100, beat=70)
    report = watch(store, world, policy=POLICY.model_copy(update={"watch_deadlines": False})).run(world.until(60))

    assert report.ended_because == TURNED_OFF and report.acquired_at is None
    assert events(store) == {} and watch_lease.read(store.watchers) is None


def test_what_a_dead_run_left_half_done_is_completed_by_the_watch(store):
    world = World(store)
    job = world.job("user/half-done", started=300, beat=200)
    plan = plan_for(store, POLICY.model_copy(update={"claim_lease_seconds": 0}), "dead-run")
    candidates = detect(store.jobs, POLICY, world.now).candidates
    EventLog(store.events, "dead-run", plan.policy).claim(
        candidates, world.ago(10), plan.generations.required_queue(), world.ago(10)
    )  # claimed, lease already over, then the run died
    report = watch(store, world).run(world.until(5))

    event = events(store)[job[ID]]
    assert event[Event.LEASE_OWNER] == "watch-1" and event[Event.RUN_ID] == "dead-run"
    assert report.result.counts["taken_over"] == 1


# --- one watch at a time --------------------------------------------------------------------------------------------


def test_a_successor_waits_for_the_lease_and_takes_over_within_a_refresh_when_it_is_let_go(store):
    world = World(store)
    assert watch_lease.acquire(store.watchers, "watch-0", world.now, 15, world.now + dt.timedelta(seconds=40))
    for moment in range(5, 40, 5):  # the holder renews it until it lets it go at 40 s
        world.at(moment, lambda: watch_lease.renew(store.watchers, "watch-0", world.now, 15, WatchState.WATCHING))
    world.at(40, lambda: watch_lease.release(store.watchers, "watch-0", world.now))
    job = world.job("user/dead", started=100, beat=45)  # due at 15 s, the holder's: the successor must not act
    said = Said()
    report = watch(store, world, log=said).run(world.until(60))

    acquired = found(report.acquired_at)
    assert dt.timedelta(seconds=40) <= acquired - world.start <= dt.timedelta(seconds=40 + FAST.refresh_seconds)
    assert len(said.saying("waiting for the lease")) == 1
    assert events(store)[job[ID]][Event.FINALIZED_AT] >= acquired  # held back while the other one held the lease


def test_a_watch_that_finds_its_lease_taken_over_stops(store):
    world = World(store)

    def taken_over() -> None:
        store.watchers.update_one({ID: WATCH_LEASE_ID}, {"$set": {"holder": "watch-2"}})

    world.at(20, taken_over)
    report = watch(store, world).run(world.until(120))

    assert "took the lease over" in report.ended_because
    assert report.ended_at is not None and report.ended_at - world.start <= dt.timedelta(
        seconds=20 + FAST.renew_seconds
    )
    assert found(watch_lease.read(store.watchers)).holder == "watch-2"  # the other one's lease is left as it is


def test_the_lease_says_who_watches_and_lapses_when_the_watch_is_no_longer_heard_of(store):
    world = World(store)
    for n in range(3):
        world.job(f"user/healthy-{n}", started=100, beat=1)
    watch(store, world, settings=WatchSettings(run_seconds=20)).run(world.until(10))
    lease = found(watch_lease.read(store.watchers))
    assert lease.state == WatchState.ENDED and not lease.alive(world.now)

    assert watch_lease.acquire(store.watchers, "watch-2", world.now, 15, world.now + dt.timedelta(hours=1))
    assert watch_lease.alive_watcher(store.watchers, world.now + dt.timedelta(seconds=14)) is not None
    assert watch_lease.alive_watcher(store.watchers, world.now + dt.timedelta(seconds=15)) is None  # lapsed: dead
    assert not watch_lease.acquire(store.watchers, "watch-3", world.now, 15, world.now)  # alive: not taken


# --- listeners ------------------------------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.observed: list[tuple[dt.datetime, list[dict]]] = []
        self.flushed: list[dt.datetime] = []

    def observe(self, jobs: Sequence[Mapping[str, Any]], now: dt.datetime) -> None:
        self.observed.append((now, [dict(job) for job in jobs]))

    def flush(self, store: Store, now: dt.datetime) -> None:
        self.flushed.append(now)


class Broken(Recorder):
    def observe(self, jobs: Sequence[Mapping[str, Any]], now: dt.datetime) -> None:
        raise ValueError("a bug")


def test_listeners_see_every_refresh_of_the_started_jobs_and_are_flushed_periodically_and_at_the_end(store):
    world = World(store)
    beating = world.job("user/beating", started=100, beat=1)
    sigterm = world.job("user/sigterm", started=100, beat=1, terminated=2)
    world.beats(beating, every=10)
    recorder, broken, said = Recorder(), Broken(), Said()
    watch(store, world, listeners=[broken, recorder], log=said).run(world.until(130))

    assert len(recorder.observed) >= 130 / FAST.refresh_seconds
    first = {job[ID]: job for job in recorder.observed[0][1]}
    assert set(first) == {beating[ID], sigterm[ID]}
    assert first[sigterm[ID]][Job.TERMINATED_AT] == sigterm[Job.TERMINATED_AT]
    assert {Job.TYPE, Job.STARTED_AT, Job.DATASET, Job.DIFFICULTY} <= set(first[beating[ID]])
    now, jobs = recorder.observed[-1]
    assert [job[ID] for job in jobs] == [beating[ID]]  # the SIGTERMed one was finalized meanwhile
    assert jobs[0][Job.LAST_HEARTBEAT] == world.start + dt.timedelta(seconds=(now - world.start).seconds // 10 * 10)
    assert len(recorder.flushed) == 3 and recorder.flushed[-1] >= now  # at 60 s, 120 s and the end
    assert len(said.saying("listener Broken failed")) == 1  # said once; the others told all the same


# --- what it costs the database --------------------------------------------------------------------------------------


def test_an_idle_watch_sends_less_than_one_command_a_second_whatever_the_fleet(store, mongo_url):
    world = World(store)
    fleet = [world.job(f"user/healthy-{n}", started=100, beat=1) for n in range(200)]
    world.fleet_beats(fleet, every=10)
    with logged_store(mongo_url, store) as (logged, log):
        report = watch(logged, world).run(world.until(300))
    assert report.refreshes >= 150 and report.passes == 0
    assert len(log.names) / 300 < 1.0, Counter(log.names)


def test_a_wave_of_200_deaths_costs_a_burst_then_a_pass_a_second_not_200(store, mongo_url):
    world = World(store)
    dead = [world.job(f"user/dead-{n}", started=300, beat=50 - n * 0.05) for n in range(200)]  # due from 10 to 20 s
    healthy = [
        world.job(f"user/healthy-{n}", started=100, beat=1) for n in range(400)
    ]  # the wave stays below the brake
    world.fleet_beats(healthy, every=10)
    with logged_store(mongo_url, store) as (logged, log):
        report = watch(logged, world).run(world.until(40))
    assert set(events(store)) == {job[ID] for job in dead}
    # a burst at the first deadlines, then one a second while they fall due (over 10 s)
    assert report.passes <= FAST.pass_burst + 11 and report.holds == 0
    assert len(log.names) < 40 + report.passes * 30, Counter(log.names)  # the idle ones, and some 25 per pass
