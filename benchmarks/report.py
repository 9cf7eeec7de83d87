"""Targets, tables and the growth chart, computed from the results file alone.

Over 500 lines: every target and table renders the same results dictionary, in one pass.

Everything printed and written comes from the same ``results`` dictionary, so the
Markdown, the JSON and the PNG always agree, and a partial run (results are
written after every measure) still renders.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.cleanup_bench import CORE_KINDS, KINDS, OURS, ratios

COMMANDS_RATIO_TARGET = 20.0
TARGET_ZOMBIES = 1_000
#: issue 15: documents written per zombie, retries apart
CORE_WRITES_TARGET = 4.0
#: issue 15: ours at least as fast as the baseline at this injected RTT
WALL_TARGET_RTT_MS = 1.0
STATS_TARGET_JOBS = 1_000_000
STATS_PEAK_MB_TARGET = 500.0
#: issue 15: the Arrow path's compute, and its read + compute against the documents path
STATS_COMPUTE_SECONDS_TARGET = 1.0
STATS_SPEEDUP_TARGET = 3.0


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _mb(value: Any) -> str:
    return "–" if value is None else f"{value / 1e6:.2f}"


def table(headers: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(v) if not isinstance(v, str) else v for v in row) + " |")
    return "\n".join(lines)


# --- targets ----------------------------------------------------------------------------------


def _spread_text(spread: dict[str, Any] | None, unit: str = " s") -> str:
    """``14.8 s [14.2-15.1] (13.9-16.0, n=5)``: median, quartiles, min-max."""
    if not spread or not spread.get("n"):
        return "–"
    if spread["n"] == 1:
        return f"{spread['median']:.2f}{unit} (n=1)"
    return (
        f"{spread['median']:.2f}{unit} [{spread['q1']:.2f}-{spread['q3']:.2f}] "
        f"({spread['min']:.2f}-{spread['max']:.2f}, n={spread['n']})"
    )


def _per_zombie_text(row: dict[str, Any]) -> str:
    per = row.get("written_per_zombie") or {}
    if row.get("core_per_zombie") is None:
        return "–"
    text = f"{row['core_per_zombie']:.2f}"
    if per.get("retry"):
        text += f" + {per['retry']:.2f} retry"
    deployment = per.get("deployment's collections")
    if deployment:
        text += f" + {deployment:.2f} deployment's"
    return text


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cleanup = results.get("cleanup", [])
    # documents written per zombie (issue 15): counted from the server's own n of each write, ours, one row per case
    seen: set[str] = set()
    for row in sorted(cleanup, key=lambda r: r["rtt_ms"]):
        if row["contender"] != OURS or row["case"] in seen or row["core_per_zombie"] is None:
            continue
        seen.add(row["case"])
        out.append(
            {
                "target": f"documents written per zombie <= {CORE_WRITES_TARGET:.0f} + retry ({row['label']})",
                "measured": f"{_per_zombie_text(row)} per zombie (claim, job, cache entry, event completion"
                + (" + retries" if (row["written_per_zombie"] or {}).get("retry") else "")
                + (
                    " + the deployment's counters, pastJobs, blockages, locks"
                    if (row["written_per_zombie"] or {}).get("deployment's collections")
                    else ""
                )
                + f"; {row['documents_written']:,} documents for {row['finalized']:,} zombies)",
                "held": row["core_per_zombie"] <= CORE_WRITES_TARGET + 1e-9 and row["all_finalized"],
            }
        )
    for r in ratios(cleanup):
        where = (
            f"{r['queue_jobs']:,} jobs, {r['zombies']:,} zombies, {r['job_types']} types, {r['rtt_ms']:g} ms injected"
        )
        if r["rtt_ms"] == 0 and r["zombies"] == TARGET_ZOMBIES:
            out.append(
                _verdict(
                    f"cleanup commands, baseline/ours >= {COMMANDS_RATIO_TARGET:.0f}x ({where})",
                    r["commands"],
                    COMMANDS_RATIO_TARGET,
                    r["ours_timed_out"],
                )
            )
        held = None if r["wall"] is None else r["wall"] >= 1.0
        name = f"cleanup wall time, ours at least as fast as the baseline ({where}; medians)"
        if r["rtt_ms"] != WALL_TARGET_RTT_MS or r["zombies"] != TARGET_ZOMBIES:
            name = f"(for comparison, not a target) {name}"
            held = None
        out.append(
            {
                "target": name,
                "measured": f"ours {_fmt(r['ours_wall_median'])} s, baseline {_fmt(r['baseline_wall_median'])} s: "
                f"baseline/ours {_fmt(r['wall'])}x (range {_fmt(r['wall_low'])}-{_fmt(r['wall_high'])})",
                "held": held if not r["ours_timed_out"] else False,
                "is_target": r["rtt_ms"] == WALL_TARGET_RTT_MS and r["zombies"] == TARGET_ZOMBIES,
            }
        )
    # commands independent of the number of job types (issue 15)
    by_shape: dict[tuple, dict[int, dict[str, Any]]] = {}
    for row in cleanup:
        if row["contender"] == OURS and row["rtt_ms"] == 0 and isinstance(row["commands"], (int, float)):
            by_shape.setdefault((row["generation"], row["queue_jobs"], row["zombies"]), {})[row["job_types"]] = row
    for (generation, jobs, zombies), by_types in by_shape.items():
        if len(by_types) < 2:
            continue
        few, many = by_types[min(by_types)], by_types[max(by_types)]
        out.append(
            {
                "target": f"cleanup commands across {many['job_types']} job types <= across {few['job_types']} ({generation} queue, {jobs:,} jobs, {zombies:,} zombies)",
                "measured": f"{many['commands']} commands across {many['job_types']} types, {few['commands']} across {few['job_types']}",
                "held": many["commands"] <= few["commands"],
            }
        )
    detection = sorted(results.get("detection", []), key=lambda row: row["finished_jobs"])
    if len(detection) >= 2:
        first, last = detection[0], detection[-1]
        growth = last["finished_jobs"] / first["finished_jobs"]
        examined = (last["docs_examined"] or 0) / max(1, first["docs_examined"] or 0)
        out.append(
            {
                "target": f"detection documents examined flat ({first['finished_jobs']:,} -> {last['finished_jobs']:,} finished jobs, x{growth:.0f})",
                "measured": f"{_fmt(first['docs_examined'])} -> {_fmt(last['docs_examined'])} docs examined (x{examined:.1f}); plan at the largest: {last['plan']}",
                "held": examined <= 1.5,
            }
        )
        timing = last["wall_median_seconds"] / max(1e-9, first["wall_median_seconds"])
        out.append(
            {
                "target": "detection time flat (at most 2x while history grows)",
                "measured": f"{first['wall_median_seconds']:.3f} s -> {last['wall_median_seconds']:.3f} s (x{timing:.1f})",
                "held": timing <= 2.0,
            }
        )
    stats = [row for row in results.get("statistics", []) if row["variant"].startswith("ours")]
    at_target = [row for row in stats if row["finished_jobs"] >= STATS_TARGET_JOBS]
    largest = max(stats, key=lambda row: row["finished_jobs"], default=None)
    for row in at_target or ([largest] if largest else []):
        partial = "" if row["finished_jobs"] >= STATS_TARGET_JOBS else f" (measured at {row['finished_jobs']:,} only)"
        out.append(
            {
                "target": f"statistics peak Python memory < {STATS_PEAK_MB_TARGET:.0f} MB at 1M jobs{partial}",
                "measured": f"{row['peak_python_mb']:.0f} MB at {row['finished_jobs']:,}",
                "held": row["peak_python_mb"] < STATS_PEAK_MB_TARGET if not partial else None,
            }
        )
        out.append(
            {
                "target": f"statistics compute < {STATS_COMPUTE_SECONDS_TARGET:.0f} s at 1M jobs{partial}",
                "measured": f"{row['compute_median_seconds']:.2f} s at {row['finished_jobs']:,} (database read {row['read_median_seconds']:.1f} s)",
                "held": row["compute_median_seconds"] < STATS_COMPUTE_SECONDS_TARGET if not partial else None,
            }
        )
    compute: dict[int, dict[str, dict[str, Any]]] = {}
    for row in results.get("compute", []):
        compute.setdefault(row["finished_jobs"], {})[row.get("path", "documents")] = row
    for size, paths in sorted(compute.items()):
        if size < STATS_TARGET_JOBS or "arrow" not in paths:
            continue
        arrow, documents = paths["arrow"], paths.get("documents")
        at = f"{size:,} jobs, without the server"
        if documents:
            speedup = documents["total_median_seconds"] / max(1e-9, arrow["total_median_seconds"])
            out.append(
                {
                    "target": f"statistics decode + compute >= {STATS_SPEEDUP_TARGET:.0f}x faster through Arrow than the documents path ({at})",
                    "measured": f"documents {documents['decode_median_seconds']:.2f} + {documents['compute_median_seconds']:.2f} s, "
                    f"Arrow {arrow['decode_median_seconds']:.2f} + {arrow['compute_median_seconds']:.2f} s: {speedup:.1f}x"
                    + ("" if arrow.get("same_tallies_as_documents") else "; THE TALLIES DIFFER"),
                    "held": speedup >= STATS_SPEEDUP_TARGET and bool(arrow.get("same_tallies_as_documents")),
                }
            )
            out.append(
                {
                    "target": f"statistics peak memory through Arrow <= the documents path's ({at})",
                    "measured": f"Arrow {arrow['peak_python_mb']:.0f} MB Python + {arrow.get('peak_arrow_mb', 0):.0f} MB Arrow pool; "
                    f"documents {documents['peak_python_mb']:.0f} MB Python + {documents.get('peak_arrow_mb', 0):.0f} MB",
                    "held": arrow.get("peak_mb", arrow["peak_python_mb"])
                    <= documents.get("peak_mb", documents["peak_python_mb"]),
                }
            )
        out.append(
            {
                "target": f"statistics compute < {STATS_COMPUTE_SECONDS_TARGET:.0f} s at 1M jobs, Arrow path ({at})",
                "measured": f"{_spread_text(arrow.get('compute'))} (decoding {arrow['decode_median_seconds']:.2f} s apart)",
                "held": arrow["compute_median_seconds"] < STATS_COMPUTE_SECONDS_TARGET,
            }
        )
        out.append(
            {
                "target": f"statistics peak memory < {STATS_PEAK_MB_TARGET:.0f} MB at 1M jobs, Arrow path ({at})",
                "measured": f"{arrow.get('peak_mb', arrow['peak_python_mb']):.0f} MB",
                "held": arrow.get("peak_mb", arrow["peak_python_mb"]) < STATS_PEAK_MB_TARGET,
            }
        )
    for row in results.get("statistics", []):
        if not row["variant"].startswith("one daily partition"):
            continue
        day = row["jobs_finished_that_day"]
        out.append(
            {
                "target": f"a daily partition transfers only its own day ({row['finished_jobs']:,} finished jobs)",
                "measured": f"{_fmt(row['jobs_read'])} jobs read for {_fmt(day)} jobs finished that day",
                "held": row["jobs_read"] == day,
            }
        )
        out.append(
            {
                "target": f"a daily partition makes the server examine only its own day ({row['finished_jobs']:,})",
                "measured": f"{_fmt(row['docs_examined'])} docs / {_fmt(row['keys_examined'])} keys examined; plan {row['plan']}",
                "held": row["docs_examined"] is not None and row["docs_examined"] <= 1.1 * day + 10,
            }
        )
    return out


def _verdict(name: str, value: float | None, target: float, timed_out: bool) -> dict[str, Any]:
    if timed_out:
        return {"target": name, "measured": "ours did not finish within the cap", "held": False}
    if value is None:
        return {"target": name, "measured": "not measured", "held": None}
    return {"target": name, "measured": f"{value:.1f}x", "held": value >= target}


def held_text(held: bool | None) -> str:
    return {True: "**held**", False: "**missed**", None: "not measured"}[held]


# --- markdown -------------------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    machine = meta.get("machine", {})
    parts = [
        "# Benchmark results (generated)",
        "",
        f"Command: `{meta.get('command', '?')}`  ",
        f"Mode: {meta.get('mode', '?')}; started {meta.get('started_at', '?')}, last written {meta.get('written_at', '?')}"
        + (f", {meta['total_seconds']:.0f} s in all" if meta.get("total_seconds") else "")
        + ("" if meta.get("complete") else " — **partial: the run was still going or stopped early**"),
        "",
        "## Machine",
        "",
        table(["item", "value"], [[k, str(v)] for k, v in machine.items()]),
        "",
        "Settings: " + ", ".join(f"{k} = {v}" for k, v in meta.get("settings", {}).items()),
        "",
    ]
    parts += ["## Targets", "", targets_table(results), ""]
    if results.get("cleanup"):
        parts += [
            "## 1. Cleanup: ours vs the 2023 baseline, a fresh server per run, interleaved",
            "",
            "Wall time: median [quartiles] (min-max, runs). Injected RTT: what the delay proxy adds; "
            "ping: the median round trip of a `ping` through it, measured in every run.",
            "",
            cleanup_table(results["cleanup"]),
            "",
            "Documents written per zombie, by what they are (the server's `n` of each write; RTT 0):",
            "",
            written_table(results["cleanup"]),
            "",
        ]
        if ratios(results["cleanup"]):
            parts += ["Ratios (baseline / ours; above 1, ours is faster):", "", ratio_table(results["cleanup"]), ""]
        parts += [
            "Where the time goes (seconds of round trips per command and collection, as pymongo measured them; last run at RTT 0):",
            "",
            time_split_table(results["cleanup"]),
            "",
        ]
    if results.get("cleanup_models"):
        parts += [
            "### The model: wall = server and client time + round trips x RTT",
            "",
            models_table(results["cleanup_models"]),
            "",
            "Fitted on every timed run of the case (wall against the RTT the proxy added, measured by ping). "
            "The MongoDB columns are a **prediction, not a measurement**: the client CPU time measured here, "
            "plus an assumed 0.1 ms of primary work per document written, plus one RTT per command.",
            "",
        ]
    if results.get("compute"):
        parts += [
            "## 2. The statistics step without the server: documents vs Arrow",
            "",
            compute_table(results["compute"]),
            "",
        ]
    if results.get("detection"):
        parts += ["## 3. Detection as the finished history grows", "", detection_table(results["detection"]), ""]
    if results.get("plans"):
        parts += ["### Query plans on this server", "", plans_table(results["plans"]), ""]
    if results.get("statistics"):
        parts += ["## 4. Statistics read from the server", "", statistics_table(results["statistics"]), ""]
    if results.get("growth"):
        parts += ["## 5. Growth", "", growth_table(results), "", "![growth](benchmarks-growth.png)", ""]
    if results.get("replay"):
        parts += [replay_markdown(results["replay"])]
    return "\n".join(parts)


def replay_markdown(replay: dict[str, Any]) -> str:
    """The detection replay's section (issue 29), with the command of the run that made it."""
    from benchmarks.replay.markdown import markdown as replay_section_markdown

    return replay_section_markdown(replay, replay.get("meta", {}).get("command", "?"))


