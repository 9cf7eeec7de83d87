"""Measure 1: the cleanup (``kill_zombies_job``'s core) against the 2023 baseline, on the same data.

Both contenders see the same seeded queue: it is simulated once per case, the
documents a cleanup can change are saved (:class:`~benchmarks.data.Snapshot`)
and put back before every run. Each contender runs once under ``tracemalloc``
(peak Python memory; also a warm-up), then ``repeats`` times untraced for the
wall-time median, alternating which contender goes first. Commands, documents
and bytes are counted on a dedicated client for every run.
"""

from __future__ import annotations

import datetime as dt
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from pymongo import MongoClient

from benchmarks.baseline_2023 import kill_zombies_2023
from benchmarks.data import Snapshot, cleanup_workload
from benchmarks.harness import CommandCounter, Measurement, ServerHandle, drop_if_exists, measure, median
from zombie_pipeline.cleanup import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.simulate import simulate
from zombie_pipeline.store import Store

OURS = "ours"
BASELINE = "baseline_2023"
QUEUE_DB = "bench_cleanup_queue"
CACHE_DB = "bench_cleanup_cache"


@dataclass
class CleanupSettings:
    repeats: int = 3
    batch_size: int = 500
    cap_seconds: float | None = 2_400.0  # a run longer than this is stopped and reported as such
    slow_seconds: float = 120.0  # after a traced run this long, one run is all we take


def benchmark_policy(batch_size: int) -> ZombiePolicy:
    """The default thresholds; the brake set to never engage (its count query still runs)."""
    return ZombiePolicy(max_stale_fraction=1.0, batch_size=batch_size)


def contenders(policy: ZombiePolicy) -> dict[str, Callable[[Store, dt.datetime], Any]]:
    def ours(store: Store, now: dt.datetime) -> int:
        report = run_cleanup(store, policy, run_id=f"bench-{uuid.uuid4().hex[:8]}", now=now)
        return report.counts["finalized"]

    def baseline(store: Store, now: dt.datetime) -> int:
        report = kill_zombies_2023(
            store.jobs, store.cache, now, policy.heartbeat_timeout_seconds, policy.max_duration_seconds, policy.http_status
        )
        return report.jobs_updated

    return {OURS: ours, BASELINE: baseline}


def run_contenders(
    handle: ServerHandle,
    setup_store: Store,
    measured_store: Store,
    counter: CommandCounter,
    snapshot: Snapshot,
    now: dt.datetime,
    settings: CleanupSettings,
    log: Callable[[str], None],
    label: str,
) -> dict[str, dict[str, Any]]:
    """Traced run, then timed repetitions, of both contenders on the same data."""
    policy = benchmark_policy(settings.batch_size)
    calls = contenders(policy)
    results: dict[str, dict[str, Any]] = {
        name: {"walls": [], "traced": None, "timed_out": False, "finalized": None, "counts": None, "notes": []} for name in calls
    }
    dirty = False  # the first run starts from the freshly simulated data

    def one(name: str, trace: bool) -> Measurement:
        nonlocal dirty
        if dirty:
            snapshot.restore(setup_store)
        dirty = True
        m = measure(lambda: calls[name](measured_store, now), counter, trace_memory=trace, cap_seconds=settings.cap_seconds)
        finalized = snapshot.finalized_count(setup_store)
        entry = results[name]
        if m.timed_out:
            entry["timed_out"] = True
            entry["notes"].append(f"stopped after {m.wall_seconds:.0f} s (cap {settings.cap_seconds:.0f} s), {finalized} finalized by then")
            waited = handle.wait_idle()
            log(f"    {label} {name}: TIMED OUT after {m.wall_seconds:.1f} s; server idle after {waited:.0f} s more")
        else:
            if finalized != len(snapshot.zombie_jobs):
                entry["notes"].append(f"finalized {finalized} of {len(snapshot.zombie_jobs)} zombies")
            entry["finalized"] = finalized
            entry["counts"] = m.counts
        log(
            f"    {label} {name:<13} {'traced' if trace else 'timed '} {m.wall_seconds:8.2f} s  "
            f"{m.counts.get('commands', 0):6d} commands  {m.counts.get('docs_returned', 0):7d} docs"
            + (f"  peak {m.peak_python_mb:.1f} MB" if m.peak_python_mb is not None else "")
        )
        return m

    for name in calls:  # traced run: memory, warm-up, and the first wall time
        m = one(name, trace=True)
        results[name]["traced"] = m
    for rep in range(settings.repeats):
        order = list(calls) if rep % 2 == 0 else list(reversed(calls))
        for name in order:
            traced = results[name]["traced"]
            if results[name]["timed_out"] or traced.wall_seconds > settings.slow_seconds:
                continue  # one run of a contender this slow is all the time allows
            results[name]["walls"].append(one(name, trace=False).wall_seconds)
    snapshot.restore(setup_store)

    for name, entry in results.items():
        traced: Measurement = entry["traced"]
        if not entry["walls"] and not entry["timed_out"]:
            entry["walls"] = [traced.wall_seconds]
            why = "no timed repeats asked" if settings.repeats == 0 else f"slower than {settings.slow_seconds:.0f} s"
            entry["notes"].append(f"one run only, under tracemalloc ({why})")
    return results


