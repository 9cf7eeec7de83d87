"""Measure 1: the cleanup (``kill_zombies_job``'s core) against the 2023 baseline, on the same data.

Over 500 lines: the rules of a fair comparison below (same data, a fresh server per run, interleaving) are one
procedure, kept in one file.

How a comparison is kept fair (docs/benchmarks.md says why each matters):

* **the same data**: each case is simulated once (seeded) into a server whose
  storage is then kept as the case's template (:mod:`benchmarks.servers`);
* **a fresh server per run**: every run copies the template and starts a
  server of its own on it, so no run inherits another's writes or a server
  slowed down by them (on an external server: fresh databases, built again);
* **interleaved**: the runs go ours, baseline, ours, baseline ..., every case
  and every injected round-trip time in each repetition, the order reversed
  every other repetition, so that a machine getting busier (it is shared)
  weighs on both alike;
* **an injected round-trip time** (0, 1, 3 ms) by the delay proxy, measured by
  ``ping`` in every run;
* **medians with their spread** over the repetitions; one more run per case
  and contender, first and untimed, under ``tracemalloc`` for the peak memory
  and with the bytes on the wire counted.

Every run counts the commands and the documents the server says it wrote
(per collection), the CPU time of the client and of the embedded server, and
checks that exactly the zombies were finalized.
"""

from __future__ import annotations

import datetime as dt
import statistics
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.baseline_2023 import kill_zombies_2023
from benchmarks.data import build_cleanup_queue, cleanup_workload
from benchmarks.harness import CommandCounter, measure, new_client, spread
from benchmarks.servers import Servers, Template, round_trip_ms
from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS, FinishStyle
from zombie_pipeline.queue.jobs import Job, Status
from zombie_pipeline.queue.store import Store

OURS = "ours"
BASELINE = "baseline_2023"
CONTENDERS = (OURS, BASELINE)
#: about as many job types as the deployment runs: a batch of zombies then spans about 30 of them
DEPLOYMENT_JOB_TYPES = 30


@dataclass(frozen=True)
class CleanupCase:
    """A queue: its generation, jobs, zombies and job types, and who cleans it."""

    generation: str = "2023-01"
    jobs: int = 10_000
    zombies: int = 1_000
    job_types: int = DEPLOYMENT_JOB_TYPES
    contenders: tuple[str, ...] = CONTENDERS
    #: the injected RTTs this case runs at (None: every one of the settings'); a case measured for its
    #: counts alone (commands, documents written) needs no more than 0
    rtts_ms: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.generation not in QUEUE_GENERATIONS:
            raise ValueError(f"unknown queue generation {self.generation!r}")
        unknown = set(self.contenders) - set(CONTENDERS)
        if unknown:
            raise ValueError(f"unknown contenders {sorted(unknown)}")
        if BASELINE in self.contenders and QUEUE_GENERATIONS[self.generation].finish is not FinishStyle.KEPT_AS_ERROR:
            raise ValueError(f"the 2023 baseline sets status 'error': it does not apply to a {self.generation} queue")

    @property
    def key(self) -> str:
        return f"{self.generation}:{self.jobs}:{self.zombies}:{self.job_types}"

    @property
    def label(self) -> str:
        return f"{self.generation} queue, {self.jobs:,} jobs, {self.zombies:,} zombies, {self.job_types} job types"

    @classmethod
    def parse(cls, text: str) -> CleanupCase:
        """``GENERATION:JOBS:ZOMBIES[:TYPES[:CONTENDER+CONTENDER[:RTT+RTT]]]``, e.g. ``2023-01:10000:1000:3:ours:0``."""
        parts = text.strip().split(":")
        if len(parts) < 3:
            raise ValueError(f"a cleanup case is GENERATION:JOBS:ZOMBIES[:TYPES[:CONTENDERS]], got {text!r}")
        generation, jobs, zombies = parts[0], int(float(parts[1])), int(float(parts[2]))
        types = int(parts[3]) if len(parts) > 3 and parts[3] else DEPLOYMENT_JOB_TYPES
        if len(parts) > 4 and parts[4]:
            contenders = tuple(parts[4].split("+"))
        else:
            keeps = (
                generation not in QUEUE_GENERATIONS or QUEUE_GENERATIONS[generation].finish is FinishStyle.KEPT_AS_ERROR
            )
            contenders = CONTENDERS if keeps else (OURS,)
        rtts = tuple(float(part) for part in parts[5].split("+")) if len(parts) > 5 and parts[5] else None
        return cls(generation, jobs, zombies, types, contenders, rtts)