def targets_table(results: dict[str, Any]) -> str:
    rows = [
        [
            t["target"],
            t["measured"],
            held_text(t["held"]) if t.get("is_target", True) or t["held"] is not None else "(comparison)",
        ]
        for t in targets(results)
    ]
    return table(["target", "measured", "verdict"], rows) if rows else "(nothing measured yet)"


def _rtt_text(row: dict[str, Any]) -> str:
    return f"{row['rtt_ms']:g} (ping {_fmt(row.get('ping_ms'))})"


def cleanup_table(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "case",
            "contender",
            "injected RTT ms (ping ms)",
            "wall s: median [q1-q3] (min-max, n)",
            "commands",
            "docs written",
            "per zombie",
            "server CPU s",
            "client CPU s",
            "peak Python MB",
            "finalized",
            "notes",
        ],
        [
            [
                r["case"],
                r["contender"],
                _rtt_text(r),
                _spread_text(r["wall"], ""),
                r["commands"] if not isinstance(r["commands"], list) else "/".join(map(str, r["commands"])),
                r["documents_written"],
                _per_zombie_text(r),
                r["server_cpu"]["median"] if r.get("server_cpu") else None,
                r["client_cpu"]["median"] if r.get("client_cpu") else None,
                r["peak_python_mb"],
                f"{r['finalized']:,}" + ("" if r["all_finalized"] else " (not all)"),
                "; ".join(r["notes"]) + (f"; {r['timed_out_runs']} runs stopped" if r["timed_out_runs"] else ""),
            ]
            for r in rows
        ],
    )


