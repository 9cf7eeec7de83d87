"""The replay's ground truth: a simulated deployment whose every job has a known fate, fixed by a seed.

Issue 29 asks how well the zombie killers detect, so the trace must say when each
job really died, which nobody can say of a production queue. It is generated once
(:func:`generate`) and replayed unchanged against every contender:

* **a fleet** that follows the day: a few pods at night, ``peak_workers`` from 10:00
  to 18:00 UTC, ramps between; pods scaled down are idle ones first, else SIGTERMed;
* **jobs** arriving at a rate that follows the fleet, of job types with their own
  log-normal durations (seconds to an hour, some heavy-tailed), taken by a free pod;
* **fates**, drawn per job: healthy, a healthy straggler (1-3x its type's p99), an
  OOM crash partway (heartbeats stop; the pod restarts), never started (the pod dies
  before the job's first heartbeat), a hang (the process stops making progress and
  its executor keeps heartbeating);
* **heartbeats** from the pod's executor every 60 s, a little late each time and
  now and then much later (GC pauses, slow I/O: gaps up to 4 minutes that are not
  deaths);
* **deploy waves**: every pod SIGTERMed within a rolling window, ``terminated_at``
  written on its job, the pod killed after its grace period and replaced;
* **kill_long_job's checks**: each job's executor looks at its own job every
  30-90 s; which check stops it depends on the maximum duration in force, so each
  contender applies its own (:func:`lifecycle`).

A pod's occupancy in the trace is what its job does under the deployment's chart
value (2400 s): a contender with another maximum duration would free some pods at
other moments, which the trace does not replay (it would no longer be the same trace).
Times are seconds from the trace's start, a midnight UTC.
"""

from __future__ import annotations

import bisect
import datetime as dt
import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

DAY = 86_400.0
#: The trace's origin, a midnight UTC, when its times become dates (the queue's documents, a statistics window).
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
    """How a job's process ended under one contender's maximum duration."""

    FINISHED = "finished"  # normally: the worker deletes its job
    DIED = "died"  # crash or never started: the document stays, started
    SIGTERM = "sigterm"  # killed at the end of its grace period: the document stays, with terminated_at
    KILL_LONG = "kill_long_job"  # stopped by its own executor past the maximum duration, finalized by the worker


@dataclass(frozen=True)
class JobType:
    """A processing step: its share of the jobs and its duration law (log-normal), its crash and hang rates."""

    name: str
    weight: float
    median_seconds: float
    sigma: float
    crash_rate: float
    hang_rate: float
    level: str = "dataset"  # which of config and split its jobs carry
    difficulty: int = 50

    @property
    def p99_seconds(self) -> float:
        return self.median_seconds * math.exp(Z99 * self.sigma)


#: Shaped after dataset-viewer's steps: many quick ones, a few heavy ones whose p99 is near an hour (so the chart's
#: 2400 s stops some healthy runs, issue #1395), the heavy ones more often OOM-killed.
JOB_TYPES: tuple[JobType, ...] = (
    JobType("/config-names", 0.18, 5, 0.7, 0.003, 0.001),
    JobType("/size", 0.18, 3, 0.6, 0.002, 0.001, difficulty=20),
    JobType("/split-names", 0.14, 25, 1.0, 0.006, 0.002, "config"),
    JobType("/first-rows", 0.22, 60, 1.1, 0.015, 0.003, "split", 70),
    JobType("/parquet-and-info", 0.12, 300, 1.0, 0.040, 0.006, "config", 90),
    JobType("/duckdb-index", 0.08, 600, 0.7, 0.050, 0.006, "split", 90),
    JobType("/descriptive-statistics", 0.08, 240, 1.2, 0.030, 0.006, "split", 70),
)


