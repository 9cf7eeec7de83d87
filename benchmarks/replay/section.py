"""The ``detection`` section of ``python -m benchmarks.run``: issue 29's replay with ground truth.

One trace (:mod:`benchmarks.replay_trace`, seeded) is replayed unchanged against four contenders:

* **(a)** the deployment's own killer, a model of its executor (:mod:`benchmarks.replay_deployment`);
* **(b)** this pipeline's cleanup on ``kill_zombies_schedule`` (every 10 minutes);
* **(c)** (b) with ``stale_jobs_sensor``;
* **(d)** (c) with the T2s the statistics suggest from the trace's first days: per type for the cleanup, their
  largest for the deployment's ``kill_long_job`` (one global value), both in force from the end of that window.

(b)-(d) drive the real cleanup (:mod:`benchmarks.replay_cleanup`), each against a database of its own: a fresh
embedded server started here (stopped by its PID), or, with a URL, databases of their own on it. They run in
parallel processes (``parallel``). The figures (:mod:`benchmarks.replay_figures`) are computed from each
contender's finalizations and the trace's ground truth.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.harness import exit_on_sigterm
from benchmarks.replay_cleanup import PipelineSettings, RunStart, replay_pipeline
from benchmarks.replay_deployment import DeploymentSettings, replay_deployment
from benchmarks.replay_figures import (
    causes_table,
    chart,
    death_detections,
    detection_table,
    figures,
    fleet_table,
    mistakes_table,
    suggested_t2s,
    targets,
    targets_table,
)
from benchmarks.replay_trace import DAY, Cause, Outcome, Trace, TraceSettings, constant, generate, lifecycle
from benchmarks.servers import Running
from zombie_pipeline.orchestration.sensors import STALE_JOBS_TICK_SECONDS
from zombie_pipeline.policy import ZombiePolicy

CONTENDERS = ("a", "b", "c", "d")
LABELS = {
    "a": "(a) deployment's killer",
    "b": "(b) cleanup every 10 min",
    "c": "(c) (b) + stale_jobs_sensor",
    "d": "(d) (c) + suggested T2s",
}
CHART = "benchmarks-replay.png"


@dataclass
class ReplaySettings:
    """The trace, the deployment's chart values, and the settings the lead can change for (b)-(d)."""

    trace: TraceSettings = field(default_factory=TraceSettings)
    deployment: DeploymentSettings = field(default_factory=DeploymentSettings)
    heartbeat_timeout_seconds: int = 300
    #: The cleanup's T2 in (b), (c), and in (d) before the suggestions; None: above the deployment's own, by the
    #: longest wait for its kill_long_job check (``cleanup_max_duration_seconds``).
    max_duration_seconds: int | None = None
    schedule_seconds: float = 600.0
    sensor_tick_seconds: float = STALE_JOBS_TICK_SECONDS
    run_start: RunStart = field(default_factory=RunStart)
    statistics_days: float = 2.0  # (d): the window the suggestions are computed from; in force after it
    t2_by_type: dict[str, int] = field(default_factory=dict)  # (d): these instead of the suggestions
    kill_long_job_seconds: float | None = None  # (d): this instead of the largest suggestion
    policy_overrides: dict[str, Any] = field(default_factory=dict)  # any other ZombiePolicy field, for (b)-(d)
    exact_heartbeats_within_seconds: float | None = None
    contenders: tuple[str, ...] = CONTENDERS
    parallel: int = 3  # (b), (c), (d) at once: each is a client and its server taking turns

    @classmethod
    def quick(cls) -> ReplaySettings:
        """Two days, a quarter of the jobs: a few minutes."""
        return cls(trace=TraceSettings(days=2.0, jobs=4_600, deploy_waves=3), statistics_days=1.0)

    def cleanup_max_duration_seconds(self) -> int:
        """A T2 that leaves a live long job to its own executor: the deployment's maximum duration plus the longest
        wait for its next kill_long_job check, rounded up to the minute (2400 + 90 s: 2520 s with the chart's values).
        At the deployment's own value the cleanup would finalize such a job first, and its executor again."""
        if self.max_duration_seconds is not None:
            return self.max_duration_seconds
        longest_check = self.trace.kill_long_check_seconds[1]
        return math.ceil((self.deployment.max_job_duration_seconds + longest_check) / 60) * 60

    def pipeline(
        self, name: str, per_type: dict[str, int] | None = None, kill_long: float | None = None
    ) -> PipelineSettings:
        base = PipelineSettings(
            name=name,
            label=LABELS[name],
            heartbeat_timeout_seconds=self.heartbeat_timeout_seconds,
            max_duration_seconds=self.cleanup_max_duration_seconds(),
            kill_long_job_seconds=self.deployment.max_job_duration_seconds,
            schedule_seconds=self.schedule_seconds,
            sensor_tick_seconds=None if name == "b" else self.sensor_tick_seconds,
            run_start=self.run_start,
            policy_overrides=tuple(sorted(self.policy_overrides.items())),
            exact_heartbeats_within_seconds=self.exact_heartbeats_within_seconds,
            seed=self.trace.seed,
        )
        if name != "d":
            return base
        return replace(
            base,
            max_duration_seconds_by_type=tuple(sorted((per_type or {}).items())),
            t2_from_seconds=self.statistics_days * DAY,
            kill_long_job_seconds_later=kill_long,
        )


