"""The ``detection`` section of ``python -m benchmarks.run``: the replay of issue 35 over many seeds.

1. **The statistics' T2s** for (d): ``statistics.analysis.analyze`` on a two-day trace of its own (the days before).
2. **The witness**: one seed of the chart's fleet against the real cleanup (``run_cleanup``, on a fresh embedded
   server or a URL's databases), beside the rules model of the same contender: the same finalizations, else the
   model is wrong (:mod:`.database`). Its finalize steps' wall times are the watcher's finalize cost when its lag is
   not measured. It takes most of the section's time and does not depend on the watcher's lag, so ``witness_from``
   reuses the one a previous run recorded in its results file, labelled as that run's (:func:`recorded_witness`).
3. **The seeds** (``seeds``, 20 by default), in ``parallel`` processes: each seed's trace of the chart's fleet
   against every contender (:func:`contenders`), and a few seeds of a cluster incident (:data:`.fleet.INCIDENT_POOLS`)
   as a separate case.
4. **The figures** over the seeds with their bootstrap intervals (:mod:`.stats`), and the targets (:mod:`.targets`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.harness import exit_on_sigterm
from benchmarks.replay.contenders import Contender, replay, rule_spans
from benchmarks.replay.database import DatabaseCleanup, compare
from benchmarks.replay.deployment import SET_STUCK_COMMANDS, DeploymentSettings
from benchmarks.replay.figures import SeedRecord, seed_record, suggested_t2s
from benchmarks.replay.fleet import INCIDENT_POOLS
from benchmarks.replay.generate import TraceSettings, generate
from benchmarks.replay.latency import ReleaseLag, StartLatency, measured_file, release_lag, start_latencies
from benchmarks.replay.rules import Rule
from benchmarks.replay.stats import Resamples, summary
from benchmarks.replay.targets import targets
from benchmarks.replay.trace import MaxDuration, constant, lifecycle
from zombie_pipeline.policy import ZombiePolicy


@dataclass
class ReplaySettings:
    """What the section replays; the lead's knobs are the command line's (``benchmarks/run.py``)."""

    seeds: int = 20
    incident_seeds: int = 5
    trace: TraceSettings = field(default_factory=TraceSettings)
    deployment: DeploymentSettings = field(default_factory=DeploymentSettings)
    heartbeat_timeout_seconds: int = 300
    #: The cleanup's T2 for every type: above the deployment's 2400 s by the longest wait for its kill_long_job check,
    #: rounded up to the minute, so that a live long job is left to its own executor.
    max_duration_seconds: int = 2520
    watcher_what_if_timeout_seconds: int = 240
    witness: bool = True
    #: A results file (docs/benchmarks-results.json) whose witness is reused instead of running the real cleanup again.
    witness_from: Path | None = None
    witness_latency: str = "local-loaded"
    parallel: int = 2
    draws: int = 400

    @classmethod
    def quick(cls) -> ReplaySettings:
        return cls(seeds=3, incident_seeds=1, draws=100)

    def policy(self, **changes: Any) -> ZombiePolicy:
        return ZombiePolicy(
            heartbeat_timeout_seconds=self.heartbeat_timeout_seconds, max_duration_seconds=self.max_duration_seconds
        ).model_copy(update=changes)


def contenders(
    settings: ReplaySettings,
    latencies: list[StartLatency],
    lag: ReleaseLag,
    t2_by_type: dict[str, int],
    kill_long_what_if: float,
    incident: bool = False,
) -> list[Contender]:
    """Every contender a seed is replayed against (the incident's: fewer)."""
    policy = settings.policy()
    chart = constant(settings.deployment.max_job_duration_seconds)
    killer = Contender("a", "(a) the deployment's kill_stuck_jobs", killer=True, deployment=settings.deployment)
    out = [killer]
    for latency in latencies if not incident else [lat for lat in latencies if lat.name == settings.witness_latency]:
        out.append(Contender(f"c@{latency.name}", f"(c) stale_jobs_sensor, runs: {latency.label}", sensor=True,
                             policy=policy, start=latency))  # fmt: skip
        out.append(replace(out[-1], name=f"a+c@{latency.name}", label=f"(a) + {out[-1].label}", killer=True,
                           deployment=settings.deployment))  # fmt: skip
    lag_told = "its release lag measured" if lag.samples else "its release lag modelled"
    watcher = Contender("w", f"(w) the watcher (issue 34, {lag_told})", watcher=True, policy=policy, lag=lag)
    out += [watcher, replace(watcher, name="a+w", label="(a) + (w)", killer=True, deployment=settings.deployment)]
    if incident:
        return out
    shorter = settings.policy(heartbeat_timeout_seconds=settings.watcher_what_if_timeout_seconds)
    out.append(replace(out[-1], name="a+w@timeout", label=f"(a) + (w) at a {shorter.heartbeat_timeout_seconds} s "
                       "heartbeat timeout (what-if)", policy=shorter))  # fmt: skip
    loaded = next(lat for lat in latencies if lat.name == settings.witness_latency)
    d_policy = policy.with_max_durations(t2_by_type)
    d = Contender("d", f"(d) (c) with the suggested T2s, runs: {loaded.label}", sensor=True, policy=d_policy, start=loaded,
                  kill_long=chart)  # fmt: skip
    out += [d, replace(d, name="d@kill_long", label=f"(d) with kill_long_job at {kill_long_what_if:.0f} s (what-if)",
                       kill_long=constant(kill_long_what_if))]  # fmt: skip
    return out


def replay_seed(trace_settings: TraceSettings, cast: list[Contender], seed: int) -> dict[str, SeedRecord]:
    """One seed's trace against every contender (in a process of its own)."""
    with exit_on_sigterm():
        trace = generate(replace(trace_settings, seed=seed))
        lives: dict[MaxDuration, list[Any]] = {}
        spans: dict[tuple[MaxDuration, str], list[Any]] = {}
        records = {}
        for contender in cast:
            kill_long = contender.kill_long
            if kill_long not in lives:
                lives[kill_long] = [lifecycle(job, kill_long) for job in trace.jobs]
            rules = {"deployment": Rule.deployment(contender.deployment.timeout_seconds)}
            if contender.policy is not None:
                rules["cleanup"] = Rule.of_policy(contender.policy)
            for rule in rules.values():
                if (kill_long, repr(rule)) not in spans:
                    spans[(kill_long, repr(rule))] = rule_spans(trace, lives[kill_long], rule)
            by_name = {name: spans[(kill_long, repr(rule))] for name, rule in rules.items()}
            outcome = replay(trace, contender, lives[kill_long], by_name, seed)
            records[contender.name] = seed_record(trace, outcome, seed)
        return records


def witness(
    settings: ReplaySettings, contender: Contender, url: str | None, log: Callable[[str], None]
) -> dict[str, Any]:
    """The real cleanup on the first seed, beside the rules model of the same contender."""
    trace = generate(replace(settings.trace, seed=1))
    kill_long = contender.kill_long
    lives = [lifecycle(job, kill_long) for job in trace.jobs]
    assert contender.policy is not None
    spans = {"deployment": [], "cleanup": rule_spans(trace, lives, Rule.of_policy(contender.policy))}
    model = replay(trace, contender, lives, spans, 1)
    with contextlib.ExitStack() as stack:
        if url is None:
            from zombie_pipeline.queue.embedded import start_server, stop_process

            base = Path(tempfile.mkdtemp(prefix="zp-replay-witness-"))
            stack.callback(shutil.rmtree, base, True)
            process, info = start_server(base / "data", log_path=base / "server.log", detach=False)
            stack.callback(stop_process, process, 60)
            url = info.url
        backend = DatabaseCleanup(trace, lives, contender.policy, url, "witness")
        stack.callback(backend.close)
        started = time.perf_counter()
        real = replay(trace, contender, lives, spans, 1, backend)
        wall = time.perf_counter() - started
        log(f"  witness: the real cleanup on seed 1 in {wall:.0f} s: {real.counts}")
        return {
            "contender": contender.name,
            "seed": 1,
            "wall_seconds": round(wall, 1),
            "counts": {**real.counts, **backend.counts()},
            "comparison": compare(model, real),
            "finalize_seconds": sorted(round(s, 4) for s in backend.finalize_seconds),
            "causes_told": _causes(real),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }


def recorded_witness(settings: ReplaySettings, path: Path) -> dict[str, Any]:
    """The witness a previous run recorded in ``path``, with that run's date, command and commit, and the files of the
    real cleanup changed since; refused when that run replayed another trace or policy (another witness)."""
    try:
        recorded = json.loads(path.read_text())["replay"]
        seen, meta = recorded["witness"], recorded["meta"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"{path} holds no recorded witness of the detection replay: {error!r}") from None
    if not seen:
        raise SystemExit(f"{path}: the run of {meta.get('started_at', '?')} recorded no witness")
    now = json.loads(json.dumps(_described(settings), default=str))  # as the results file holds them
    keys = ("trace", "heartbeat_timeout_seconds", "max_duration_seconds", "witness_latency")
    differ = [key for key in keys if recorded["settings"].get(key) != now[key]]
    if differ:
        raise SystemExit(f"{path}: its witness replayed other settings ({', '.join(differ)}): run the witness again")
    origin = seen.get("recorded_by") or {"started_at": meta["started_at"], "command": meta["command"],
                                         "commit": meta["code"]["commit"]}  # fmt: skip
    commit = origin["commit"]  # the run that ran it, when the one read had itself reused it
    diff = subprocess.run(
        ["git", "diff", "--name-only", commit, "--", "zombie_pipeline/cleanup", "zombie_pipeline/queue"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, check=False,
    )  # fmt: skip
    changed = diff.stdout.split() if diff.returncode == 0 else None  # None: the commit is not in this clone
    recorded_by = {**origin, "path": str(path), "cleanup_files_changed_since": changed}
    return {**seen, "recorded_by": recorded_by}


def _causes(outcome: Any) -> dict[str, dict[str, int]]:
    """The real cleanup's finalizations by the cause it told and what became of their retry."""
    out: dict[str, dict[str, int]] = {}
    for finals in outcome.finalizations.values():
        for final in finals:
            if final.actor.value == "cleanup":
                row = out.setdefault(str(final.cause), {})
                row[str(final.retry)] = row.get(str(final.retry), 0) + 1
                row["costs_run"] = row.get("costs_run", 0) + final.costs_run
    return out


def replay_section(
    settings: ReplaySettings, url: str | None, out_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The section's results: every contender over the seeds, the incident's, the witness, the targets."""
    started = time.perf_counter()
    document = measured_file()
    latencies = start_latencies(document)
    policy = settings.policy()
    history = generate(replace(settings.trace, seed=1_000, days=2.0, warmup_hours=0.0, tail_hours=0.0))
    report, t2_by_type, largest = suggested_t2s(history, policy.model_copy(update={"max_duration_seconds": 2400}))
    log(f"detection replay: (d)'s T2s {t2_by_type}; kill_long_job what-if {largest} s")
    loaded = next(lat for lat in latencies if lat.name == settings.witness_latency)
    placeholder = release_lag(())
    cast = contenders(settings, latencies, placeholder, t2_by_type, float(largest))
    seen: dict[str, Any] = {}
    if settings.witness_from is not None:
        seen = recorded_witness(settings, settings.witness_from)
        log(f"  witness: recorded by the run of {seen['recorded_by']['started_at']} ({seen['recorded_by']['commit']})")
    elif settings.witness:
        sensor = next(c for c in cast if c.name == f"c@{loaded.name}")
        seen = witness(settings, sensor, url, log)
    lag = release_lag(tuple(seen.get("finalize_seconds", ())))
    cast = contenders(settings, latencies, lag, t2_by_type, float(largest))
    incident_cast = contenders(settings, latencies, lag, t2_by_type, float(largest), incident=True)
    incident_trace = replace(
        settings.trace, pools=INCIDENT_POOLS, label="a cluster incident: 4 pods (1 heavy, 2 medium, 1 light)"
    )
    jobs = [(settings.trace, cast, seed) for seed in range(1, settings.seeds + 1)]
    jobs += [(incident_trace, incident_cast, 100 + seed) for seed in range(1, settings.incident_seeds + 1)]
    chart: dict[str, list[SeedRecord]] = {}
    incident: dict[str, list[SeedRecord]] = {}
    with ProcessPoolExecutor(max_workers=max(1, settings.parallel)) as pool:
        futures = [(trace, seed, pool.submit(replay_seed, trace, cast_, seed)) for trace, cast_, seed in jobs]
        for trace, seed, future in futures:
            target = incident if trace.pools is INCIDENT_POOLS else chart
            for name, record in future.result().items():
                target.setdefault(name, []).append(record)
            log(
                f"  seed {seed} ({'incident' if target is incident else 'chart'}) done, {time.perf_counter() - started:.0f} s"
            )
    summaries = _summaries(chart, settings.draws)
    incident_summaries = _summaries(incident, settings.draws)
    found = targets(chart, _resamples(chart, settings.draws), summaries)
    return {
        "settings": _described(settings),
        "trace": {
            "label": settings.trace.label,
            "days": settings.trace.days,
            "warmup_hours": settings.trace.warmup_hours,
        },
        "seeds": settings.seeds,
        "incident_seeds": settings.incident_seeds,
        "labels": {c.name: c.label for c in cast},
        "incident_labels": {c.name: c.label for c in incident_cast},
        "contenders": summaries,
        "incident": incident_summaries,
        "targets": found,
        "witness": seen,
        "start_latencies": [latency.described() for latency in latencies],
        "release_lag": {"source": lag.source, "samples": len(lag.samples) or len(lag.finalize_seconds)},
        "start_latency_file": {
            key: document[key]
            for key in (
                "started_at",
                "finished_at",
                "load_average_before",
                "hogs",
                "dequeue_interval_seconds",
                "command",
            )
        }
        if document
        else None,  # fmt: skip
        "suggestions": {
            "t2_by_type": t2_by_type,
            "kill_long_job_what_if_seconds": largest,
            "by_type": [
                {k: r[k] for k in ("type", "current_t2_seconds", "suggested_t2_seconds", "flags")}
                for r in report.records()
            ],
        },  # fmt: skip
        "deployment": {**asdict(settings.deployment), "set_stuck_commands": SET_STUCK_COMMANDS},
        "total_seconds": round(time.perf_counter() - started, 1),
        "cpu_count": os.cpu_count(),
    }


def _resamples(records: dict[str, list[SeedRecord]], draws: int) -> dict[str, Resamples]:
    """One set of draws per group of contenders with the same deaths (the same kill_long_job): shared, so pairs are
    compared on the same resampled deaths."""
    groups: dict[tuple[int, ...], Resamples] = {}
    out = {}
    for name, seeds in records.items():
        key = tuple(len(r.detection) for r in seeds)
        if key not in groups:
            groups[key] = Resamples(seeds, draws)
        out[name] = groups[key]
    return out


def _summaries(records: dict[str, list[SeedRecord]], draws: int) -> dict[str, Any]:
    resamples = _resamples(records, draws)
    return {name: summary(seeds, resamples[name]) for name, seeds in records.items()}


def _described(settings: ReplaySettings) -> dict[str, Any]:
    described = asdict(settings)
    described["trace"]["job_types"] = [t["name"] for t in described["trace"]["job_types"]]
    described["trace"]["pools"] = [p["name"] for p in described["trace"]["pools"]]
    return described