def _first_per_case(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out, seen = [], set()
    for r in sorted(rows, key=lambda r: r["rtt_ms"]):
        if (r["case"], r["contender"]) not in seen:
            seen.add((r["case"], r["contender"]))
            out.append(r)
    order = {key: i for i, key in enumerate(dict.fromkeys((r["case"], r["contender"]) for r in rows))}
    return sorted(out, key=lambda r: order[(r["case"], r["contender"])])


def written_table(rows: list[dict[str, Any]]) -> str:
    return table(
        ["case", "contender", "zombies finalized", *KINDS, f"per zombie ({' + '.join(CORE_KINDS)})", "write commands"],
        [
            [
                r["case"],
                r["contender"],
                r["finalized"],
                *[(r["written_per_zombie"] or {}).get(kind) for kind in KINDS],
                r["core_per_zombie"],
                r["write_commands"],
            ]
            for r in _first_per_case(rows)
        ],
    )


def time_split_table(rows: list[dict[str, Any]], top: int = 5) -> str:
    out = []
    for r in _first_per_case(rows):
        split = r.get("round_trip_seconds_by_command") or {}
        total = sum(split.values())
        heaviest = ", ".join(f"{name} {seconds:.2f}" for name, seconds in list(split.items())[:top])
        out.append([r["case"], r["contender"], total, heaviest])
    return table(["case", "contender", "sum of round trips s (top 8)", f"heaviest {top}"], out)


def ratio_table(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "case",
            "injected RTT ms",
            "ours median s",
            "baseline median s",
            "wall baseline/ours (range)",
            "commands",
            "docs written",
            "docs returned",
            "peak memory",
        ],
        [
            [
                r["case"],
                r["rtt_ms"],
                r["ours_wall_median"],
                r["baseline_wall_median"],
                f"{_fmt(r['wall'])} ({_fmt(r['wall_low'])}-{_fmt(r['wall_high'])})",
                r["commands"],
                r["documents_written"],
                r["docs_returned"],
                r["peak_python_mb"],
            ]
            for r in ratios(rows)
        ],
    )


