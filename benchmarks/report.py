"""Targets, tables and the growth chart, computed from the results file alone.

Everything printed and written comes from the same ``results`` dictionary, so the
Markdown, the JSON and the PNG always agree, and a partial run (results are
written after every measure) still renders.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from benchmarks.cleanup_bench import BASELINE, OURS, ratios

COMMANDS_RATIO_TARGET = 20.0
WALL_RATIO_TARGET = 3.0
TARGET_ZOMBIES = 1_000
STATS_TARGET_JOBS = 1_000_000
STATS_PEAK_MB_TARGET = 500.0
STATS_COMPUTE_SECONDS_TARGET = 2.0


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


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cleanup = results.get("cleanup", [])
    for r in ratios(cleanup):
        if r["zombies"] != TARGET_ZOMBIES:
            continue
        where = f"{r['queue_jobs']:,} jobs, {r['zombies']:,} zombies"
        out.append(_verdict(f"cleanup commands, baseline/ours >= {COMMANDS_RATIO_TARGET:.0f}x ({where})", r["commands"], COMMANDS_RATIO_TARGET, r["ours_timed_out"]))
        out.append(_verdict(f"cleanup wall time, baseline/ours >= {WALL_RATIO_TARGET:.0f}x ({where})", r["wall"], WALL_RATIO_TARGET, r["ours_timed_out"]))
    ours_rows = [row for row in cleanup + results.get("growth_cleanup", []) if row["contender"] == OURS and row.get("commands")]
    points = [(float(row["batches"]), float(row["commands"])) for row in ours_rows if row.get("batches")]
    fitted = fit_line(points)
    if fitted:
        a, b, worst = fitted
        tolerance = max(3.0, 0.1 * max(y for _, y in points))
        out.append(
            {
                "target": "cleanup commands bounded by a constant + (zombies / batch size)",
                "measured": f"commands ~ {a:.1f} + {b:.1f} x ceil(zombies/batch) over {len(points)} runs; worst residual {worst:.1f}",
                "held": worst <= tolerance,
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
    for row in results.get("compute", []):
        if row["finished_jobs"] < STATS_TARGET_JOBS:
            continue
        at = f"{row['finished_jobs']:,} jobs, without the server"
        out.append(
            {
                "target": f"statistics compute < {STATS_COMPUTE_SECONDS_TARGET:.0f} s at 1M jobs ({at})",
                "measured": f"{row['compute_median_seconds']:.2f} s (BSON decoding {row['decode_median_seconds']:.2f} s apart)",
                "held": row["compute_median_seconds"] < STATS_COMPUTE_SECONDS_TARGET,
            }
        )
        out.append(
            {
                "target": f"statistics peak Python memory < {STATS_PEAK_MB_TARGET:.0f} MB at 1M jobs ({at})",
                "measured": f"{row['peak_python_mb']:.0f} MB",
                "held": row["peak_python_mb"] < STATS_PEAK_MB_TARGET,
            }
        )
    for row in results.get("statistics", []):
        if not row["variant"].startswith("one daily partition"):
            continue
        day = row["jobs_finished_that_day"]
        out.append(
            {
                "target": f"a daily partition transfers only its own day ({row['finished_jobs']:,} finished jobs)",
                "measured": f"{_fmt(row['docs_returned'])} docs returned for {_fmt(day)} jobs finished that day",
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
        + ("" if meta.get("complete") else " — **partial: the run was still going or stopped early**"),
        "",
        "## Machine",
        "",
        table(["item", "value"], [[k, str(v)] for k, v in machine.items()]),
        "",
    ]
    parts += ["## Targets", "", targets_table(results), ""]
    if results.get("cleanup"):
        parts += ["## 1. Cleanup: ours vs the 2023 baseline", "", cleanup_table(results["cleanup"]), "", "Ratios (baseline / ours):", "", ratio_table(results["cleanup"]), ""]
    if any(r.get("round_trip_seconds_by_command") for r in results.get("cleanup", [])):
        parts += ["Where the time goes (round-trip seconds per command and collection, as pymongo measured them; last run):", "", time_split_table(results["cleanup"]), ""]
    if results.get("detection"):
        parts += ["## 2. Detection as the finished history grows", "", detection_table(results["detection"]), ""]
    if results.get("plans"):
        parts += ["### Query plans on this server", "", plans_table(results["plans"]), ""]
    if results.get("statistics"):
        parts += ["## 3. Statistics", "", statistics_table(results["statistics"]), ""]
    if results.get("compute"):
        parts += ["### The statistics step without the server", "", compute_table(results["compute"]), ""]
    if results.get("detection") or results.get("growth_cleanup"):
        parts += ["## 4. Growth", "", growth_table(results), "", "![growth](benchmarks-growth.png)", ""]
        if results.get("growth_cleanup"):
            parts += ["Cleanup on the growing queue:", "", cleanup_table(results["growth_cleanup"]), ""]
    return "\n".join(parts)


def targets_table(results: dict[str, Any]) -> str:
    rows = [[t["target"], t["measured"], held_text(t["held"])] for t in targets(results)]
    return table(["target", "measured", "verdict"], rows) if rows else "(nothing measured yet)"


def cleanup_table(rows: list[dict[str, Any]]) -> str:
    return table(
        ["queue jobs", "zombies", "contender", "runs", "median wall s", "commands", "docs returned", "MB received", "MB sent", "peak Python MB", "finalized", "notes"],
        [
            [
                r["queue_jobs"],
                r["zombies"],
                r["contender"],
                r["runs"],
                r["wall_median_seconds"] if not r["timed_out"] else f"> {r['wall_traced_seconds']:.0f} (stopped)",
                r["commands"],
                r["docs_returned"],
                _mb(r["bytes_received"]),
                _mb(r["bytes_sent"]),
                r["peak_python_mb"],
                r["finalized"],
                "; ".join(r["notes"]) or "",
            ]
            for r in rows
        ],
    )


def time_split_table(rows: list[dict[str, Any]], top: int = 5) -> str:
    out = []
    for r in rows:
        split = r.get("round_trip_seconds_by_command") or {}
        total = sum(split.values())
        heaviest = ", ".join(f"{name} {seconds:.1f}" for name, seconds in list(split.items())[:top])
        out.append([r["queue_jobs"], r["zombies"], r["contender"], total, heaviest])
    return table(["queue jobs", "zombies", "contender", "sum of round trips s", f"heaviest {top}"], out)


def ratio_table(rows: list[dict[str, Any]]) -> str:
    return table(
        ["queue jobs", "zombies", "wall", "commands", "docs returned", "bytes received", "peak memory"],
        [[r["queue_jobs"], r["zombies"], r["wall"], r["commands"], r["docs_returned"], r["bytes_received"], r["peak_python_mb"]] for r in ratios(rows)],
    )


def detection_table(rows: list[dict[str, Any]]) -> str:
    return table(
        ["finished jobs", "zombies found", "runs", "median s", "commands", "docs returned", "docs examined", "keys examined", "winning plan"],
        [
            [r["finished_jobs"], r["zombies_found"], r["runs"], r["wall_median_seconds"], r["commands"], r["docs_returned"], r["docs_examined"], r["keys_examined"], f"`{r['plan']}`"]
            for r in sorted(rows, key=lambda r: r["finished_jobs"])
        ],
    )


def plans_table(rows: list[dict[str, Any]]) -> str:
    return table(
        ["finished jobs", "query", "plan", "returned", "docs examined", "keys examined", "explain s"],
        [[r["finished_jobs"], r["query"], f"`{r['plan']}`", r["returned"], r["docs_examined"], r["keys_examined"], r["explain_seconds"]] for r in rows],
    )


def statistics_table(rows: list[dict[str, Any]]) -> str:
    return table(
        ["finished jobs", "variant", "jobs read", "runs", "wall s", "database read s", "compute s", "peak Python MB", "commands", "MB received", "docs examined"],
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
        ["finished jobs", "jobs read", "runs", "compute s (median)", "compute s (each run)", "BSON decoding s", "peak Python MB"],
        [
            [r["finished_jobs"], r["jobs_read"], r["runs"], r["compute_median_seconds"], ", ".join(map(str, r["compute_seconds"])), r["decode_median_seconds"], r["peak_python_mb"]]
            for r in rows
        ],
    )


def growth_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    sizes = sorted({r["finished_jobs"] for r in results.get("detection", [])} | {r["finished_jobs"] for r in results.get("growth_cleanup", [])})
    out = []
    for size in sizes:
        det = next((r for r in results.get("detection", []) if r["finished_jobs"] == size), {})
        ours = next((r for r in results.get("growth_cleanup", []) if r["finished_jobs"] == size and r["contender"] == OURS), {})
        base = next((r for r in results.get("growth_cleanup", []) if r["finished_jobs"] == size and r["contender"] == BASELINE), {})
        stats = {r["variant"].split(" ")[0]: r for r in results.get("statistics", []) if r["finished_jobs"] == size}
        out.append(
            {
                "finished_jobs": size,
                "queue_jobs": det.get("queue_jobs") or ours.get("queue_jobs"),
                "detection_seconds": det.get("wall_median_seconds"),
                "detection_docs_examined": det.get("docs_examined"),
                "cleanup_ours_seconds": ours.get("wall_median_seconds"),
                "cleanup_baseline_seconds": base.get("wall_median_seconds"),
                "cleanup_ours_commands": ours.get("commands"),
                "cleanup_baseline_commands": base.get("commands"),
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
            "cleanup ours s",
            "cleanup baseline s",
            "commands ours / baseline",
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
                r["cleanup_ours_seconds"],
                r["cleanup_baseline_seconds"],
                f"{_fmt(r['cleanup_ours_commands'])} / {_fmt(r['cleanup_baseline_commands'])}",
                "–" if r["stats_ours_read_seconds"] is None else f"{r['stats_ours_read_seconds']:.2f} + {r['stats_ours_compute_seconds']:.2f}",
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
        ("cleanup, ours", "cleanup_ours_seconds", "s-"),
        ("cleanup, 2023 baseline", "cleanup_baseline_seconds", "s--"),
        ("statistics, ours (read+compute)", None, "^-"),
        ("statistics, naive", "stats_naive_seconds", "^--"),
    ]
    for label, key, style in series:
        if key is None:
            values = [
                None if r["stats_ours_read_seconds"] is None else r["stats_ours_read_seconds"] + r["stats_ours_compute_seconds"]
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
        ("cleanup commands, ours", "cleanup_ours_commands", "s-"),
        ("cleanup commands, baseline", "cleanup_baseline_commands", "s--"),
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