@dataclass
class CleanupSettings:
    repeats: int = 5
    rtts_ms: tuple[float, ...] = (0.0, 1.0, 3.0)
    batch_size: int = 500
    cap_seconds: float | None = 900.0  # a run longer than this is stopped and reported as such
    trace: bool = True  # one more run per case and contender, first: peak memory and bytes
    pings: int = 30


def benchmark_policy(batch_size: int) -> ZombiePolicy:
    """The default thresholds; the brake set to never engage (its count query still runs)."""
    return ZombiePolicy(max_stale_fraction=1.0, batch_size=batch_size)


def contenders(policy: ZombiePolicy) -> dict[str, Callable[[Store, dt.datetime], Any]]:
    def ours(store: Store, now: dt.datetime) -> int:
        report = run_cleanup(store, policy, run_id=f"bench-{uuid.uuid4().hex[:8]}", now=now)
        return report.counts["finalized"]

    def baseline(store: Store, now: dt.datetime) -> int:
        report = kill_zombies_2023(
            store.jobs,
            store.cache,
            now,
            policy.heartbeat_timeout_seconds,
            policy.max_duration_seconds,
            policy.http_status,
        )
        return report.jobs_updated

    return {OURS: ours, BASELINE: baseline}


# --- documents written, by what they are ---------------------------------------------------


#: What a document write is for, from its collection and command (the names of ``Store.of``'s defaults).
def write_kind(collection: str, command: str, store: Store) -> str:
    if collection == store.events.name:
        return "claim" if command == "insert" else "event completion"
    if collection == store.jobs.name:
        return "retry" if command == "insert" else "job"
    if collection == store.cache.name:
        return "cache entry"
    return "deployment's collections"


#: The documents a zombie costs at least: its claim, its job, its cache entry, its event's completion.
CORE_KINDS = ("claim", "job", "cache entry", "event completion")
KINDS = CORE_KINDS + ("retry", "deployment's collections")


def written_by_kind(written: dict[str, dict[str, int]], store: Store) -> dict[str, int]:
    out = dict.fromkeys(KINDS, 0)
    for collection, by_command in written.items():
        for command, count in by_command.items():
            out[write_kind(collection, command, store)] += count
    return out


# --- one run ---------------------------------------------------------------------------------


def run_once(
    servers: Servers,
    template: Template,
    case: CleanupCase,
    contender: str,
    rtt_ms: float,
    settings: CleanupSettings,
    traced: bool = False,
    repetition: int | None = None,
) -> dict[str, Any]:
    """One contender on a fresh server holding the case's data: a row of figures."""
    facts = template.facts
    call = contenders(benchmark_policy(settings.batch_size))[contender]
    with servers.fresh(template, rtt_ms) as running:
        direct_ping = round_trip_ms(running.direct_url, settings.pings)
        ping = round_trip_ms(running.url, settings.pings) if running.url != running.direct_url else direct_ping
        counter = CommandCounter(measure_bytes=traced)
        client = new_client(running.url, counter)
        try:
            client.admin.command("ping")  # the connection is opened before the clock starts
            store = Store.of(client[template.queue_db], client[template.cache_db])
            cpu_before = running.cpu_seconds()
            m = measure(
                lambda: call(store, facts["now"]), counter, trace_memory=traced, cap_seconds=settings.cap_seconds
            )
            cpu_after = running.cpu_seconds()
            rss = running.rss_mb()
        finally:
            client.close()
        check = new_client(running.direct_url)
        try:
            started_after = check[template.queue_db][store.jobs.name].count_documents({Job.STATUS: Status.STARTED})
        finally:
            check.close()
    finalized = facts["started"] - started_after
    counts = m.counts
    by_kind = written_by_kind(counts.get("written_by_collection", {}), store)
    notes = []
    if m.timed_out:
        notes.append(
            f"stopped after {m.wall_seconds:.0f} s (cap {settings.cap_seconds:.0f} s), {finalized} finalized by then"
        )
    elif finalized != facts["zombies"]:
        notes.append(f"finalized {finalized} of {facts['zombies']} zombies")
    return {
        "section": "cleanup_runs",
        "case": case.key,
        "label": case.label,
        "generation": case.generation,
        "queue_jobs": case.jobs,
        "zombies": case.zombies,
        "job_types": case.job_types,
        "contender": contender,
        "rtt_ms": rtt_ms,
        "ping_ms": ping,
        "direct_ping_ms": direct_ping,
        "added_rtt_ms": round(max(0.0, ping - direct_ping), 3) if rtt_ms else 0.0,
        "repetition": repetition,
        "traced": traced,
        "wall_seconds": round(m.wall_seconds, 3),
        "client_cpu_seconds": round(m.cpu_seconds, 3),
        "server_cpu_seconds": None if cpu_before is None or cpu_after is None else round(cpu_after - cpu_before, 2),
        "server_rss_mb": None if rss is None else round(rss),
        "timed_out": m.timed_out,
        "commands": counts.get("commands"),
        "commands_by_name": counts.get("commands_by_name"),
        "write_commands": counts.get("write_commands"),
        "documents_written": counts.get("documents_written"),
        "written_by_collection": counts.get("written_by_collection"),
        "written_by_kind": by_kind,
        "docs_returned": counts.get("docs_returned"),
        "bytes_sent": counts.get("bytes_sent"),
        "bytes_received": counts.get("bytes_received"),
        "round_trip_seconds_by_command": dict(list((counts.get("round_trip_seconds_by_command") or {}).items())[:8]),
        "peak_python_mb": round(m.peak_python_mb, 2) if m.peak_python_mb is not None else None,
        "finalized": finalized,
        "expected": facts["zombies"],
        "notes": notes,
    }


