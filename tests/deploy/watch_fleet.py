"""A fleet of workers whose deaths come at moments the test chooses, and how late the watcher released each one.

The workers heartbeat their jobs from this process, as the deployment's executors do (``last_heartbeat``, every
``interval`` seconds from a phase of their own), and every beat they write is kept: the truth each release is
measured against. Four kinds:

- **dying**: beat until their death, then nothing (an OOM kill). The rule allows their release at their last beat +
  the heartbeat timeout;
- **sigterm**: SIGTERMed (``terminated_at``), beat on for a grace shorter than the policy's, then killed. Released once
  the policy's grace has passed since the SIGTERM and two beats were missed, or the timeout since the SIGTERM, whichever
  comes first (docs/detection.md, "The SIGTERM rule");
- **slow**: alive all along, with gaps between beats drawn from 0.3 to 0.7 of the timeout: never to be released;
- **healthy**: alive, beating every interval.

A watcher of the jobs' own (a poll every 0.02 s) sees when each one leaves the started jobs: its true release, to set
against the lag its event records. :func:`measure` runs a fleet to its last release and returns the figures.
"""

from __future__ import annotations

import datetime as dt
import functools
import heapq
import itertools
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bson import ObjectId

from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import job_document

#: The true release is known to within this: a coarser poll would add half of it to every lag on average.
POLL_SECONDS = 0.02


@dataclass
class Worker:
    kind: str  # dying, sigterm, slow, healthy
    job_id: ObjectId
    beats: list[dt.datetime] = field(default_factory=list)
    dies_at: float | None = None  # seconds after the fleet's start: no beat from then on
    sigterm_at: float | None = None
    terminated_at: dt.datetime | None = None
    released_at: dt.datetime | None = None  # when the poll first saw the job gone

    def deadline(self, policy: ZombiePolicy, at: dt.datetime | None = None) -> dt.datetime:
        """The truth: when the rules allow its release, from what it really wrote (the test's own oracle); with
        ``at`` (no earlier than its first beat), from what it had written by then."""
        timeout = dt.timedelta(seconds=policy.heartbeat_timeout_seconds)
        last = self.beats[-1] if at is None else max(beat for beat in self.beats if beat <= at)
        terminated_at = self.terminated_at if at is None or (self.terminated_at or at) <= at else None
        if terminated_at is None:
            return last + timeout
        grace = dt.timedelta(seconds=policy.termination_grace_seconds or 0)
        silence = dt.timedelta(seconds=policy.termination_silence_seconds())
        return min(terminated_at + timeout, max(terminated_at + grace, last + silence))


@dataclass(frozen=True)
class FleetPlan:
    """How many of each kind, and when the deaths come (seconds after the fleet's start)."""

    dying: int = 24
    sigterm: int = 6
    slow: int = 10
    healthy: int = 20
    first_death: float = 30.0
    death_spacing: float = 9.0  # fewer than wave_min_workers (10) deaths in any 60 s: no wave to hold
    sigterm_spacing: float = 30.0
    real_grace: tuple[float, float] = (5.0, 25.0)  # how long a SIGTERMed pod beats on: below the policy's grace
    seed: int = 34


