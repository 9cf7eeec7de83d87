"""Contender (a): dataset-viewer's own killer, modelled from its executor (HEAD f62009e05).

Every pod's executor (``services/worker/src/worker/executor.py``) runs, from its start:

* ``kill_stuck_jobs`` at once, then every 0.5-1.5 x ``killZombiesIntervalSeconds``
  (600 s): the pass loads every started job (``Queue.get_stuck_jobs``) and finishes,
  one after the other, each job whose ``terminated_at`` is older than
  ``maxMissingHeartbeats`` x ``heartbeatIntervalSeconds`` (5 x 60 s), or, without
  ``terminated_at``, whose ``last_heartbeat`` (else ``started_at``) is: a
  ``JobManagerCrashedError`` each (``JobManager.set_stuck``: its cache entry, then
  ``finish_job``, which deletes the job);
* ``kill_long_job`` every 0.5-1.5 x 60 s on its own job: past
  ``maxJobDurationSeconds`` (2400 s) it stops the worker loop and writes
  ``JobManagerExceededMaximumDurationError`` (in the trace: ``Checks``, and
  :func:`~benchmarks.replay_trace.lifecycle`).

Nothing stops two passes from judging the same job: a pass that read the job
before another pass's finish deleted it finishes it again (a second cache write,
``failed_runs`` counted twice). A pass takes time: its read, then each finish in
turn. Those durations are not measured anywhere public; they are parameters
(:class:`DeploymentSettings`), and they decide how often two passes meet.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import asdict, dataclass

from benchmarks.replay_trace import (
    Actor,
    Ending,
    Finalization,
    Outcome,
    Trace,
    constant,
    lifecycle,
)
from zombie_pipeline.queue.documents import Cause, Reason


@dataclass(frozen=True)
class DeploymentSettings:
    """The chart's values (``chart/values.yaml``) and the assumed cost of a pass."""

    heartbeat_interval_seconds: float = 60.0
    max_missing_heartbeats: int = 5
    kill_zombies_interval_seconds: float = 600.0
    max_job_duration_seconds: float = 2400.0
    #: A pass first reads every started job (a Python scan through mongoengine), then finishes the stuck ones in turn,
    #: each a dozen round trips (cache read and upsert, metrics, pastJobs, the job's deletion, its lock): assumed.
    read_seconds: float = 0.05
    read_seconds_per_started_job: float = 0.0005
    finish_seconds: float = 0.05
    seed: int = 29

    @property
    def timeout_seconds(self) -> float:
        return self.max_missing_heartbeats * self.heartbeat_interval_seconds


def pass_times(trace: Trace, settings: DeploymentSettings) -> list[tuple[float, int]]:
    """Every kill_stuck_jobs pass of every pod: at its start, then every 0.5-1.5 x the interval, until it ends."""
    passes = []
    interval = settings.kill_zombies_interval_seconds
    for pod in trace.pods:
        rng = random.Random(settings.seed * 7_919 + pod.index)
        t = pod.start
        while t < pod.end:
            passes.append((t, pod.index))
            t += rng.uniform(0.5 * interval, 1.5 * interval)
    passes.sort()
    return passes


def replay_deployment(
    trace: Trace, settings: DeploymentSettings = DeploymentSettings(), passes: list[tuple[float, int]] | None = None
) -> Outcome:
    """What the deployment's passes and executors finalize, and when (``passes``: explicit, for hand-made cases)."""
    started = time.perf_counter()
    max_duration = constant(settings.max_job_duration_seconds)
    outcome = Outcome("a", max_duration, settings=asdict(settings))
    jobs = trace.jobs
    lives = [lifecycle(job, max_duration) for job in jobs]
    for job, life in zip(jobs, lives, strict=True):
        if life.removed_at is not None and life.ending is Ending.KILL_LONG:
            finalization = Finalization(life.removed_at, Actor.KILL_LONG, Reason.EXCEEDED_MAX_DURATION, Cause.TIMEOUT)
            outcome.add(job.index, finalization)
    removals = [
        (life.removed_at, job.index) for job, life in zip(jobs, lives, strict=True) if life.removed_at is not None
    ]
    heapq.heapify(removals)
    present: dict[int, None] = {}  # started jobs whose document is still there, in insertion order
    gone: set[int] = set()
    finishing: dict[int, float] = {}  # job -> when the first pass that judged it deletes it
    next_start = 0
    timeout = settings.timeout_seconds
    judged = doubled = 0
    passes = passes if passes is not None else pass_times(trace, settings)
    for at, _pod in passes:
        read = at + settings.read_seconds + settings.read_seconds_per_started_job * len(present)
        while next_start < len(jobs) and jobs[next_start].start <= read:
            if next_start not in gone:
                present[next_start] = None
            next_start += 1
        while removals and removals[0][0] <= read:
            _, index = heapq.heappop(removals)
            present.pop(index, None)
            gone.add(index)
        stuck: list[tuple[int, str]] = []
        for index in present:
            job, life = jobs[index], lives[index]
            if job.sigterm_at is not None and job.sigterm_at <= read:
                if read - job.sigterm_at > timeout:
                    stuck.append((index, Reason.TERMINATED))
                continue
            beat = job.beats.last_before(min(read, life.process_end))
            if read - (beat if beat is not None else job.start) > timeout:
                stuck.append((index, Reason.MISSING_HEARTBEAT if beat is not None else Reason.NEVER_HEARTBEATED))
        for position, (index, reason) in enumerate(stuck, start=1):
            written = read + position * settings.finish_seconds
            outcome.add(index, Finalization(written, Actor.KILL_STUCK, reason))
            judged += 1
            if index in finishing:  # another pass read it before its finish: judged by two passes at once
                doubled += 1
                continue
            finishing[index] = written
            heapq.heappush(removals, (written, index))
    outcome.counts = {
        "kill_stuck_jobs_passes": len(passes),
        "kill_stuck_jobs_finishes": judged,
        "judged_by_two_passes_at_once": doubled,
        "pods": len(trace.pods),
    }
    outcome.wall_seconds = time.perf_counter() - started
    outcome.cpu_seconds = {"client": round(outcome.wall_seconds, 1)}  # pure Python in this process
    return outcome
