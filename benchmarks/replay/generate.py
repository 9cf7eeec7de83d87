"""A seed's trace: the chart's fleet (:mod:`.fleet`) running a day of jobs, as an event simulation.

Jobs arrive per pool at a rate that follows the day (each pool's offered load, in busy pods, between its night and
its peak value), wait in their pool's queue, and are taken by an idle pod. Every pool's HPA looks every 60 s at its
metric (the pool's waiting and started jobs, refreshed every 10 minutes) and adds or removes one pod; a removed pod
is the youngest ready one, busy or not (SIGTERMed: ``terminated_at`` on its job, killed after its pool's grace). A
deploy recreates heavy and medium and rolls light a quarter at a time. Each job's fate is drawn when it starts, its
process end follows the chart's 2400 s (the trace's pods are busy as the deployment's are under its own value).

The trace runs from ``-warmup_hours`` (the fleet settles) to the scored day's end plus ``tail_hours`` without
arrivals (the last deaths are found); deaths are timed in ``[0, days x 86,400)``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field

from benchmarks.replay.fleet import (
    CHART_POOLS,
    HPA_PERIOD_SECONDS,
    METRIC_PERIOD_SECONDS,
    Pool,
    day_share,
    desired_pods,
    rolling_batch,
    scale_down_choice,
)
from benchmarks.replay.trace import (
    DAY,
    JOB_TYPES,
    Beats,
    Checks,
    Ending,
    Fate,
    HeartbeatSettings,
    Job,
    JobType,
    Pod,
    Trace,
    constant,
    lifecycle,
)


@dataclass(frozen=True)
class TraceSettings:
    """Everything a trace is drawn from; the same settings and seed give the same trace."""

    seed: int = 1
    pools: tuple[Pool, ...] = CHART_POOLS
    label: str = "the chart's fleet (18-170 pods)"
    days: float = 1.0
    warmup_hours: float = 6.0
    tail_hours: float = 2.0
    heartbeat: HeartbeatSettings = field(default_factory=HeartbeatSettings)
    never_started_rate: float = 0.004
    straggler_rate: float = 0.005
    straggler_p99_factor: tuple[float, float] = (1.0, 3.0)
    deploys_per_day: float = 1.4  # issue 29's trace: 10 a week, by day (10:00-17:00 UTC), an hour apart at least
    deploy_hours: tuple[float, float] = (10.0, 17.0)
    pod_start_seconds: tuple[float, float] = (20.0, 60.0)  # scheduled to ready (image cached; light starts slowly)
    restart_seconds: tuple[float, float] = (10.0, 40.0)  # a crashed container is restarted
    kill_long_check_seconds: tuple[float, float] = (30.0, 90.0)  # 0.5-1.5 x killLongJobIntervalSeconds (60 s)
    chart_max_duration_seconds: float = 2400.0  # maxJobDurationSeconds in the chart: the trace's pods follow it
    job_types: tuple[JobType, ...] = JOB_TYPES

    @property
    def start(self) -> float:
        return -self.warmup_hours * 3600.0

    @property
    def end(self) -> float:
        return self.days * DAY

    @property
    def horizon(self) -> float:
        return self.end + self.tail_hours * 3600.0


@dataclass
class _PoolState:
    pool: Pool
    types: list[JobType]
    cumulative: list[float]  # the types' cumulative weights (random.choices)
    mean_seconds: float
    ready: list[int] = field(default_factory=list)  # pods taking jobs or busy, not SIGTERMed
    idle: list[int] = field(default_factory=list)
    busy: dict[int, int] = field(default_factory=dict)  # pod -> job
    starting: dict[int, int] = field(default_factory=dict)  # token -> version of a pod on its way up
    queue: deque[float] = field(default_factory=deque)  # arrival times
    metric: int = 0
    version: int = 0  # the deploy generation new pods belong to

    @property
    def replicas(self) -> int:
        return len(self.ready) + len(self.starting)


class Generator:
    """The event simulation; :meth:`run` returns the trace."""

    def __init__(self, settings: TraceSettings) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.jobs: list[Job] = []
        self.pods: list[Pod] = []
        self.pod_version: dict[int, int] = {}
        self.events: list[tuple[float, int, str, int, int]] = []
        self.sequence = 0
        self.free_token: dict[int, int] = {}  # pod -> the job whose end frees it (a stale event is ignored)
        self.tokens = 0
        self.pools: dict[str, _PoolState] = {}
        for pool in settings.pools:
            types = [t for t in settings.job_types if pool.takes(t.difficulty)]
            weights = [t.weight / sum(u.weight for u in types) for t in types]
            mean = sum(w * t.mean_seconds for w, t in zip(weights, types, strict=True))
            self.pools[pool.name] = _PoolState(pool, types, list(itertools.accumulate(weights)), mean)
        self.chart_max = constant(settings.chart_max_duration_seconds)
        self.pool_index = {pool.name: position for position, pool in enumerate(settings.pools)}
        self.horizon = settings.horizon

    def push(self, t: float, kind: str, pool: str = "", subject: int = -1) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (t, self.sequence, kind, self.pool_index[pool] if pool else -1, subject))

    def run(self) -> Trace:
        s = self.s
        for state in self.pools.values():
            for _ in range(state.pool.min_pods):
                self._start_pod(s.start - self.rng.uniform(0, 600), state, ready_at=s.start)
            self.push(s.start + self.rng.uniform(0, HPA_PERIOD_SECONDS), "hpa", state.pool.name)
            self.push(s.start, "metric", state.pool.name)
            self.push(self._next_arrival(s.start, state), "arrival", state.pool.name)
        deploys: list[float] = []
        count = _poisson(self.rng, s.deploys_per_day * s.days)
        for _ in range(1_000):
            if len(deploys) >= count:
                break
            at = self.rng.randrange(max(math.ceil(s.days), 1)) * DAY + self.rng.uniform(*s.deploy_hours) * 3600.0
            if at < s.end and all(abs(at - other) > 3600.0 for other in deploys):
                deploys.append(at)
        for at in sorted(deploys):
            self.push(at, "deploy")
        while self.events:
            t, _, kind, pool_index, subject = heapq.heappop(self.events)
            if t > s.horizon:
                break
            pool_state = self.pools[s.pools[pool_index].name] if pool_index >= 0 else None
            getattr(self, f"_on_{kind}")(t, pool_state, subject)
        for pod in self.pods:
            pod.end = min(pod.end, s.horizon)
        trace = Trace(s, sorted(self.jobs, key=lambda job: job.start), self.pods, sorted(deploys))
        for position, job in enumerate(trace.jobs):  # indices in start order
            job.index = position
        trace.fleet_minutes = fleet_minutes(self.pods, s.start, s.horizon)
        trace.start, trace.end, trace.horizon, trace.begin = 0.0, s.end, s.horizon, s.start
        return trace

    # pods -------------------------------------------------------------------------------------------------

    def _start_pod(self, t: float, state: _PoolState, ready_at: float | None = None) -> None:
        self.tokens += 1
        state.starting[self.tokens] = state.version
        up = ready_at if ready_at is not None else t + self.rng.uniform(*self.s.pod_start_seconds)
        self.push(up, "pod_up", state.pool.name, self.tokens)

    def _on_pod_up(self, t: float, state: _PoolState, token: int) -> None:
        version = state.starting.pop(token, None)
        if version is None:  # cancelled by a scale-down before it was ready
            return
        pod = Pod(len(self.pods), state.pool.name, t)
        self.pods.append(pod)
        self.pod_version[pod.index] = version
        state.ready.append(pod.index)
        state.idle.append(pod.index)
        self._assign(t, state)

    def _on_hpa(self, t: float, state: _PoolState, _: int) -> None:
        replicas = state.replicas
        wanted = desired_pods(state.pool, replicas, state.metric)
        if wanted > replicas:
            self._start_pod(t, state)
        elif wanted < replicas:
            if state.starting:  # a pod not ready yet goes first
                state.starting.pop(next(iter(state.starting)))
            elif state.ready:
                ready_since = [self.pods[pod].start for pod in state.ready]
                self._sigterm(t, state, state.ready[scale_down_choice(ready_since, t, self.rng)])
        self.push(t + HPA_PERIOD_SECONDS, "hpa", state.pool.name)

    def _on_metric(self, t: float, state: _PoolState, _: int) -> None:
        state.metric = len(state.queue) + len(state.busy)
        self.push(t + METRIC_PERIOD_SECONDS, "metric", state.pool.name)

    def _on_deploy(self, t: float, no_pool: None, no_subject: int) -> None:
        for state in self.pools.values():
            state.version += 1
            if state.pool.rolling_share is None:  # Recreate: every old pod at once, the new ones once they are gone
                wanted = state.replicas
                state.starting.clear()
                for old in list(state.ready):
                    self._sigterm(t, state, old)
                for _ in range(wanted):
                    self._start_pod(t + state.pool.grace_seconds, state)
            else:
                self._on_roll(t, state, state.version)

    def _on_roll(self, t: float, state: _PoolState, version: int) -> None:
        """One step of a rolling update: a quarter of the old pods SIGTERMed, as many new ones started; the next
        step once they are ready. Old pods keep working (and passing) until their turn."""
        if version != state.version:
            return  # a later deploy took over
        old = [pod for pod in state.ready if self.pod_version[pod] < version]
        if not old:
            return
        batch = old[: rolling_batch(state.pool, state.replicas)]
        for pod in batch:
            self._sigterm(t, state, pod)
        ready_at = [t + self.rng.uniform(*self.s.pod_start_seconds) for _ in batch]
        for up in ready_at:
            self.tokens += 1
            state.starting[self.tokens] = version
            self.push(up, "pod_up", state.pool.name, self.tokens)
        self.push(max(ready_at), "roll", state.pool.name, version)

    def _sigterm(self, t: float, state: _PoolState, pod: int) -> None:
        """The executor writes terminated_at on its job; the pod is killed after its pool's grace period."""
        self.pods[pod].sigterm_at = t
        kill = t + state.pool.grace_seconds
        state.ready.remove(pod)
        if pod in state.idle:
            state.idle.remove(pod)
        job_index = state.busy.pop(pod, None)
        if job_index is not None:
            job = self.jobs[job_index]
            job.sigterm_at, job.sigterm_kill = t, kill
            self.free_token.pop(pod, None)  # its end no longer frees the pod: the kill does
        self.pods[pod].end = kill

    def _on_free(self, t: float, state: _PoolState, pod: int) -> None:
        job_index = self.free_token.pop(pod, None)
        if job_index is None or state.busy.get(pod) != job_index:
            return
        del state.busy[pod]
        if lifecycle(self.jobs[job_index], self.chart_max).ending is Ending.FINISHED:
            state.idle.append(pod)
            self._assign(t, state)
            return
        # the container exits (OOM, or kill_long_job stopped the worker loop): the pod restarts
        state.ready.remove(pod)
        self.pods[pod].end = t
        self.tokens += 1
        state.starting[self.tokens] = self.pod_version[pod]
        self.push(t + self.rng.uniform(*self.s.restart_seconds), "pod_up", state.pool.name, self.tokens)

    # jobs -------------------------------------------------------------------------------------------------

    def _rate(self, t: float, state: _PoolState) -> float:
        pool = state.pool
        return (pool.night_load_pods + (pool.peak_load_pods - pool.night_load_pods) * day_share(t)) / state.mean_seconds

    def _next_arrival(self, t: float, state: _PoolState) -> float:
        """Poisson arrivals at the pool's rate of the moment (by thinning against its peak)."""
        peak = max(state.pool.peak_load_pods, state.pool.night_load_pods) / state.mean_seconds
        while True:
            t += self.rng.expovariate(peak)
            if self.rng.random() * peak <= self._rate(t, state):
                return t

    def _on_arrival(self, t: float, state: _PoolState, _: int) -> None:
        if t < self.s.end:
            state.queue.append(t)
            self.push(self._next_arrival(t, state), "arrival", state.pool.name)
            self._assign(t, state)

    def _assign(self, t: float, state: _PoolState) -> None:
        while state.queue and state.idle:
            arrival = state.queue.popleft()
            pod = state.idle.pop(self.rng.randrange(len(state.idle)))
            job = self._new_job(arrival, t, pod, state)
            self.jobs.append(job)
            state.busy[pod] = job.index
            self.free_token[pod] = job.index
            self.push(lifecycle(job, self.chart_max).process_end, "free", state.pool.name, pod)

    def _new_job(self, created: float, start: float, pod: int, state: _PoolState) -> Job:
        s, rng = self.s, self.rng
        kind = rng.choices(state.types, cum_weights=state.cumulative)[0]
        index = len(self.jobs)
        duration = kind.median_seconds * math.exp(rng.gauss(0.0, kind.sigma))
        first = start + rng.uniform(0.0, s.heartbeat.interval_seconds)
        draw = rng.random()
        onset = None
        if draw < s.never_started_rate:
            fate, natural_end = Fate.NEVER_STARTED, start + rng.uniform(0.0, first - start)
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
        beats = self._beats(start, first, min(natural_end, start + s.chart_max_duration_seconds + 600, self.horizon))
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
            checks=Checks(s.seed * 1_000_003 + index, start, s.kill_long_check_seconds),
            onset=onset,
        )

    def _beats(self, start: float, first: float, until: float) -> Beats:
        """The executor's beats, with the pauses of its loop drawn over the job's run (a Poisson process)."""
        h, rng = self.s.heartbeat, self.rng
        pauses = []
        rate = h.pauses_per_hour / 3600.0
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= until:
                break
            pauses.append((t, h.pause_median_seconds * math.exp(rng.gauss(0.0, h.pause_sigma))))
        return Beats(first, h.interval_seconds + rng.uniform(*h.call_seconds), pauses)


def _poisson(rng: random.Random, mean: float) -> int:
    count, threshold, product = 0, math.exp(-mean), rng.random()
    while product > threshold:
        count += 1
        product *= rng.random()
    return count


def fleet_minutes(pods: list[Pod], start: float, end: float) -> dict[int, int]:
    """Pods alive (ready or terminating: their executor still passes) at each minute of ``[start, end)``."""
    changes = sorted([(pod.start, 1) for pod in pods] + [(pod.end, -1) for pod in pods if pod.end < math.inf])
    out: dict[int, int] = {}
    alive, position = 0, 0
    for minute in range(math.floor(start / 60), math.ceil(end / 60)):
        while position < len(changes) and changes[position][0] <= minute * 60.0:
            alive += changes[position][1]
            position += 1
        out[minute] = alive
    return out


def generate(settings: TraceSettings = TraceSettings()) -> Trace:
    """The trace of ``settings``: the same one every time for the same settings."""
    return Generator(settings).run()