@dataclass(frozen=True)
class TraceSettings:
    """Everything the trace is drawn from; the same settings and seed give the same trace."""

    seed: int = 29
    days: float = 7.0
    tail_hours: float = 4.0  # after the last arrival: no new jobs, every zombie has time to be found
    jobs: int = 16_000  # expected arrivals (Poisson): 10,000+ started jobs in 7 days
    peak_workers: int = 50
    night_workers: int = 4
    heartbeat_seconds: float = 60.0
    heartbeat_late_seconds: float = 1.5  # each beat is up to this late (the call itself, the event loop)
    long_gap_probability: float = 0.01  # per interval: a GC pause or slow I/O
    long_gap_seconds: tuple[float, float] = (90.0, 240.0)  # never more than 4 minutes: not a death
    never_started_rate: float = 0.004
    straggler_rate: float = 0.005
    straggler_p99_factor: tuple[float, float] = (1.0, 3.0)
    deploy_waves: int = 10  # about one a day, at random days and hours (two may fall on one day)
    deploy_hours: tuple[float, float] = (10.0, 17.0)  # UTC, at the peak fleet
    rollout_seconds: float = 120.0  # pods of a wave are SIGTERMed within this
    grace_seconds: float = 30.0  # Kubernetes' default terminationGracePeriodSeconds
    replace_seconds: tuple[float, float] = (20.0, 60.0)  # a new pod is up after its predecessor died
    restart_seconds: tuple[float, float] = (10.0, 40.0)  # a crashed container is restarted
    kill_long_check_seconds: tuple[float, float] = (30.0, 90.0)  # 0.5-1.5 x killLongJobIntervalSeconds (60 s)
    chart_max_duration_seconds: float = 2400.0  # maxJobDurationSeconds in the chart: the trace's pods follow it
    job_types: tuple[JobType, ...] = JOB_TYPES

    @property
    def end(self) -> float:
        return self.days * DAY + self.tail_hours * 3600.0


def moment(seconds: float) -> dt.datetime:
    """The trace's ``seconds`` as the date the deployment would store (milliseconds, as BSON keeps them)."""
    return EPOCH + dt.timedelta(milliseconds=math.floor(seconds * 1000))


def fleet_target(settings: TraceSettings, t: float) -> int:
    """How many pods the autoscaler wants at ``t``: night trough, morning ramp, day plateau, evening ramp."""
    hour = (t % DAY) / 3600.0
    low, high = settings.night_workers, settings.peak_workers
    if hour < 6:
        share = 0.0
    elif hour < 10:
        share = (hour - 6) / 4
    elif hour < 18:
        share = 1.0
    else:
        share = (24 - hour) / 6
    return round(low + (high - low) * share)


class Beats:
    """A job's heartbeats from its start on, drawn lazily from its own generator (the same for every contender)."""

    __slots__ = ("_rng", "_settings", "times")

    def __init__(self, seed: int, start: float, settings: TraceSettings, times: list[float] | None = None) -> None:
        self._settings = settings
        self._rng: random.Random | None = None
        if times is not None:  # hand-made: exactly these beats, no more
            self.times = list(times)
        else:
            self._rng = random.Random(seed)
            self.times = [start + self._rng.uniform(0.0, settings.heartbeat_seconds)]  # the executor's next tick

    def _extend_past(self, t: float) -> None:
        if self._rng is None:
            return
        s, times = self._settings, self.times
        while times[-1] <= t:
            if self._rng.random() < s.long_gap_probability:
                gap = self._rng.uniform(*s.long_gap_seconds)
            else:
                gap = s.heartbeat_seconds + self._rng.uniform(0.0, s.heartbeat_late_seconds)
            times.append(times[-1] + gap)

    @property
    def first(self) -> float | None:
        return self.times[0] if self.times else None

    def last_before(self, t: float) -> float | None:
        """The last beat at or before ``t`` (None: none yet)."""
        self._extend_past(t)
        index = bisect.bisect_right(self.times, t)
        return self.times[index - 1] if index else None

    def longest_gap(self, until: float) -> float:
        """The longest silence between two beats before ``until`` (for the checks of the trace)."""
        self._extend_past(until)
        beats = [b for b in self.times if b <= until]
        return max((b - a for a, b in zip(beats, beats[1:], strict=False)), default=0.0)