def models_table(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "case",
            "contender",
            "timed runs",
            "commands",
            "docs written",
            "client CPU s",
            "server CPU s",
            "fit: intercept s",
            "fit: round trips",
            "fit R²",
            "predicted MongoDB s at 0.1 / 1 / 3 ms",
        ],
        [
            [
                r["case"],
                r["contender"],
                r["runs"],
                r["commands"],
                r["documents_written"],
                r["client_cpu_seconds"],
                r["server_cpu_seconds"],
                r["intercept_seconds"],
                r["round_trips_fitted"],
                r["r2"],
                " / ".join(_fmt(v) for v in (r["predicted_mongodb_seconds"] or {}).values()) or "–",
            ]
            for r in rows
        ],
    )


def detection_table(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "finished jobs",
            "zombies found",
            "runs",
            "median s",
            "commands",
            "docs returned",
            "docs examined",
            "keys examined",
            "winning plan",
        ],
        [
            [
                r["finished_jobs"],
                r["zombies_found"],
                r["runs"],
                r["wall_median_seconds"],
                r["commands"],
                r["docs_returned"],
                r["docs_examined"],
                r["keys_examined"],
                f"`{r['plan']}`",
            ]
            for r in sorted(rows, key=lambda r: r["finished_jobs"])
        ],
    )