def _one_contender(trace_settings: TraceSettings, pipeline: PipelineSettings, url: str | None) -> Outcome:
    """A contender built on the cleanup, in a process of its own: its trace (the same: seeded), its database."""
    with exit_on_sigterm(), contextlib.ExitStack() as stack:
        trace = generate(trace_settings)
        server: Running | None = None
        if url is None:
            from zombie_pipeline.simulation.embedded import start_server, stop_process

            base = Path(tempfile.mkdtemp(prefix=f"zp-replay-{pipeline.name}-"))
            stack.callback(shutil.rmtree, base, True)
            process, info = start_server(base / "data", log_path=base / "server.log", detach=False)
            stack.callback(stop_process, process, 60)
            url = info.url
            server = Running(url=url, direct_url=url, rtt_ms=0.0, pid=process.pid)

        def log(line: str) -> None:
            print(line, flush=True)

        cpu = time.process_time()
        outcome = replay_pipeline(
            trace, pipeline, url, f"replay_{pipeline.name}_queue", f"replay_{pipeline.name}_cache", log=log
        )
        outcome.cpu_seconds = {"client": round(time.process_time() - cpu, 1)}
        server_cpu = server.cpu_seconds() if server is not None else None
        if server_cpu is not None:
            outcome.cpu_seconds["server"] = round(server_cpu, 1)
        return outcome


