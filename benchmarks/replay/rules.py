"""When a killer's rule holds for a job: the intervals of the trace's time during which it would call the job stuck.

A rule reads a started job's ``last_heartbeat`` (else ``started_at``), its ``terminated_at`` and its age; between
two beats nothing it reads changes, so the moments it holds are a few intervals per job, computed once from the
trace's truth. The replay's contenders (:mod:`.contenders`) then ask "is it stuck at ``t``?" of a handful of jobs.

* The deployment's ``get_stuck_jobs`` (:meth:`Rule.deployment`): ``terminated_at`` older than 5 x 60 s, else the
  last heartbeat (or the start) older than 5 x 60 s; no maximum duration (``kill_long_job`` is the executor's own).
* The cleanup's policy (:meth:`Rule.of_policy`), as ``detection.stale_stages`` builds its query: before a SIGTERM,
  the heartbeat timeout or the type's T2; after it, the timeout since the signal or the SIGTERM rule (the grace
  passed and the heartbeats silent for ``termination_silence_seconds``). The replay's witness checks these against
  the real cleanup on a database (``database.py``): the same finalizations, to the second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from benchmarks.replay.trace import Job, Lifecycle
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.reasons import Reason

#: The reasons a job is stuck for, most telling first (a dead job past its T2 is dead: ``detection``'s order).
PRIORITY = (Reason.TERMINATED, Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.EXCEEDED_MAX_DURATION)


@dataclass(frozen=True)
class Interval:
    since: float
    until: float  # exclusive; inf: until the job is deleted
    reason: str


@dataclass(frozen=True)
class Rule:
    """A killer's stuck rule: its heartbeat timeout, its SIGTERM rule and its maximum durations."""

    timeout: float
    grace: float | None = None  # the SIGTERM rule's grace (None: only the timeout since the signal)
    silence: float = 120.0
    max_duration: float | None = None  # T2 for every type (None: no T2 rule)
    max_duration_by_type: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def deployment(cls, timeout: float = 300.0) -> Rule:
        return cls(timeout)

    @classmethod
    def of_policy(cls, policy: ZombiePolicy) -> Rule:
        grace = None if policy.termination_grace_seconds is None else float(policy.termination_grace_seconds)
        return cls(
            float(policy.heartbeat_timeout_seconds),
            grace,
            float(policy.termination_silence_seconds()),
            float(policy.max_duration_seconds),
            {name: float(value) for name, value in policy.max_duration_seconds_by_type.items()},
        )

    def t2_of(self, job_type: str) -> float | None:
        return self.max_duration_by_type.get(job_type, self.max_duration)


def intervals(job: Job, life: Lifecycle, rule: Rule) -> list[Interval]:
    """Every interval in which ``rule`` calls the job stuck (as long as it is still started)."""
    end = life.process_end
    sigterm = job.sigterm_at
    if sigterm is not None and life.removed_at is not None and life.removed_at <= sigterm:
        sigterm = None
    removed = life.removed_at if life.removed_at is not None else math.inf  # its worker deletes it then
    before = min(sigterm if sigterm is not None else math.inf, removed)
    out: list[Interval] = []
    first = job.beats.first
    silences = job.beats.silences(end) if first is not None and first <= end else []
    if first is None or first > end:
        silences = [(job.start, math.inf)]
    elif first - job.start > rule.timeout:
        silences.insert(0, (job.start, first))
    for since, following in silences:
        reason = Reason.NEVER_HEARTBEATED if since == job.start else Reason.MISSING_HEARTBEAT
        low, high = since + rule.timeout, min(following, before)
        if low < high:
            out.append(Interval(low, high, reason))
    t2 = rule.t2_of(job.job_type)
    if t2 is not None and job.start + t2 < before:
        out.append(Interval(job.start + t2, before, Reason.EXCEEDED_MAX_DURATION))
    if sigterm is not None:
        since = sigterm + rule.timeout
        if rule.grace is not None:
            last = job.beats.last_before(end) if first is not None and first <= end else None
            since = min(since, max(sigterm + rule.grace, (last if last is not None else job.start) + rule.silence))
        if since < removed:
            out.append(Interval(since, removed, Reason.TERMINATED))
    return out


def reason_at(spans: list[Interval], t: float) -> str | None:
    """Why the rule calls the job stuck at ``t`` (None: it does not)."""
    found = [span.reason for span in spans if span.since <= t < span.until]
    return min(found, key=PRIORITY.index) if found else None