def cleanup_case(
    handle: ServerHandle,
    setup_client: MongoClient,
    measured_client: MongoClient,
    counter: CommandCounter,
    jobs: int,
    zombies: int,
    settings: CleanupSettings,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Rows (one per contender) for a queue of ``jobs`` with ``zombies`` zombies."""
    drop_if_exists(setup_client, QUEUE_DB, CACHE_DB)
    setup_store = Store.of(setup_client[QUEUE_DB], setup_client[CACHE_DB])
    setup_store.ensure_indexes()  # before the inserts: building an index afterwards is far slower here
    workload = cleanup_workload(jobs, zombies)
    started = time.perf_counter()
    simulation = simulate(setup_store, workload)
    setup_seconds = time.perf_counter() - started
    snapshot = Snapshot.take(setup_store, simulation)
    log(f"  queue of {jobs} jobs, {zombies} zombies: simulated in {setup_seconds:.1f} s ({simulation.cache_entries} cache entries)")
    measured_store = Store.of(measured_client[QUEUE_DB], measured_client[CACHE_DB])
    results = run_contenders(
        handle, setup_store, measured_store, counter, snapshot, simulation.now, settings, log, f"{jobs}/{zombies}"
    )
    rows = [
        _row(
            "cleanup",
            {"queue_jobs": jobs, "zombies": zombies, "started_jobs": snapshot.started, "cache_entries": simulation.cache_entries},
            name,
            entry,
            settings,
        )
        for name, entry in results.items()
    ]
    rows[0]["setup_seconds"] = round(setup_seconds, 1)
    if not handle.embedded:  # an embedded server's storage is deleted with it; dropping is slow there
        drop_if_exists(setup_client, QUEUE_DB, CACHE_DB)
    return rows


def _row(section: str, case: dict[str, Any], name: str, entry: dict[str, Any], settings: CleanupSettings) -> dict[str, Any]:
    traced: Measurement = entry["traced"]
    counts = entry["counts"] or traced.counts
    zombies = case["zombies"]
    return {
        "section": section,
        **case,
        "contender": name,
        "batch_size": settings.batch_size,
        "batches": math.ceil(zombies / settings.batch_size) if name == OURS else None,
        "runs": len(entry["walls"]),
        "wall_seconds": [round(w, 3) for w in entry["walls"]],
        "wall_median_seconds": None if entry["timed_out"] else round(median(entry["walls"]), 3),
        "wall_traced_seconds": round(traced.wall_seconds, 3),
        "timed_out": entry["timed_out"],
        "commands": None if entry["timed_out"] else counts.get("commands"),
        "commands_by_name": counts.get("commands_by_name"),
        "round_trip_seconds_by_command": counts.get("round_trip_seconds_by_command"),
        "docs_returned": None if entry["timed_out"] else counts.get("docs_returned"),
        "bytes_received": None if entry["timed_out"] else counts.get("bytes_received"),
        "bytes_sent": None if entry["timed_out"] else counts.get("bytes_sent"),
        "peak_python_mb": None if entry["timed_out"] else round(traced.peak_python_mb or 0.0, 2),
        "finalized": entry["finalized"],
        "notes": entry["notes"],
    }


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """baseline / ours per case, for every figure both contenders have."""
    by_case: dict[tuple, dict[str, dict[str, Any]]] = {}
    for row in rows:
        key = (row["section"], row["queue_jobs"], row["zombies"])
        by_case.setdefault(key, {})[row["contender"]] = row
    out = []
    for (section, jobs, zombies), pair in by_case.items():
        ours, base = pair.get(OURS), pair.get(BASELINE)
        if not ours or not base:
            continue

        def ratio(field: str) -> float | None:
            a, b = base.get(field), ours.get(field)
            if a is None or b is None or not b:
                return None
            return round(a / b, 2)

        out.append(
            {
                "section": section,
                "queue_jobs": jobs,
                "zombies": zombies,
                "wall": ratio("wall_median_seconds"),
                "commands": ratio("commands"),
                "docs_returned": ratio("docs_returned"),
                "bytes_received": ratio("bytes_received"),
                "peak_python_mb": ratio("peak_python_mb"),
                "ours_timed_out": ours["timed_out"],
            }
        )
    return out