def plans_table(rows: list[dict[str, Any]]) -> str:
    return table(
        ["finished jobs", "query", "plan", "returned", "docs examined", "keys examined", "explain s"],
        [
            [
                r["finished_jobs"],
                r["query"],
                f"`{r['plan']}`",
                r["returned"],
                r["docs_examined"],
                r["keys_examined"],
                r["explain_seconds"],
            ]
            for r in rows
        ],
    )


def statistics_table(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "finished jobs",
            "variant",
            "jobs read",
            "runs",
            "wall s",
            "database read s",
            "compute s",
            "peak Python MB",
            "commands",
            "MB received",
            "docs examined",
        ],
        [
            [
                r["finished_jobs"],
                r["variant"],
                r["jobs_read"],
                r["runs"],
                r["wall_median_seconds"],
                r["read_median_seconds"],
                r["compute_median_seconds"],
                r.get("peak_python_mb"),
                r["commands"],
                _mb(r.get("bytes_received")),
                r.get("docs_examined"),
            ]
            for r in rows
        ],
    )


def compute_table(rows: list[dict[str, Any]]) -> str:
    return table(
        [
            "finished jobs",
            "path",
            "jobs read",
            "decode s",
            "compute s",
            "decode + compute s",
            "peak Python MB",
            "peak Arrow pool MB",
            "same tallies",
        ],
        [
            [
                r["finished_jobs"],
                r.get("path", "documents"),
                r["jobs_read"],
                _spread_text(r.get("decode"), ""),
                _spread_text(r.get("compute"), ""),
                _spread_text(r.get("total"), ""),
                r["peak_python_mb"],
                r.get("peak_arrow_mb"),
                r.get("same_tallies_as_documents"),
            ]
            for r in rows
        ],
    )


