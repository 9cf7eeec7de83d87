"""Contender (a): dataset-viewer's own killer, read from its executor and its library at f62009e05.

Every pod's executor (``services/worker/src/worker/executor.py``) runs, from its start, ``every(kill_stuck_jobs,
seconds=(0.5, 1.5) x killZombiesIntervalSeconds)``: the pass at once, then a sleep of 300-900 s after each pass.
A pass loads every started job (``Queue.get_stuck_jobs``: a scan through mongoengine) and, for each stuck one, in
turn, ``JobManager.set_stuck``: ``save_job_result`` (the cache entry's upsert, whatever became of the job), then
``finish_job``: the job read again (``is_job_started``), ``Queue.finish_job`` (the job read, the job-type and
worker-size metrics decreased, the ``pastJobs`` record and the dataset's blockage check, the deletion, the lock
released) and the ``AfterJobPlan`` (the dataset's config infos, its pending jobs as a DataFrame, the names of its
configs or splits, the next steps' jobs created, their metrics increased). Nothing stops two passes from judging
the same job: a pass that read it before another's finish deleted it writes its cache error again.

The cost of a pass (:class:`DeploymentSettings`) is built from those writes, as counted in the code: about 16
commands per ``set_stuck`` (2 of them inserts of one or more documents) and about 1 ms of mongoengine per started
job read. Each command is priced at 2.5 ms: this repository's cleanup benchmark measured 0.4-0.5 ms per inserted
document and 1.9-2.9 ms per updated one on the embedded server, and a MongoDB replica set acknowledging a majority
write from another node takes about as long; the plan's Python (a pandas DataFrame, the processing graph) 40 ms on a
full core. About 0.08 s per finish: a model, not a measure (the deployment's worker service cannot be installed
here: its ``libcommon.orchestrator`` needs the worker's whole stack); ``--deployment-finish`` sets another value.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.replay.trace import Trace

#: Commands of one set_stuck, as read in the code at f62009e05 (see the module's docstring).
SET_STUCK_COMMANDS = {
    "save_job_result: the cache entry's upsert": 1,
    "finish_job: is_job_started": 1,
    "Queue.finish_job: the job read": 1,
    "decrease_metric: jobTotalMetric, workerTypeJobCounts": 2,
    "create_past_job: pastJobs insert, the dataset's durations, its blockage": 3,
    "the job's deletion": 1,
    "release_lock": 1,
    "AfterJobPlan: config infos, pending jobs, names": 3,
    "AfterJobPlan: next jobs created, their metrics": 3,
}
COMMAND_SECONDS = 0.0025
PLAN_CPU_SECONDS = 0.04


@dataclass(frozen=True)
class DeploymentSettings:
    """The chart's values (``chart/values.yaml``) and the modelled cost of a pass."""

    heartbeat_interval_seconds: float = 60.0
    max_missing_heartbeats: int = 5
    kill_zombies_interval_seconds: float = 600.0
    max_job_duration_seconds: float = 2400.0
    read_seconds: float = 0.05  # the query and its cursor
    read_seconds_per_started_job: float = 0.001  # a mongoengine document built per started job
    finish_seconds: float = sum(SET_STUCK_COMMANDS.values()) * COMMAND_SECONDS + PLAN_CPU_SECONDS

    @property
    def timeout_seconds(self) -> float:
        return self.max_missing_heartbeats * self.heartbeat_interval_seconds


def pass_times(trace: Trace, settings: DeploymentSettings, seed: int = 0) -> list[tuple[float, int]]:
    """Every kill_stuck_jobs pass of every pod: at its start, then every 0.5-1.5 x the interval, until its end (a
    SIGTERMed pod keeps passing through its grace period: its event loop runs until it is killed)."""
    passes = []
    interval = settings.kill_zombies_interval_seconds
    for pod in trace.pods:
        rng = random.Random(seed * 7_919 + pod.index)
        t = pod.start
        while t < pod.end:
            passes.append((t, pod.index))
            t += rng.uniform(0.5 * interval, 1.5 * interval)
    passes.sort()
    return passes