class Checks:
    """The moments a job's executor runs ``kill_long_job`` on it: every 0.5-1.5 x 60 s from a random phase."""

    __slots__ = ("_rng", "_settings", "times")

    def __init__(self, seed: int, start: float, settings: TraceSettings, times: list[float] | None = None) -> None:
        self._settings = settings
        self._rng: random.Random | None = None
        if times is not None:  # hand-made: exactly these checks, no more
            self.times = list(times)
            return
        self._rng = random.Random(seed)
        low, high = settings.kill_long_check_seconds
        # the residual of a renewal process of U(low, high) intervals has mean (low^2 + low*high + high^2) / 3 / (low + high)
        self.times = [start + self._rng.uniform(0.0, 2 * (low * low + low * high + high * high) / 3 / (low + high))]

    def first_at_or_after(self, t: float, limit: float = math.inf) -> float | None:
        """The first check at or after ``t`` and before ``limit`` (None: none)."""
        times = self.times
        if self._rng is not None:
            low, high = self._settings.kill_long_check_seconds
            while times[-1] < t and times[-1] < limit:
                times.append(times[-1] + self._rng.uniform(low, high))
        index = bisect.bisect_left(times, t)
        if index < len(times) and times[index] < limit:
            return times[index]
        return None

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
    """One pod incarnation: its executor runs kill_stuck_jobs from its start to its end."""

    index: int
    start: float
    end: float = math.inf
    sigterm_at: float | None = None


