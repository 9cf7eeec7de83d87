"""The contenders on one trace, in one event loop: the deployment's killer, the sensor's cleanup runs, the watcher.

A contender is any set of them on the same queue (:class:`Contender`): (a) the deployment's ``kill_stuck_jobs``
alone; (c) ``stale_jobs_sensor`` and its cleanup runs; (w) the watcher of issue 34; and (a) beside each of ours
(the deployment's ``kill_stuck_jobs`` stays on unless an operator turns it off), where whoever deletes a job first
takes it from the others. The deployment's ``kill_long_job`` runs in every contender (only it stops a process).

What each does, and when:

* **kill_stuck_jobs** (:mod:`.deployment`): every pod's passes; a pass reads every started job (its read takes
  longer the more there are), then finishes the stuck ones one after the other (``set_stuck``: a cache upsert,
  then the job's deletion and its plan). A job deleted after the pass read it is written again (its cache error:
  finalized twice); a pass never sees what was deleted before its read.
* **the sensor** (``monitoring.stale_state``'s decision): a tick every 30-35 s (:class:`.latency.TickSpacing`) while
  no cleanup is in flight; stale jobs under a run key not seen before request a run, which starts after the start
  latency, finds 2 s later (the brake judged there, as ``brake.brake_for``), finalizes 1 s after (each job only
  if it is as it was found: compare-and-set) and is done 2 s after.
* **the watcher** (modelled, issue 34): it knows every started job's deadline and acts at it + its release lag
  (:func:`.latency.release_lag`), if the job is still as it was (compare-and-set).

When a rule holds comes from :mod:`.rules`; the replay's witness (:mod:`.database`) runs the real cleanup in place of
the sensor's model on a database and compares.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks.replay.database import DatabaseCleanup, RunTimes
from benchmarks.replay.deployment import DeploymentSettings, pass_times
from benchmarks.replay.latency import ReleaseLag, StartLatency, TickSpacing
from benchmarks.replay.rules import PRIORITY, Interval, Rule, intervals
from benchmarks.replay.trace import (
    Actor,
    Ending,
    Finalization,
    Lifecycle,
    MaxDuration,
    Outcome,
    Trace,
    constant,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.reasons import Cause, Reason

FIND_AFTER_START, FINALIZE_AFTER_FIND, DONE_AFTER_FINALIZE = 2.0, 1.0, 2.0


@dataclass(frozen=True)
class Contender:
    """Who acts on the queue: the deployment's killer, the sensor's runs, the watcher, or a pair."""

    name: str
    label: str
    killer: bool = False
    sensor: bool = False
    watcher: bool = False
    policy: ZombiePolicy | None = None  # the cleanup's (sensor, watcher)
    kill_long: MaxDuration = field(default_factory=lambda: constant(2400.0))
    start: StartLatency | None = None  # the sensor's runs
    lag: ReleaseLag | None = None  # the watcher's
    tick: TickSpacing = field(default_factory=TickSpacing)
    deployment: DeploymentSettings = field(default_factory=DeploymentSettings)


@dataclass
class _Queue:
    """Which jobs are still started: the worker's own removals, and the killers' deletions."""

    trace: Trace
    lives: Sequence[Lifecycle]
    deleted: dict[int, float] = field(default_factory=dict)  # job -> when a killer deleted it
    starts: list[float] = field(default_factory=list)
    removals: list[float] = field(default_factory=list)
    later_removals: list[float] = field(default_factory=list)  # worker removals of jobs a killer deleted first

    def __post_init__(self) -> None:
        self.starts = [job.start for job in self.trace.jobs]
        self.removals = sorted(life.removed_at for life in self.lives if life.removed_at is not None)

    def present(self, index: int, t: float) -> bool:
        removed = self.lives[index].removed_at
        return index not in self.deleted and self.trace.jobs[index].start <= t and (removed is None or removed > t)

    def delete(self, index: int, t: float) -> None:
        self.deleted[index] = t
        removed = self.lives[index].removed_at
        if removed is not None:
            bisect.insort(self.later_removals, removed)

    def started(self, t: float) -> int:
        """Started jobs at ``t`` (what a pass reads, what the brake counts)."""
        arrived = bisect.bisect_right(self.starts, t)
        gone = bisect.bisect_right(self.removals, t)
        deleted_still_counted = len(self.deleted) - bisect.bisect_right(self.later_removals, t)
        return arrived - gone - deleted_still_counted


class _Open:
    """The intervals of one rule open at the moment the loop has reached."""

    def __init__(self, spans: list[tuple[Interval, int]]) -> None:
        self.spans = sorted(spans, key=lambda item: item[0].since)
        self.position = 0
        self.open: list[tuple[Interval, int]] = []

    def at(self, t: float, queue: _Queue) -> list[tuple[int, str]]:
        while self.position < len(self.spans) and self.spans[self.position][0].since <= t:
            self.open.append(self.spans[self.position])
            self.position += 1
        self.open = [(span, job) for span, job in self.open if span.until > t and job not in queue.deleted]
        found: dict[int, str] = {}
        for span, job in self.open:
            if queue.present(job, t) and (job not in found or _priority(span.reason) < _priority(found[job])):
                found[job] = span.reason
        return sorted(found.items())


def _priority(reason: str) -> int:
    return [str(r) for r in PRIORITY].index(reason)


def rule_spans(trace: Trace, lives: Sequence[Lifecycle], rule: Rule) -> list[tuple[Interval, int]]:
    """Every interval of every job in which ``rule`` holds."""
    return [
        (span, job.index) for job, life in zip(trace.jobs, lives, strict=True) for span in intervals(job, life, rule)
    ]


def replay(
    trace: Trace,
    contender: Contender,
    lives: Sequence[Lifecycle],
    spans: dict[str, list[tuple[Interval, int]]],
    seed: int,
    backend: DatabaseCleanup | None = None,
    passes: list[tuple[float, int]] | None = None,
) -> Outcome:
    """What ``contender`` finalizes in ``trace``, and when; ``spans`` by rule (``deployment``, ``cleanup``). With a
    ``backend`` (the witness), the sensor's decisions and runs are the real cleanup's on a database; ``passes``: the killer's, hand-made (tests)."""
    started_at = time.perf_counter()
    outcome = Outcome(contender.name, contender.kill_long)
    queue = _Queue(trace, lives)
    events: list[tuple[float, int, str, tuple]] = []
    sequence = 0

    def push(t: float, kind: str, *data: object) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(events, (t, sequence, kind, data))

    for index, life in enumerate(lives):  # the worker's kill_long_job writes its error, whoever came first
        if life.ending is Ending.KILL_LONG and life.removed_at is not None:
            push(life.removed_at, "kill_long", index)
    counts = {"passes": 0, "pass_finishes": 0, "ticks": 0, "runs": 0, "brake_engaged": 0, "watcher_acts": 0}
    deployment_open = _Open(spans["deployment"]) if contender.killer else None
    cleanup_open = _Open(spans["cleanup"]) if contender.sensor else None
    if contender.killer:
        for at, pod in passes if passes is not None else pass_times(trace, contender.deployment, seed):
            push(at, "pass", pod)
    tick_rng, start_rng, lag_rng = (random.Random(seed * 7_907 + k) for k in range(3))
    if contender.sensor:
        push(trace.begin + tick_rng.uniform(0.0, contender.tick.minimum_seconds), "tick")
    if contender.watcher:
        assert contender.lag is not None
        for span, job in sorted(spans["cleanup"], key=lambda item: item[0].since):
            push(span.since + contender.lag.draw(lag_rng), "watch", job, span)
    busy_until, run_keys = -math.inf, set()
    cost = contender.deployment
    while events:
        t, _, kind, data = heapq.heappop(events)
        if t > trace.horizon:
            break
        if kind == "kill_long":
            outcome.add(data[0], Finalization(t, Actor.KILL_LONG, Reason.EXCEEDED_MAX_DURATION, Cause.TIMEOUT))
        elif kind == "pass":
            assert deployment_open is not None
            counts["passes"] += 1
            read = t + cost.read_seconds + cost.read_seconds_per_started_job * queue.started(t)
            for position, (job, reason) in enumerate(deployment_open.at(read, queue), start=1):
                push(read + position * cost.finish_seconds, "finish", job, reason)
        elif kind == "finish":
            job, reason = data
            counts["pass_finishes"] += 1
            outcome.add(job, Finalization(t, Actor.KILL_STUCK, reason))  # its cache error, even if the job is gone
            if queue.present(job, t):
                queue.delete(job, t)
        elif kind == "tick":
            push(t + contender.tick.draw(tick_rng), "tick")
            if t < busy_until:
                continue
            assert cleanup_open is not None and contender.start is not None
            counts["ticks"] += 1
            if backend is not None:
                key: object = backend.stale_key(t)
            else:
                key = tuple(job for job, _ in cleanup_open.at(t, queue)) or None
            if key is not None and key not in run_keys:
                run_keys.add(key)
                start = t + contender.start.draw(start_rng)
                find = start + FIND_AFTER_START
                times = RunTimes(
                    start, find, find + FINALIZE_AFTER_FIND, find + FINALIZE_AFTER_FIND + DONE_AFTER_FINALIZE
                )
                busy_until = times.done
                counts["runs"] += 1
                if backend is None:
                    push(times.find, "find")
                    continue
                result = backend.run(times)
                counts["brake_engaged"] += result.brake
                for job, done in result.finalized.items():
                    queue.delete(job, times.finalize)
                    finalization = Finalization(
                        times.finalize, Actor.CLEANUP, done.reason, done.cause, done.retry, done.costs_run
                    )
                    outcome.add(job, finalization)
        elif kind == "find":
            assert cleanup_open is not None
            candidates = cleanup_open.at(t, queue)
            started = queue.started(t)
            policy = contender.policy or ZombiePolicy()
            if (
                candidates
                and started >= policy.min_started_for_brake
                and len(candidates) > policy.max_stale_fraction * started
            ):
                counts["brake_engaged"] += 1
                continue
            seen = [(job, reason, _as_seen(trace, lives, job, t)) for job, reason in candidates]
            push(t + FINALIZE_AFTER_FIND, "finalize", seen)
        elif kind == "finalize":
            for job, reason, as_seen in data[0]:
                if queue.present(job, t) and _as_seen(trace, lives, job, t) == as_seen:
                    queue.delete(job, t)
                    outcome.add(job, Finalization(t, Actor.CLEANUP, reason, _cause_told(reason)))
        elif kind == "watch":
            job, span = data
            if span.until > t and queue.present(job, t):
                counts["watcher_acts"] += 1
                queue.delete(job, t)
                outcome.add(job, Finalization(t, Actor.WATCHER, span.reason, _cause_told(span.reason)))
    outcome.counts = counts
    outcome.wall_seconds = time.perf_counter() - started_at
    return outcome


def _as_seen(trace: Trace, lives: Sequence[Lifecycle], index: int, t: float) -> tuple[float | None, bool]:
    """What the compare-and-set compares: the stored last heartbeat and whether the job was SIGTERMed."""
    job, life = trace.jobs[index], lives[index]
    return job.beats.last_before(min(t, life.process_end)), job.sigterm_at is not None and job.sigterm_at <= t


def _cause_told(reason: str) -> str:
    """The cause a finalization of ours tells, coarsely (the witness reads the real one from the audit trail)."""
    told = {Reason.TERMINATED.value: Cause.DEPLOY, Reason.EXCEEDED_MAX_DURATION.value: Cause.TIMEOUT}
    return told.get(reason, Cause.CRASH)