# --- the section ------------------------------------------------------------------------------


def case_template(servers: Servers, case: CleanupCase, log: Callable[[str], None]) -> Template:
    workload = cleanup_workload(case.jobs, case.zombies, generation=case.generation, types=case.job_types)
    first: dict[str, Any] = {}

    def build(client: Any, queue_db: str, cache_db: str) -> dict[str, Any]:
        facts = build_cleanup_queue(client, queue_db, cache_db, workload, now=first.get("now"))
        first.setdefault("now", facts["now"])  # every rebuild (external server) at the same instant
        return facts

    template = servers.template(case.key, build)
    facts = template.facts
    log(
        f"  {case.label}: built in {template.build_seconds:.1f} s ({facts['jobs_in_collection']:,} job documents, "
        f"{facts['started']:,} started of {facts['started_job_types']} types, {facts['cache_entries']:,} cache entries)"
    )
    return template


@dataclass
class Schedule:
    """The order of the runs: every case and contender at every RTT in each repetition, reversed every other one."""

    cases: list[CleanupCase]
    rtts_ms: tuple[float, ...]
    repeats: int
    runs: list[tuple[int, float, CleanupCase, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        pairs = [(case, contender) for case in self.cases for contender in case.contenders]
        for repetition in range(self.repeats):
            forward = repetition % 2 == 0
            for rtt in self.rtts_ms if forward else tuple(reversed(self.rtts_ms)):
                for case, contender in pairs if forward else list(reversed(pairs)):
                    if case.rtts_ms is None or rtt in case.rtts_ms:
                        self.runs.append((repetition, rtt, case, contender))


def cleanup_section(
    servers: Servers,
    cases: Iterable[CleanupCase],
    settings: CleanupSettings,
    log: Callable[[str], None],
    emit: Callable[[str, list[dict[str, Any]]], None],
) -> None:
    """Build every case's template, trace each contender once, then run the interleaved schedule."""
    cases = list(cases)
    rtts = settings.rtts_ms if servers.can_delay else tuple(r for r in settings.rtts_ms if r == 0) or (0.0,)
    templates = {case.key: case_template(servers, case, log) for case in cases}
    emit(
        "cleanup_cases",
        [
            {
                "section": "cleanup_cases",
                "case": case.key,
                "label": case.label,
                "contenders": list(case.contenders),
                "build_seconds": round(templates[case.key].build_seconds, 1),
                **_jsonable(templates[case.key].facts),
            }
            for case in cases
        ],
    )
    if settings.trace:
        for case in cases:
            for contender in case.contenders:
                row = run_once(servers, templates[case.key], case, contender, 0.0, settings, traced=True)
                _log_run(log, row)
                emit("cleanup_runs", [row])
    schedule = Schedule(cases, rtts, settings.repeats)
    for index, (repetition, rtt, case, contender) in enumerate(schedule.runs, 1):
        row = run_once(servers, templates[case.key], case, contender, rtt, settings, repetition=repetition)
        _log_run(log, row, f"[{index}/{len(schedule.runs)}] ")
        emit("cleanup_runs", [row])
    for template in templates.values():
        servers.drop(template)


def _jsonable(facts: dict[str, Any]) -> dict[str, Any]:
    return {key: value.isoformat() if isinstance(value, dt.datetime) else value for key, value in facts.items()}


def _log_run(log: Callable[[str], None], row: dict[str, Any], prefix: str = "") -> None:
    written = row["documents_written"] or 0
    log(
        f"    {prefix}{row['case']} {row['contender']:<13} rtt {row['rtt_ms']:g} ms (ping {row['ping_ms']:.2f}) "
        f"{'traced' if row['traced'] else 'timed '} {row['wall_seconds']:7.2f} s  {row['commands'] or 0:5d} commands  "
        f"{written:5d} docs written ({written / max(1, row['finalized']):.2f}/zombie)  client cpu {row['client_cpu_seconds']:.1f} s"
        + (f"  server cpu {row['server_cpu_seconds']:.1f} s" if row["server_cpu_seconds"] is not None else "")
        + (f"  peak {row['peak_python_mb']:.1f} MB" if row["peak_python_mb"] is not None else "")
        + (f"  NOTE {'; '.join(row['notes'])}" if row["notes"] else "")
    )


# --- summaries (computed from the runs alone: a partial run still renders) -------------------


def summaries(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case, contender and injected RTT: the spread of the timed runs, the counts, the documents per zombie."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    traced: dict[tuple, dict[str, Any]] = {}
    for row in runs:
        if row["traced"]:
            traced[(row["case"], row["contender"])] = row
        else:
            groups.setdefault((row["case"], row["contender"], row["rtt_ms"]), []).append(row)
    out = []
    for (case, contender, rtt), rows in groups.items():
        done = [row for row in rows if not row["timed_out"]]
        first = rows[0]
        finalized = max((row["finalized"] for row in done), default=0)
        commands = sorted({row["commands"] for row in done})
        written = [row["documents_written"] for row in done]
        by_kind = {kind: median_of(row["written_by_kind"][kind] for row in done) for kind in KINDS}
        per_zombie = {
            kind: round(count / finalized, 3) if finalized and count is not None else None
            for kind, count in by_kind.items()
        }
        core = sum(per_zombie[kind] or 0 for kind in CORE_KINDS) if finalized else None
        tracer = traced.get((case, contender), {})
        out.append(
            {
                "case": case,
                "label": first["label"],
                "generation": first["generation"],
                "queue_jobs": first["queue_jobs"],
                "zombies": first["zombies"],
                "job_types": first["job_types"],
                "contender": contender,
                "rtt_ms": rtt,
                "ping_ms": median_of(row["ping_ms"] for row in rows),
                "added_rtt_ms": median_of(row["added_rtt_ms"] for row in rows),
                "runs": len(done),
                "timed_out_runs": len(rows) - len(done),
                "wall": spread([row["wall_seconds"] for row in done]),
                "client_cpu": spread([row["client_cpu_seconds"] for row in done]),
                "server_cpu": spread(
                    [row["server_cpu_seconds"] for row in done if row["server_cpu_seconds"] is not None]
                ),
                "commands": commands[0] if len(commands) == 1 else (commands or None),
                "write_commands": median_of(row["write_commands"] for row in done),
                "documents_written": median_of(written),
                "written_by_kind": by_kind,
                "written_per_zombie": per_zombie,
                "core_per_zombie": round(core, 3) if core is not None else None,
                "retries_per_zombie": per_zombie["retry"],
                "docs_returned": median_of(row["docs_returned"] for row in done),
                "finalized": finalized,
                "all_finalized": all(row["finalized"] == row["expected"] for row in done) and bool(done),
                "peak_python_mb": tracer.get("peak_python_mb"),
                "bytes_sent": tracer.get("bytes_sent"),
                "bytes_received": tracer.get("bytes_received"),
                "round_trip_seconds_by_command": (done[-1] if done else first)["round_trip_seconds_by_command"],
                "notes": sorted({note for row in rows for note in row["notes"]}),
            }
        )
    order = {key: index for index, key in enumerate(dict.fromkeys(row["case"] for row in runs))}
    out.sort(key=lambda r: (order[r["case"]], r["rtt_ms"], CONTENDERS.index(r["contender"])))
    return out


def median_of(values: Iterable[Any]) -> Any:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    return statistics.median(present)


#: What the model assumes a MongoDB primary spends per document written (journaled, indexed): an assumption,
#: stated beside every prediction, not a measurement (no mongod can be installed here).
MONGODB_SECONDS_PER_DOCUMENT = 0.0001


def models(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case and contender, ``wall = a + b x added round trip`` fitted over every timed run.

    ``a`` is the run without network (client work plus this server's work), ``b`` the round trips the
    fit sees (compare: the commands counted). The prediction for a MongoDB cluster keeps the client's
    CPU time measured here, replaces this server's work by the documents written at
    :data:`MONGODB_SECONDS_PER_DOCUMENT` each, and pays one RTT per command.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in runs:
        if not row["traced"] and not row["timed_out"]:
            groups.setdefault((row["case"], row["contender"]), []).append(row)
    out = []
    for (case, contender), rows in groups.items():
        points = [(row["added_rtt_ms"] / 1000, row["wall_seconds"]) for row in rows]
        fitted = fit_line(points)
        commands = median_of(row["commands"] for row in rows)
        written = median_of(row["documents_written"] for row in rows)
        client_cpu = median_of(row["client_cpu_seconds"] for row in rows)
        server_cpu = median_of(row["server_cpu_seconds"] for row in rows)
        at_zero = median_of(row["wall_seconds"] for row in rows if row["rtt_ms"] == 0)
        model = {
            "case": case,
            "label": rows[0]["label"],
            "contender": contender,
            "runs": len(rows),
            "commands": commands,
            "documents_written": written,
            "client_cpu_seconds": client_cpu,
            "server_cpu_seconds": server_cpu,
            "wall_at_0_seconds": at_zero,
            "intercept_seconds": None,
            "round_trips_fitted": None,
            "r2": None,
            "mongodb_server_seconds_assumed": round(written * MONGODB_SECONDS_PER_DOCUMENT, 3)
            if written is not None
            else None,
            "predicted_mongodb_seconds": {},
        }
        if fitted:
            a, b, _worst = fitted
            model["intercept_seconds"] = round(a, 3)
            model["round_trips_fitted"] = round(b)
            model["r2"] = round(r_squared(points, a, b), 3)
        if commands is not None and client_cpu is not None and written is not None:
            for rtt in (0.1, 1.0, 3.0):
                model["predicted_mongodb_seconds"][f"{rtt:g}"] = round(
                    client_cpu + written * MONGODB_SECONDS_PER_DOCUMENT + commands * rtt / 1000, 2
                )
        out.append(model)
    return out


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least squares ``y = a + b x``; returns (a, b, max |residual|)."""
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    a = mean_y - b * mean_x
    return a, b, max(abs(y - (a + b * x)) for x, y in points)


def r_squared(points: list[tuple[float, float]], a: float, b: float) -> float:
    mean_y = sum(y for _, y in points) / len(points)
    total = sum((y - mean_y) ** 2 for _, y in points)
    residual = sum((y - (a + b * x)) ** 2 for x, y in points)
    return 1 - residual / total if total else 1.0


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """baseline / ours per case and injected RTT, from :func:`summaries` rows: above 1, ours is ahead."""
    by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((row["case"], row["rtt_ms"]), {})[row["contender"]] = row
    out = []
    for (case, rtt), pair in by_key.items():
        ours, base = pair.get(OURS), pair.get(BASELINE)
        if not ours or not base:
            continue

        def ratio(a: Any, b: Any) -> float | None:
            if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
                return None
            return round(a / b, 2)

        out.append(
            {
                "case": case,
                "label": ours["label"],
                "queue_jobs": ours["queue_jobs"],
                "zombies": ours["zombies"],
                "job_types": ours["job_types"],
                "rtt_ms": rtt,
                "added_rtt_ms": ours["added_rtt_ms"],
                "ours_wall_median": ours["wall"]["median"],
                "baseline_wall_median": base["wall"]["median"],
                "wall": ratio(base["wall"]["median"], ours["wall"]["median"]),
                # the spread of the ratio: the baseline's worst against ours' best, and the other way round
                "wall_low": ratio(base["wall"]["min"], ours["wall"]["max"]),
                "wall_high": ratio(base["wall"]["max"], ours["wall"]["min"]),
                "commands": ratio(base["commands"], ours["commands"]),
                "documents_written": ratio(base["documents_written"], ours["documents_written"]),
                "docs_returned": ratio(base["docs_returned"], ours["docs_returned"]),
                "peak_python_mb": ratio(base["peak_python_mb"], ours["peak_python_mb"]),
                "ours_timed_out": bool(ours["timed_out_runs"]) or not ours["runs"],
            }
        )
    return out