def replay_section(
    settings: ReplaySettings, url: str | None, out_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Generate the trace, replay it against every contender, and return the section's results (chart written)."""
    started = time.perf_counter()
    trace = generate(settings.trace)
    log(
        f"detection replay: {len(trace.jobs):,} jobs over {settings.trace.days:g} days (+{settings.trace.tail_hours:g} h), "
        f"{len(trace.pods):,} pods, {len(trace.waves)} deploy waves; generated in {time.perf_counter() - started:.1f} s"
    )
    policy = ZombiePolicy(  # the T2 the first days ran under: the deployment's, its runs stopped there
        heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
        max_duration_seconds=int(settings.deployment.max_job_duration_seconds),
    )
    report, per_type, largest = suggested_t2s(trace, settings.statistics_days, policy)
    per_type = {**per_type, **settings.t2_by_type}
    kill_long = settings.kill_long_job_seconds or float(largest)
    log(f"  (d): T2 per type {per_type}; kill_long_job {kill_long:.0f} s, from day {settings.statistics_days:g}")
    outcomes: dict[str, Outcome] = {}
    pipelines = [settings.pipeline(name, per_type, kill_long) for name in settings.contenders if name != "a"]
    with ProcessPoolExecutor(max_workers=max(1, min(settings.parallel, len(pipelines) or 1))) as pool:
        futures = {p.name: pool.submit(_one_contender, settings.trace, p, url) for p in pipelines}
        if "a" in settings.contenders:
            outcomes["a"] = replay_deployment(trace, settings.deployment)
            log(f"  (a) done in {outcomes['a'].wall_seconds:.1f} s: {outcomes['a'].counts}")
        for name, future in futures.items():
            outcomes[name] = future.result()
            log(f"  ({name}) done in {outcomes[name].wall_seconds:.0f} s: {outcomes[name].counts}")
    rows = [figures(trace, outcomes[name]) for name in settings.contenders]
    found = targets(rows)
    try:
        chart(
            rows,
            {name: death_detections(trace, outcomes[name]) for name in settings.contenders},
            LABELS,
            out_dir / CHART,
        )
    except Exception as error:  # a chart must never lose the figures
        log(f"chart not written: {error!r}")
    return {
        "settings": _described(settings),
        "trace": trace_summary(trace),
        "suggestions": {
            "window_days": settings.statistics_days,
            "t2_by_type": per_type,
            "kill_long_job_seconds": kill_long,
            "by_type": [
                {key: record[key] for key in ("type", "current_t2_seconds", "suggested_t2_seconds", "change", "flags")}
                for record in report.records()
            ],
        },
        "contenders": rows,
        "labels": {name: LABELS[name] for name in settings.contenders},
        "targets": found,
        "total_seconds": round(time.perf_counter() - started, 1),
        "cpu_count": os.cpu_count(),
        "chart": CHART,
    }


def trace_summary(trace: Trace) -> dict[str, Any]:
    """What the trace holds: jobs by fate and by type, zombies by cause (under the chart's 2400 s), the fleet."""
    by_fate: dict[str, int] = {}
    by_type: dict[str, int] = {}
    causes: dict[str, int] = {cause.value: 0 for cause in Cause}
    longest_gap = 0.0
    chart_max = constant(trace.settings.chart_max_duration_seconds)
    for job in trace.jobs:
        by_fate[job.fate.value] = by_fate.get(job.fate.value, 0) + 1
        by_type[job.job_type] = by_type.get(job.job_type, 0) + 1
        life = lifecycle(job, chart_max)
        if life.cause is not None:
            causes[life.cause.value] += 1
        longest_gap = max(longest_gap, job.beats.longest_gap(min(life.process_end, trace.settings.end)))
    return {
        "jobs": len(trace.jobs),
        "pods": len(trace.pods),
        "deploy_waves_hours": [round(wave / 3600, 2) for wave in trace.waves],
        "by_fate": by_fate,
        "by_type": by_type,
        "zombies_by_cause_under_2400s": causes,
        "longest_heartbeat_gap_seconds": round(longest_gap, 1),
        "fleet_min": min(trace.fleet_minutes),
        "fleet_max": max(trace.fleet_minutes),
    }


def _described(settings: ReplaySettings) -> dict[str, Any]:
    described = asdict(settings)
    described["trace"]["job_types"] = [asdict(t) for t in settings.trace.job_types]
    return described


def markdown(replay: dict[str, Any], command: str) -> str:
    """The section of docs/benchmarks-results.md: tables, targets, chart, the command that made them."""
    labels = replay["labels"]
    rows = replay["contenders"]
    trace = replay["trace"]
    s = replay["settings"]
    wall = ", ".join(
        f"{labels[row['contender']]} {row['wall_seconds']:.0f} s"
        + (
            f" (CPU {' + '.join(f'{v:.0f} s {k}' for k, v in row['cpu_seconds'].items())})"
            if row["cpu_seconds"]
            else ""
        )
        for row in rows
    )
    suggestions = replay["suggestions"]
    parts = [
        "## 6. Detection: a replay with ground truth (issue 29)",
        "",
        f"Command: `{command}` ({replay['total_seconds']:.0f} s in all on {replay['cpu_count']} cores shared with "
        f"other sessions, load average {replay.get('load_average_1m', '?')} at the end; per contender: {wall}).",
        "",
        f"Trace (seed {s['trace']['seed']}): {trace['jobs']:,} jobs over {s['trace']['days']:g} days "
        f"(+{s['trace']['tail_hours']:g} h without arrivals), {trace['pods']:,} pod incarnations, fleet "
        f"{trace['fleet_min']}-{trace['fleet_max']} workers, deploy waves at hours {trace['deploy_waves_hours']}; "
        f"fates {trace['by_fate']}; longest heartbeat gap of a live job {trace['longest_heartbeat_gap_seconds']:.0f} s.",
        "",
        "Detection time: true death (the process died, was killed after its SIGTERM grace, or a hang's onset) to the "
        "first finalization (the job deleted: its dataset and user slot free). p50/p90/p99 by numpy's linear "
        "interpolation.",
        "",
        detection_table(rows, labels),
        "",
        "Mistakes (per 10,000 started jobs in brackets) and waste:",
        "",
        mistakes_table(rows, labels),
        "",
        "p99 / p50 detection time of deaths (crash, SIGTERM, never started) by the fleet size at the death:",
        "",
        fleet_table(rows, labels),
        "",
        "The same for isolated deaths only (crash, never started: no deploy wave):",
        "",
        fleet_table(rows, labels, "isolated_deaths_by_fleet"),
        "",
        "Finalizations by the cause each killer told (the deployment counts every dead job as a crash), what became "
        "of their retries (the deployment's: its backfill, every 2 h), and the runs spent on deploy deaths (SIGTERMed "
        "jobs whose error counted a failed run):",
        "",
        causes_table(rows, labels),
        "",
        f"![detection replay]({replay['chart']})",
        "",
        "### Targets of issue 29",
        "",
        targets_table(replay["targets"]),
        "",
    ]
    if "d" in labels:
        parts += [
            f"(d)'s T2s, from `statistics.analysis.analyze` over the first {suggestions['window_days']:g} days "
            f"(kill_long_job at the chart's 2400 s then): per type for the cleanup {suggestions['t2_by_type']}; "
            f"for kill_long_job {suggestions['kill_long_job_seconds']:.0f} s (the largest: one value for every type).",
            "",
        ]
    return "\n".join(parts)