def growth_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    sizes = sorted({r["finished_jobs"] for r in results.get("detection", [])})
    out = []
    for size in sizes:
        det: dict[str, Any] = next((r for r in results.get("detection", []) if r["finished_jobs"] == size), {})
        stats = {r["variant"].split(" ")[0]: r for r in results.get("statistics", []) if r["finished_jobs"] == size}
        out.append(
            {
                "finished_jobs": size,
                "queue_jobs": det.get("queue_jobs"),
                "detection_seconds": det.get("wall_median_seconds"),
                "detection_docs_examined": det.get("docs_examined"),
                "stats_ours_read_seconds": stats.get("ours", {}).get("read_median_seconds"),
                "stats_ours_compute_seconds": stats.get("ours", {}).get("compute_median_seconds"),
                "stats_ours_peak_mb": stats.get("ours", {}).get("peak_python_mb"),
                "stats_naive_seconds": stats.get("naive", {}).get("wall_median_seconds"),
                "stats_naive_peak_mb": stats.get("naive", {}).get("peak_python_mb"),
                "day_docs_examined": stats.get("one", {}).get("docs_examined"),
                "server_rss_mb": det.get("server_rss_mb"),
            }
        )
    return out


def growth_table(results: dict[str, Any]) -> str:
    rows = growth_rows(results)
    return table(
        [
            "finished jobs",
            "detection s",
            "detection docs examined",
            "stats ours read + compute s",
            "stats ours peak MB",
            "stats naive s",
            "stats naive peak MB",
            "one day: docs examined",
            "server RSS MB",
        ],
        [
            [
                r["finished_jobs"],
                r["detection_seconds"],
                r["detection_docs_examined"],
                "–"
                if r["stats_ours_read_seconds"] is None
                else f"{r['stats_ours_read_seconds']:.2f} + {r['stats_ours_compute_seconds']:.2f}",
                r["stats_ours_peak_mb"],
                r["stats_naive_seconds"],
                r["stats_naive_peak_mb"],
                r["day_docs_examined"],
                r["server_rss_mb"],
            ]
            for r in rows
        ],
    )


# --- chart -----------------------------------------------------------------------------------------


def growth_chart(results: dict[str, Any], path: Path) -> bool:
    rows = growth_rows(results)
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["finished_jobs"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    series = [
        ("detection (ours)", "detection_seconds", "o-"),
        ("statistics, ours (read+compute)", None, "^-"),
        ("statistics, naive", "stats_naive_seconds", "^--"),
    ]
    for label, key, style in series:
        if key is None:
            values = [
                None
                if r["stats_ours_read_seconds"] is None
                else r["stats_ours_read_seconds"] + r["stats_ours_compute_seconds"]
                for r in rows
            ]
        else:
            values = [r[key] for r in rows]
        points = [(x, y) for x, y in zip(sizes, values) if y]
        if points:
            left.plot(*zip(*points), style, label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("finished jobs in the queue collection")
    left.set_ylabel("wall time, s (median)")
    left.set_title("Time as the history grows")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    for label, key, style in (
        ("detection: docs examined", "detection_docs_examined", "o-"),
        ("one daily partition: docs examined", "day_docs_examined", "^-"),
    ):
        points = [(r["finished_jobs"], r[key]) for r in rows if r[key]]
        if points:
            right.plot(*zip(*points), style, label=label)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("finished jobs in the queue collection")
    right.set_ylabel("count")
    right.set_title("Work as the history grows")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle("zombie-pipeline benchmarks (same started jobs and zombies at every size)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