@dataclass
class Trace:
    settings: TraceSettings
    jobs: list[Job]
    pods: list[Pod]
    waves: list[float]
    fleet_minutes: list[int] = field(default_factory=list)  # the autoscaler's target, minute by minute

    def fleet_at(self, t: float) -> int:
        minute = min(max(int(t // 60), 0), len(self.fleet_minutes) - 1)
        return self.fleet_minutes[minute]


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
    stop = job.checks.stop_time(job.start, max_duration, alive_until)
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
    """kill_long_job's maximum duration over time: ``phases`` of (from, seconds), the first from 0 (picklable)."""

    phases: tuple[tuple[float, float], ...]

    def __call__(self, moment: float) -> float:
        seconds = self.phases[0][1]
        for since, value in self.phases:
            if moment >= since:
                seconds = value
        return seconds


def constant(seconds: float) -> MaxDuration:
    """A maximum duration that never changes."""
    return MaxDuration(((0.0, seconds),))


# --- what a contender did with the trace ------------------------------------------------------------------


class Actor(StrEnum):
    KILL_STUCK = "kill_stuck_jobs"  # the deployment's pass over every started job, in every pod
    KILL_LONG = "kill_long_job"  # the deployment's executor, on its own job
    CLEANUP = "cleanup"  # zombie_pipeline.cleanup.run, driven by a schedule or the sensor


@dataclass(frozen=True)
class Finalization:
    """One finalizing write of a job (its cache error and its finish): when, by whom, why."""

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
    settings: dict[str, object] = field(default_factory=dict)
    wall_seconds: float = 0.0
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # this process's, and its server's when known

    def add(self, job: int, finalization: Finalization) -> None:
        self.finalizations.setdefault(job, []).append(finalization)


# --- generation ---------------------------------------------------------------------------------------------


class _Generator:
    """An event simulation of the fleet: arrivals, pods, deploy waves; each job's fate drawn when it starts."""

    def __init__(self, settings: TraceSettings) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.jobs: list[Job] = []
        self.pods: list[Pod] = []
        self.events: list[tuple[float, int, str, int]] = []
        self.sequence = 0
        self.idle: list[int] = []  # pods taking jobs
        self.busy: dict[int, int] = {}  # pod -> job
        self.starting = 0  # pods scheduled to come up
        self.queue: deque[float] = deque()  # arrival times
        self.free_token: dict[int, int] = {}  # pod -> the job whose end frees it (a stale event is ignored)
        weights = [t.weight for t in settings.job_types]
        self.type_weights = [w / sum(weights) for w in weights]
        self.fleet_minutes = [fleet_target(settings, minute * 60.0) for minute in range(int(settings.end // 60) + 2)]
        arrival_minutes = self.fleet_minutes[: int(settings.days * DAY // 60)]
        self.rate_per_pod = settings.jobs / (sum(arrival_minutes) * 60.0)  # arrivals per pod-second

    def push(self, t: float, kind: str, subject: int = -1) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (t, self.sequence, kind, subject))

    def run(self) -> Trace:
        s = self.s
        self.push(0.0, "fleet")
        self.push(self._next_arrival(0.0), "arrival")
        waves: list[float] = []
        for _ in range(1_000 * s.deploy_waves):  # a short trace holds fewer than asked: as many as fit
            if len(waves) == s.deploy_waves:
                break
            wave = self.rng.randrange(max(math.ceil(s.days), 1)) * DAY + self.rng.uniform(*s.deploy_hours) * 3600.0
            if wave < s.days * DAY and all(abs(wave - other) > 3600.0 for other in waves):  # an hour apart at least
                waves.append(wave)
        waves.sort()
        for wave in waves:
            self.push(wave, "wave")
        while self.events:
            t, _, kind, subject = heapq.heappop(self.events)
            if t > s.end:
                break
            getattr(self, f"_on_{kind}")(t, subject)
        for pod in self.pods:
            pod.end = min(pod.end, s.end)
        return Trace(s, sorted(self.jobs, key=lambda job: job.start), self.pods, waves, self.fleet_minutes)

    # events ---------------------------------------------------------------------------------------------

    def _next_arrival(self, t: float) -> float:
        """Poisson arrivals at rate_per_pod x the fleet target (by thinning against the peak)."""
        peak = self.rate_per_pod * self.s.peak_workers
        while True:
            t += self.rng.expovariate(peak)
            if (
                self.rng.random() * peak
                <= self.rate_per_pod * self.fleet_minutes[min(int(t // 60), len(self.fleet_minutes) - 1)]
            ):
                return t

    def _on_arrival(self, t: float, _: int) -> None:
        if t < self.s.days * DAY:
            self.queue.append(t)
            self.push(self._next_arrival(t), "arrival")
            self._assign(t)

    def _on_fleet(self, t: float, _: int) -> None:
        target = self.fleet_minutes[int(t // 60)]
        live = len(self.idle) + len(self.busy) + self.starting
        for _ in range(target - live):
            self.starting += 1
            self.push(t + self.rng.uniform(10.0, 30.0), "pod_up")
        excess = live - target
        while excess > 0 and self.idle:
            pod = self.idle.pop(self.rng.randrange(len(self.idle)))
            self.pods[pod].end = t
            excess -= 1
        busy = list(self.busy)
        self.rng.shuffle(busy)
        for pod in busy[: max(excess, 0)]:  # Kubernetes scales down pods, not jobs
            self._sigterm(t, pod, replace=False)
        self.push(t + 60.0, "fleet")

    def _on_pod_up(self, t: float, _: int) -> None:
        self.starting -= 1
        self.pods.append(Pod(len(self.pods), t))
        self.idle.append(len(self.pods) - 1)
        self._assign(t)

    def _on_wave(self, t: float, _: int) -> None:
        for pod in list(self.idle) + list(self.busy):
            self.push(t + self.rng.uniform(0.0, self.s.rollout_seconds), "wave_sigterm", pod)

    def _on_wave_sigterm(self, t: float, pod: int) -> None:
        if self.pods[pod].sigterm_at is None and self.pods[pod].end > t:
            self._sigterm(t, pod, replace=True)

    def _sigterm(self, t: float, pod: int, replace: bool) -> None:
        """The executor writes terminated_at on its job; the pod is killed after its grace period."""
        self.pods[pod].sigterm_at = t
        kill = t + self.s.grace_seconds
        if pod in self.idle:
            self.idle.remove(pod)
        job_index = self.busy.pop(pod, None)
        if job_index is not None:
            job = self.jobs[job_index]
            job.sigterm_at, job.sigterm_kill = t, kill
            self.free_token.pop(pod, None)  # its end no longer frees the pod: the kill does
        self.pods[pod].end = kill
        if replace:
            self.starting += 1
            self.push(kill + self.rng.uniform(*self.s.replace_seconds), "pod_up")

    def _on_free(self, t: float, pod: int) -> None:
        job_index = self.free_token.pop(pod, None)
        if job_index is None or self.busy.get(pod) != job_index:
            return
        del self.busy[pod]
        ending = lifecycle(self.jobs[job_index], constant(self.s.chart_max_duration_seconds)).ending
        if ending is Ending.FINISHED:
            self.idle.append(pod)
            self._assign(t)
            return
        self.pods[pod].end = t  # the container exits (OOM, or kill_long_job stopped the worker loop): restarted
        self.starting += 1
        self.push(t + self.rng.uniform(*self.s.restart_seconds), "pod_up")

    # jobs -------------------------------------------------------------------------------------------------

    def _assign(self, t: float) -> None:
        while self.queue and self.idle:
            arrival = self.queue.popleft()
            pod = self.idle.pop(self.rng.randrange(len(self.idle)))
            job = self._new_job(arrival, t, pod)
            self.jobs.append(job)
            self.busy[pod] = job.index
            self.free_token[pod] = job.index
            end = lifecycle(job, constant(self.s.chart_max_duration_seconds)).process_end
            self.push(end, "free", pod)

    def _new_job(self, created: float, start: float, pod: int) -> Job:
        s, rng = self.s, self.rng
        kind = rng.choices(s.job_types, self.type_weights)[0]
        index = len(self.jobs)
        duration = kind.median_seconds * math.exp(rng.gauss(0.0, kind.sigma))
        beats = Beats(s.seed * 1_000_003 + 2 * index, start, s)
        checks = Checks(s.seed * 1_000_003 + 2 * index + 1, start, s)
        draw = rng.random()
        onset = None
        if draw < s.never_started_rate:
            fate = Fate.NEVER_STARTED
            first = beats.first if beats.first is not None else start + s.heartbeat_seconds
            natural_end = start + rng.uniform(0.0, first - start)
        elif draw < s.never_started_rate + kind.crash_rate:
            fate, natural_end = Fate.CRASH, start + duration * rng.uniform(0.05, 1.0)
        elif draw < s.never_started_rate + kind.crash_rate + kind.hang_rate:
            fate, natural_end = Fate.HANG, math.inf
            onset = start + duration * rng.uniform(0.1, 1.0)
        elif draw < s.never_started_rate + kind.crash_rate + kind.hang_rate + s.straggler_rate:
            fate = Fate.STRAGGLER
            natural_end = start + kind.p99_seconds * rng.uniform(*s.straggler_p99_factor)
        else:
            fate, natural_end = Fate.HEALTHY, start + duration
        config = None if kind.level == "dataset" else rng.choice(("default", "en", "fr"))
        split = rng.choice(("train", "test", "validation")) if kind.level == "split" else None
        return Job(
            index=index,
            job_type=kind.name,
            dataset=f"user{rng.randrange(400)}/dataset-{rng.randrange(5_000)}",
            config=config,
            split=split,
            revision=f"{rng.getrandbits(40):010x}",
            difficulty=kind.difficulty,
            created=created,
            start=start,
            pod=pod,
            fate=fate,
            natural_end=natural_end,
            beats=beats,
            checks=checks,
            onset=onset,
        )


def generate(settings: TraceSettings = TraceSettings()) -> Trace:
    """The trace of ``settings``: the same one every time for the same settings."""
    return _Generator(settings).run()
