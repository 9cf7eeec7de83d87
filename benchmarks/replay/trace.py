"""The replay's ground truth: what every job of a simulated deployment really did, fixed by a seed.

Nobody knows when a production job really died, so the replay makes a deployment whose every job has a known
fate (:mod:`.generate` draws it over the chart's fleet, :mod:`.fleet`) and replays it unchanged against every
contender. This module holds what a trace is made of:

* **jobs** of job types with log-normal durations, each with its fate drawn once: healthy, a healthy straggler
  (1-3x its type's p99), an OOM crash partway, never started (its pod dies before the first heartbeat), a hang
  (no progress; its executor keeps heartbeating);
* **heartbeats** from the pod's executor (``every(heartbeat, seconds=60)``: the call, then 60 s of sleep, so a
  job's beats are 60 s + its call's duration apart) and **pauses** of the executor's event loop (a GC pause, a
  CPU-starved pod, its own ``kill_stuck_jobs`` pass blocking the loop): a beat due during a pause comes when it
  ends. Pauses arrive at ``pauses_per_hour`` of running and last a log-normal of median ``pause_median_seconds``:
  the tail past the heartbeat timeout is what makes a killer finalize a live job (:class:`Beats`);
* **kill_long_job's checks**: each job's executor looks at its own job every 30-90 s; which check stops it
  depends on the maximum duration in force, so each contender applies its own (:func:`lifecycle`).

Times are seconds from the scored day's start, a midnight UTC (the warm-up before it is negative).
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

DAY = 86_400.0
#: The scored day's start, a midnight UTC, when the trace's times become dates (the queue's documents).
EPOCH = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
#: z of the 99th percentile of a normal law: a log-normal type's p99 is median x exp(Z99 x sigma).
Z99 = 2.3263


class Fate(StrEnum):
    """What the job would do left alone (no killer of any kind)."""

    HEALTHY = "healthy"
    STRAGGLER = "straggler"  # healthy, but 1-3x its type's p99
    CRASH = "crash"  # the process dies partway (OOM): heartbeats stop
    NEVER_STARTED = "never_started"  # the pod dies before the job's first heartbeat
    HANG = "hang"  # stops making progress; its executor keeps heartbeating


class Cause(StrEnum):
    """Why a job became a zombie, as the figures are split (a contender's maximum duration can change it)."""

    CRASH = "crash"
    SIGTERM = "sigterm"
    NEVER_STARTED = "never_started"
    HANG = "hang"


class Ending(StrEnum):
    """How a job's process ended under one maximum duration of kill_long_job."""

    FINISHED = "finished"  # normally: the worker deletes its job
    DIED = "died"  # crash or never started: the document stays, started
    SIGTERM = "sigterm"  # killed at the end of its grace period: the document stays, with terminated_at
    KILL_LONG = "kill_long_job"  # stopped by its own executor past the maximum duration, finalized by the worker


@dataclass(frozen=True)
class JobType:
    """A processing step: its share of its pool's jobs, its duration law (log-normal), its crash and hang rates."""

    name: str
    weight: float
    median_seconds: float
    sigma: float
    crash_rate: float
    hang_rate: float
    level: str = "dataset"  # which of config and split its jobs carry
    difficulty: int = 50  # the pool that runs it: light <= 40 < medium <= 70 < heavy

    @property
    def p99_seconds(self) -> float:
        return self.median_seconds * math.exp(Z99 * self.sigma)

    @property
    def mean_seconds(self) -> float:
        return self.median_seconds * math.exp(self.sigma**2 / 2)


#: Shaped after dataset-viewer's steps and their difficulties at f62009e05 (``processing_graph.py``: 20 to 70):
#: light (<= 40) quick steps, medium (40-70) the heavy computing ones, whose p99 is near an hour (so the chart's
#: 2400 s stops some healthy runs, issue #1395), heavy (> 70) the re-runs of failed jobs (+20 per failed run,
#: ``DIFFICULTY_BONUS_BY_FAILED_RUNS``), more often OOM-killed. Light medians are kept near a minute so that a day of
#: the chart's fleet stays within some 40,000 jobs (a death of a quick job is timed like any other).
JOB_TYPES: tuple[JobType, ...] = (
    JobType("/config-names", 0.35, 60, 0.8, 0.003, 0.001, difficulty=20),
    JobType("/size", 0.35, 45, 0.6, 0.002, 0.001, difficulty=20),
    JobType("/split-names", 0.30, 90, 1.0, 0.006, 0.002, "config", 40),
    JobType("/first-rows", 0.40, 60, 1.1, 0.015, 0.003, "split", 70),
    JobType("/parquet-and-info", 0.25, 300, 1.0, 0.040, 0.006, "config", 70),
    JobType("/duckdb-index", 0.15, 600, 0.7, 0.050, 0.006, "split", 70),
    JobType("/descriptive-statistics", 0.20, 240, 1.2, 0.030, 0.006, "split", 70),
    JobType("/parquet-and-info (re-run)", 0.6, 400, 1.0, 0.060, 0.006, "config", 90),
    JobType("/duckdb-index (re-run)", 0.4, 700, 0.7, 0.070, 0.006, "split", 90),
)


@dataclass(frozen=True)
class HeartbeatSettings:
    """The executor's heartbeat (``heartbeatIntervalSeconds``: 60) and the pauses of its event loop."""

    interval_seconds: float = 60.0
    call_seconds: tuple[float, float] = (0.005, 1.5)  # a job's heartbeat call: its beats are 60 s + this apart
    #: Pauses of the executor's loop per hour of running, and their length (log-normal): a GC pause, a pod starved
    #: of CPU (light pods request 0.2 CPU), the executor's own kill_stuck_jobs pass blocking its loop. 0.6 an hour
    #: (1 % of the 60 s intervals, as issue 29's trace) of median 90 s and sigma 0.45: 0.4 % of them last more than
    #: 300 s, about one live job in 450 running hours is silent past the deployment's 5 x 60 s.
    pauses_per_hour: float = 0.6
    pause_median_seconds: float = 90.0
    pause_sigma: float = 0.45


class Beats:
    """A job's heartbeats: ``interval + call`` apart, from a first beat 0-60 s after its start (the executor's next
    tick), each pause of the executor's loop holding back the beat due during it until it ends."""

    __slots__ = ("blocked", "step", "segments")

    def __init__(self, first: float | None, step: float, pauses: list[tuple[float, float]] = ()) -> None:  # type: ignore[assignment]
        self.step = step
        #: (first beat of a run of regular beats, the moment a pause blocks the rest of that run or inf)
        self.segments: list[tuple[float, float]] = []
        if first is None:
            return
        start = first
        for at, length in sorted(pauses):
            if at + length <= start:
                continue
            if at < start:  # paused before the segment's first beat: it comes at the pause's end
                start = at + length
                continue
            due = start + math.ceil((at - start) / step) * step  # the first beat at or after the pause's start
            if due < at + length:
                self.segments.append((start, at))
                start = at + length
        self.segments.append((start, math.inf))

    @classmethod
    def at(cls, times: list[float]) -> Beats:
        """Exactly these beats (hand-made cases): one segment each."""
        beats = cls(None, 60.0)
        beats.segments = [(t, nxt) for t, nxt in zip(times, [*times[1:], math.inf], strict=True)]
        beats.step = math.inf
        return beats

    @property
    def first(self) -> float | None:
        return self.segments[0][0] if self.segments else None

    def last_before(self, t: float) -> float | None:
        """The last beat at or before ``t`` (None: none yet)."""
        index = bisect.bisect_right(self.segments, (t, math.inf)) - 1
        if index < 0:
            return None
        start, blocked = self.segments[index]
        if self.step == math.inf:
            return start
        limit = min(t, blocked - 1e-9)
        return start + math.floor((limit - start) / self.step) * self.step

    def silences(self, until: float) -> list[tuple[float, float]]:
        """Each silence longer than a regular interval before ``until`` (the process's end): (its last beat, the
        next beat); the last one, after the process ended, has no next beat (inf)."""
        out = []
        for (start, blocked), (following, _) in zip(self.segments, self.segments[1:], strict=False):
            if following > until:
                break
            last = self.last_before(min(blocked, following) - 1e-9)
            out.append((last if last is not None else start, following))
        final = self.last_before(until)
        if final is not None:
            out.append((final, math.inf))
        return out

    def longest_gap(self, until: float) -> float:
        return max((b - a for a, b in self.silences(until) if b < math.inf), default=0.0)


class Checks:
    """The moments a job's executor runs ``kill_long_job`` on it: every 0.5-1.5 x 60 s from a random phase (drawn
    only for a job that runs long enough to be stopped: most never are)."""

    __slots__ = ("_bounds", "_rng", "_seed", "_start", "times")

    def __init__(self, seed: int, start: float, bounds: tuple[float, float] = (30.0, 90.0)) -> None:
        self._seed, self._start, self._bounds = seed, start, bounds
        self._rng: random.Random | None = None
        self.times: list[float] = []

    @classmethod
    def at(cls, times: list[float]) -> Checks:
        checks = cls(0, 0.0)
        checks._seed, checks.times = None, list(times)  # type: ignore[assignment]
        return checks

    def first_at_or_after(self, t: float, limit: float = math.inf) -> float | None:
        """The first check at or after ``t`` and before ``limit`` (None: none)."""
        times = self.times
        if self._seed is not None:
            if self._rng is None:
                self._rng = random.Random(self._seed)
                low, high = self._bounds
                # the residual of a renewal process of U(low, high) intervals: mean (low^2 + low*high + high^2) / 3 / (low + high)
                times.append(
                    self._start + self._rng.uniform(0.0, 2 * (low * low + low * high + high * high) / 3 / (low + high))
                )
            while times[-1] < t and times[-1] < limit:
                times.append(times[-1] + self._rng.uniform(*self._bounds))
        index = bisect.bisect_left(times, t)
        return times[index] if index < len(times) and times[index] < limit else None

    def stop_time(self, start: float, max_duration: Callable[[float], float], limit: float) -> float | None:
        """The check that stops the job: the first whose moment is ``max_duration(moment)`` past ``start``."""
        t = start
        while True:
            moment = self.first_at_or_after(start + max_duration(t), limit)
            if moment is None:
                return None
            if moment - start >= max_duration(moment):
                return moment
            t = moment  # the maximum duration changed in between: look again from here


@dataclass
class Job:
    """One run: where, when, and what it would do left alone."""

    index: int
    job_type: str
    dataset: str
    config: str | None
    split: str | None
    revision: str
    difficulty: int
    created: float
    start: float
    pod: int
    fate: Fate
    natural_end: float  # healthy: when it finishes; crash, never started: when it dies; hang: inf
    beats: Beats
    checks: Checks
    onset: float | None = None  # hang: when it stopped making progress
    sigterm_at: float | None = None  # its pod was SIGTERMed: terminated_at
    sigterm_kill: float | None = None  # ... and killed then, unless the job was done before


@dataclass
class Pod:
    """One pod: its executor runs kill_stuck_jobs from its start to its end (its kill, after a SIGTERM's grace)."""

    index: int
    pool: str
    start: float
    end: float = math.inf
    sigterm_at: float | None = None


@dataclass(frozen=True)
class Lifecycle:
    """What a job's process does under one maximum duration for kill_long_job (a contender's)."""

    ending: Ending
    process_end: float  # when the process stops (heartbeats stop with it)
    removed_at: float | None  # when the worker itself deletes the job (a normal finish, or kill_long_job's finish)
    cause: Cause | None  # None: never a zombie
    zombie_since: float | None  # the true death (or a hang's onset): what detection time is measured from


def lifecycle(job: Job, max_duration: Callable[[float], float]) -> Lifecycle:
    """The job's end when its executor's kill_long_job applies ``max_duration`` (seconds, as of a moment)."""
    natural = job.natural_end
    sig = job.sigterm_kill if job.sigterm_kill is not None and job.sigterm_kill < natural else math.inf
    alive_until = min(natural, sig)  # the executor checks its job while both live
    shortest = min(value for _, value in max_duration.phases) if isinstance(max_duration, MaxDuration) else 0.0
    stop = None if alive_until - job.start < shortest else job.checks.stop_time(job.start, max_duration, alive_until)
    if stop is not None:
        hung = job.fate is Fate.HANG and job.onset is not None and job.onset < stop
        return Lifecycle(Ending.KILL_LONG, stop, stop, Cause.HANG if hung else None, job.onset if hung else None)
    if sig < math.inf:
        if job.fate is Fate.HANG and job.onset is not None and job.onset < sig:
            return Lifecycle(Ending.SIGTERM, sig, None, Cause.HANG, job.onset)
        return Lifecycle(Ending.SIGTERM, sig, None, Cause.SIGTERM, sig)
    if job.fate in (Fate.CRASH, Fate.NEVER_STARTED):
        beat = job.beats.first
        cause = Cause.CRASH if beat is not None and beat <= natural else Cause.NEVER_STARTED
        return Lifecycle(Ending.DIED, natural, None, cause, natural)
    if job.fate is Fate.HANG:  # only an infinite maximum duration gets here
        return Lifecycle(Ending.DIED, math.inf, None, Cause.HANG, job.onset)
    return Lifecycle(Ending.FINISHED, natural, natural, None, None)


@dataclass(frozen=True)
class MaxDuration:
    """kill_long_job's maximum duration over time: ``phases`` of (from, seconds), the first from -inf (picklable)."""

    phases: tuple[tuple[float, float], ...]

    def __call__(self, moment: float) -> float:
        seconds = self.phases[0][1]
        for since, value in self.phases:
            if moment >= since:
                seconds = value
        return seconds


def constant(seconds: float) -> MaxDuration:
    """A maximum duration that never changes."""
    return MaxDuration(((-math.inf, seconds),))


@dataclass
class Trace:
    """A seed's deployment: its jobs, pods and deploys, and the fleet size minute by minute (all pools)."""

    settings: object  # generate.TraceSettings (kept loose: the hand-made traces of the tests carry their own)
    jobs: list[Job]
    pods: list[Pod]
    deploys: list[float]
    fleet_minutes: dict[int, int] = field(default_factory=dict)  # minute (from the scored day's start) -> pods
    start: float = 0.0  # the scored window: deaths in [start, end) are timed
    end: float = DAY
    horizon: float = DAY  # the replay runs until then (a tail for the last deaths to be found)
    begin: float = 0.0  # ... from then (the warm-up's start)

    def fleet_at(self, t: float) -> int:
        minute = int(t // 60)
        if minute in self.fleet_minutes:
            return self.fleet_minutes[minute]
        keys = sorted(self.fleet_minutes)
        return self.fleet_minutes[keys[min(max(bisect.bisect_right(keys, minute) - 1, 0), len(keys) - 1)]]


def moment(seconds: float) -> dt.datetime:
    """The trace's ``seconds`` as the date the deployment would store (milliseconds, as BSON keeps them)."""
    return EPOCH + dt.timedelta(milliseconds=math.floor(seconds * 1000))


# --- what a contender did with the trace ------------------------------------------------------------------


class Actor(StrEnum):
    KILL_STUCK = "kill_stuck_jobs"  # the deployment's pass over every started job, in every pod
    KILL_LONG = "kill_long_job"  # the deployment's executor, on its own job
    CLEANUP = "cleanup"  # zombie_pipeline's cleanup run (the sensor's)
    WATCHER = "watcher"  # the standing watch run of issue 34 (modelled)


@dataclass(frozen=True)
class Finalization:
    """One finalizing write of a job (its cache error and, the first time, its deletion): when, by whom, why."""

    at: float
    actor: Actor
    reason: str  # zombie_pipeline's Reason values: missing_heartbeat, never_heartbeated, terminated, exceeded_...
    #: The cause the killer told (zombie_pipeline's Cause values); the deployment tells none, it counts every dead job
    #: as a crash (JobManagerCrashedError) and a job stopped at its maximum duration as a timeout.
    cause: str = "crash"
    retry: str | None = None  # what became of its retry (RetryOutcome); None: left to the deployment's backfill
    costs_run: bool = True  # the write counted one of the job's failed runs (the deployment: every error does)


@dataclass
class Outcome:
    """Everything a contender did with the trace: each job's finalizations, and its own counts."""

    contender: str
    max_duration: MaxDuration  # kill_long_job's, in the deployment's executors
    finalizations: dict[int, list[Finalization]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0

    def add(self, job: int, finalization: Finalization) -> None:
        self.finalizations.setdefault(job, []).append(finalization)