class Fleet:
    def __init__(self, store: Store, policy: ZombiePolicy, plan: FleetPlan) -> None:
        self.store = store
        self.policy = policy
        self.plan = plan
        self.random = random.Random(plan.seed)
        self.workers: list[Worker] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.start = time.monotonic()
        self.start_utc = utc_now()
        self.timeout = policy.heartbeat_timeout_seconds

    def hire(self) -> None:
        """Every job started now, beating from now on."""
        now = utc_now()
        plan = self.plan
        kinds = ["dying"] * plan.dying + ["sigterm"] * plan.sigterm + ["slow"] * plan.slow + ["healthy"] * plan.healthy
        for index, kind in enumerate(kinds):
            job = job_document(dataset=f"fleet/{kind}-{index}", started_at=now, last_heartbeat=now)
            worker = Worker(kind, job[ID], beats=[now])
            if kind == "dying":
                worker.dies_at = plan.first_death + plan.death_spacing * index
            elif kind == "sigterm":
                number = index - plan.dying
                worker.sigterm_at = plan.first_death + 10 + plan.sigterm_spacing * number
                worker.dies_at = worker.sigterm_at + self.random.uniform(*plan.real_grace)
            self.store.jobs.insert_one(job)
            self.workers.append(worker)
        self.start = time.monotonic()
        self.start_utc = utc_now()

    def run(self) -> None:
        """Beat (and SIGTERM) on schedule until stopped: each worker's next moment in one heap."""
        interval = self.policy.heartbeat_interval_seconds
        queue: list[tuple[float, int, Callable[[], float | None]]] = []
        order = itertools.count()
        for worker in self.workers:
            first = self.random.uniform(0, interval)
            beat: Callable[[], float | None] = functools.partial(self._beat, worker)
            heapq.heappush(queue, (first, next(order), beat))
            if worker.sigterm_at is not None:
                sigterm: Callable[[], float | None] = functools.partial(self._sigterm, worker)
                heapq.heappush(queue, (worker.sigterm_at, next(order), sigterm))
        try:
            while queue and not self.stop.is_set():
                moment, _, action = heapq.heappop(queue)
                wait = moment - (time.monotonic() - self.start)
                if wait > 0 and self.stop.wait(wait):
                    return
                again = action()
                if again is not None:
                    heapq.heappush(queue, (moment + again, next(order), action))
        except BaseException as error:  # said by the test, which checks the fleet ran as planned
            self.errors.append(error)

    def _beat(self, worker: Worker) -> float | None:
        """One beat, written and kept; when the next one comes (None: the worker is dead)."""
        if worker.dies_at is not None and time.monotonic() - self.start >= worker.dies_at:
            return None
        now = utc_now()
        written = self.store.jobs.update_one(
            {ID: worker.job_id, Job.STATUS: Status.STARTED}, {"$set": {Job.LAST_HEARTBEAT: now}}
        )
        if written.matched_count:
            worker.beats.append(now)
        if worker.kind == "slow":
            return self.random.uniform(0.3, 0.7) * self.timeout
        return float(self.policy.heartbeat_interval_seconds)

    def _sigterm(self, worker: Worker) -> float | None:
        now = utc_now()
        self.store.jobs.update_one({ID: worker.job_id, Job.STATUS: Status.STARTED}, {"$set": {Job.TERMINATED_AT: now}})
        worker.terminated_at = now
        return None

    def watch_releases(self) -> None:
        """The test's own watcher: when each job leaves the started jobs."""
        pending = {worker.job_id: worker for worker in self.workers}
        while pending and not self.stop.is_set():
            now = utc_now()
            started = {
                job[ID]
                for job in self.store.jobs.find({ID: {"$in": list(pending)}, Job.STATUS: Status.STARTED}, {ID: 1})
            }
            for job_id in [job_id for job_id in pending if job_id not in started]:
                pending.pop(job_id).released_at = now
            self.stop.wait(POLL_SECONDS)

    def last_deadline(self) -> float:
        """Seconds after the start when the last death's release is due at the latest."""
        deaths = [worker.dies_at for worker in self.workers if worker.dies_at is not None]
        return max(deaths) + self.timeout


@dataclass
class Measurement:
    """What a fleet run showed."""

    lags: list[float]  # per released dead job: its true release - its true deadline, seconds
    recorded_lags: list[float]  # the events' release_lag_seconds
    recorded_errors: list[float]  # recorded - true, per job
    by_kind: dict[str, list[float]]
    never_released: list[str]
    live_released: list[str]
    finalized_by: dict[str, int]  # run id -> finalizations
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    detection: dict[str, list[float]]  # per kind, from the true death (sigterm: from the SIGTERM) to the release
    lookahead: dict[str, float] = field(default_factory=dict)  # start latency -> share of ticks a run must be waiting

    def quantile(self, q: float, values: list[float] | None = None) -> float:
        data = self.lags if values is None else values
        return float(np.percentile(np.asarray(data, dtype=float), q * 100)) if data else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "released": len(self.lags),
            "release_lag_seconds": {f"p{int(q * 100)}": round(self.quantile(q), 3) for q in (0.5, 0.9, 0.99)}
            | {"max": round(max(self.lags, default=float("nan")), 3)},
            "recorded_minus_true_seconds": {
                "min": round(min(self.recorded_errors, default=float("nan")), 3),
                "max": round(max(self.recorded_errors, default=float("nan")), 3),
            },
            "release_lag_by_kind_p99": {
                kind: round(self.quantile(0.99, lags), 3) for kind, lags in self.by_kind.items()
            },
            "detection_seconds_by_kind": {
                kind: {f"p{int(q * 100)}": round(self.quantile(q, values), 3) for q in (0.5, 0.99)}
                | {"max": round(max(values), 3)}
                for kind, values in self.detection.items()
            },
            "never_released": self.never_released,
            "live_released": self.live_released,
            "finalized_by_run": self.finalized_by,
            "lookahead_sensor_share_of_ticks_with_a_deadline_ahead": self.lookahead,
            "load_average_before": self.load_before,
            "load_average_after": self.load_after,
        }


def measure(store: Store, policy: ZombiePolicy, plan: FleetPlan = FleetPlan(), margin: float = 30.0) -> Measurement:
    """Hire the fleet, let it live and die, wait for the last deadline + ``margin``, and measure."""
    load_before = os.getloadavg()
    fleet = Fleet(store, policy, plan)
    fleet.hire()
    threads = [
        threading.Thread(target=fleet.run, daemon=True),
        threading.Thread(target=fleet.watch_releases, daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        deadline = fleet.last_deadline() + margin
        while time.monotonic() - fleet.start < deadline:
            dead = [worker for worker in fleet.workers if worker.dies_at is not None]
            if (
                all(worker.released_at is not None for worker in dead)
                and time.monotonic() - fleet.start > fleet.last_deadline()
            ):
                break
            time.sleep(1)
    finally:
        fleet.stop.set()
        for thread in threads:
            thread.join(timeout=30)
        alive = [worker.job_id for worker in fleet.workers if worker.dies_at is None]
        # their workers finish them (today's queue deletes a finished job): no zombie left for what comes next
        store.jobs.delete_many({ID: {"$in": alive}, Job.STATUS: Status.STARTED})
    if fleet.errors:
        raise RuntimeError(f"the fleet did not run as planned: {fleet.errors[0]!r}") from fleet.errors[0]
    return _measured(store, policy, fleet, load_before)


def _measured(store: Store, policy: ZombiePolicy, fleet: Fleet, load_before: tuple[float, float, float]) -> Measurement:
    events = {event[ID]: event for event in store.events.find({ID: {"$in": [w.job_id for w in fleet.workers]}})}
    measured = Measurement([], [], [], {}, [], [], {}, load_before, load_before, {})
    for worker in fleet.workers:
        event = events.get(worker.job_id)
        if worker.dies_at is None:
            if event is not None or worker.released_at is not None:
                measured.live_released.append(f"{worker.kind} {worker.job_id}")
            continue
        if worker.released_at is None or event is None or event.get(Event.STATE) != EventState.DONE:
            measured.never_released.append(f"{worker.kind} {worker.job_id}")
            continue
        lag = (worker.released_at - worker.deadline(policy)).total_seconds()
        measured.lags.append(lag)
        measured.by_kind.setdefault(worker.kind, []).append(lag)
        measured.recorded_lags.append(event[Event.RELEASE_LAG_SECONDS])
        measured.recorded_errors.append(event[Event.RELEASE_LAG_SECONDS] - lag)
        since = worker.terminated_at or fleet.start_utc + dt.timedelta(seconds=worker.dies_at)
        measured.detection.setdefault(worker.kind, []).append((worker.released_at - since).total_seconds())
        run_id = event[Event.RUN_ID]
        measured.finalized_by[run_id] = measured.finalized_by.get(run_id, 0) + 1
    measured.load_after = os.getloadavg()
    measured.lookahead = {f"start {start:.0f} s": lookahead_share(fleet, policy, start) for start in LOOKAHEAD_STARTS}
    return measured


#: Run start latencies a look-ahead sensor would have to cover: a few seconds (this stack's, idle), a loaded host's
#: (20 to 103 s measured from queued to started, deploy/dagster.yaml), Kubernetes' worst (the chart's 480 s).
LOOKAHEAD_STARTS = (10.0, 103.0, 480.0)


def lookahead_share(fleet: Fleet, policy: ZombiePolicy, start_seconds: float, tick: float = 30.0) -> float:
    """The other design, judged on the same fleet: a sensor ticking every ``tick`` seconds that launches a run early
    enough for the deadlines within its tick + a run's start. The share of its ticks at which some started job's
    deadline (as what it had written by then sets it) lies that close: ticks at which a run must already be waiting.
    """
    horizon = dt.timedelta(seconds=tick + start_seconds)
    end = max((w.released_at for w in fleet.workers if w.released_at is not None), default=fleet.start_utc)
    moments = [
        fleet.start_utc + dt.timedelta(seconds=tick * n)
        for n in range(int((end - fleet.start_utc).total_seconds() // tick) + 1)
    ]
    needed = 0
    for moment in moments:
        for worker in fleet.workers:
            if worker.released_at is not None and worker.released_at <= moment:
                continue
            if worker.beats[0] <= moment and worker.deadline(policy, at=moment) <= moment + horizon:
                needed += 1
                break
    return round(needed / len(moments), 3) if moments else 0.0
