"""The duration report as people read it: a Markdown table, a YAML snippet, CSV, JSON and a chart.

Everything here formats a :class:`~zombie_pipeline.statistics.suggest.DurationReport`;
nothing reads the database. No Dagster either: the assets put these strings and
paths into metadata, the CLI prints :func:`summary_text`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zombie_pipeline import config
from zombie_pipeline.queue.documents import REASONS, Status
from zombie_pipeline.statistics.offenders import RepeatOffenders
from zombie_pipeline.statistics.quantiles import percentile_name
from zombie_pipeline.statistics.suggest import DurationReport, TypeReport
from zombie_pipeline.statistics.tallies import SOURCES

CHART_COLUMNS = 3
_TIME_TICKS = {
    0.1: "0.1 s",
    1: "1 s",
    10: "10 s",
    60: "1 min",
    600: "10 min",
    3_600: "1 h",
    36_000: "10 h",
    86_400: "1 d",
}


@dataclass(frozen=True)
class ReportFiles:
    csv: Path
    json: Path
    chart: Path
    markdown: Path


# --- formatting --------------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    """``42.1 s``, ``20 min``, ``1 h 15 min``: the units an operator thinks a timeout in."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "–"
    if seconds < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3_600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min" if rest == 0 else f"{minutes} min {rest} s"
    hours, rest = divmod(round(seconds / 60), 60)
    return f"{hours} h" if rest == 0 else f"{hours} h {rest} min"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def window_text(report: DurationReport) -> str:
    """The window, and how much of it the figures cover when days are missing."""
    window = f"{report.window_start:%Y-%m-%d %H:%M} – {report.window_end:%Y-%m-%d %H:%M} UTC"
    if not report.complete:
        window += f" (only {report.days_present} of its {report.days_expected} days computed)"
    return window


def _interval(entry: TypeReport) -> str:
    if entry.quantile_seconds is None:
        return "–"
    low = (
        format_duration(entry.quantile_low_seconds) if entry.quantile_low_seconds is not None else "no lower bound yet"
    )
    high = (
        format_duration(entry.quantile_high_seconds)
        if entry.quantile_high_seconds is not None
        else "no upper bound yet: too few runs"
    )
    return f"{format_duration(entry.quantile_seconds)} [{low}, {high}]"


def _backtest(entry: TypeReport) -> str:
    if not entry.enough_data:
        return "–"
    parts = [f"kills {entry.backtest_successes_stopped}/{entry.successes} successes"]
    if entry.backtest_stopped_sooner:
        parts.append(
            f"stops {entry.backtest_stopped_sooner} overruns sooner "
            f"(saves {format_duration(entry.backtest_seconds_saved)})"
        )
    if entry.backtest_given_more_time:
        parts.append(f"gives {entry.backtest_given_more_time} stopped jobs more time")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(report: DurationReport) -> str:
    """Two tables of a row per job type, narrow enough for a dialog: the runs, then the maximum duration (T2)."""
    q = percentile_name(report.rules.quantile)
    statuses = [
        status
        for status in (Status.SUCCESS, Status.ERROR, Status.CANCELLED, Status.SKIPPED)
        if status in (Status.SUCCESS, Status.ERROR) or any(entry.statuses.get(status) for entry in report.types)
    ]
    runs_header = [
        "type",
        *statuses,
        "zombies (crashed / never beat / SIGTERM / too long)",
        "zombie rate",
        "p50",
        "p90",
        "p99",
        "max",
    ]
    t2_header = [
        "type",
        "current T2",
        "suggested T2",
        f"{q} [{report.rules.confidence:.0%} CI]",
        "stopped at T2",
        "backtest",
        "flags",
    ]
    runs_rows, t2_rows = [], []
    for entry in report.types:
        stats = entry.statistics
        name = f"`{entry.job_type}`"
        suggested = format_duration(entry.suggested_t2_seconds)
        if entry.enough_data and entry.change != "keep":
            suggested = f"**{suggested}** ({entry.change})"
        runs_rows.append(
            [
                name,
                *(str(entry.statuses.get(status, 0)) for status in statuses),
                " / ".join(str(entry.zombies.get(reason, 0)) for reason in REASONS),
                _share(entry.zombie_rate),
                *(format_duration(stats[name]) for name in ("p50", "p90", "p99", "max")),
            ]
        )
        t2_rows.append(
            [
                name,
                format_duration(entry.current_t2_seconds),
                suggested,
                _interval(entry),
                f"{entry.stopped} ({_share(entry.stopped_share)})" if entry.stopped else "0",
                _backtest(entry),
                "; ".join(entry.flags) or "–",
            ]
        )
    lines = [
        f"**Job durations {window_text(report)}**",
        "",
        *_table(runs_header, runs_rows),
        "",
        f"**Maximum duration (T2)**: suggested = {q} × {report.rules.margin:g}, rounded up, at least the heartbeat "
        f"timeout ({format_duration(report.heartbeat_timeout_seconds)}); at least {report.rules.min_samples} successful "
        "runs needed.",
        "",
        *_table(t2_header, t2_rows),
        "",
        _data_notes(report),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(_cell(value) for value in row) + " |" for row in rows),
    ]


def _read_what(report: DurationReport) -> str:
    return "cache entries" if report.source == "cache" else "finished jobs"


def _data_notes(report: DurationReport) -> str:
    notes = [f"Source: {SOURCES.get(report.source, report.source)}."]
    if report.bad_data:
        notes.append(
            "Skipped documents: " + ", ".join(f"{name} {count}" for name, count in report.bad_data.items()) + "."
        )
    if report.missing_days:
        notes.append(f"Days not computed yet, left out of the window: {', '.join(report.missing_days)}.")
    return " ".join(notes)


def policy_snippet(report: DurationReport) -> str:
    """Dagster run config for the ``zombie_policy`` resource with the suggested T2 per type.

    The mapping replaces the configured one, so it carries the existing
    overrides of types without a suggestion. Keys are JSON strings: valid YAML
    whatever the type name holds.
    """
    lines = ["resources:", "  zombie_policy:", "    config:", "      max_duration_seconds_by_type:"]
    mapping = report.policy_max_durations()
    if not mapping:
        lines[-1] += " {}"
    for job_type, seconds in mapping.items():
        lines.append(f"        {json.dumps(job_type)}: {seconds}  # {format_duration(seconds)}")
    return "\n".join(lines) + "\n"


def summary_text(report: DurationReport, files: ReportFiles | None = None) -> str:
    """A few plain lines per type, for a terminal: what to change and how sure we are."""
    q = percentile_name(report.rules.quantile)
    lines = [
        f"Job durations, {window_text(report)}: {report.jobs_read} {_read_what(report)}, {report.events_read} zombies "
        "finalized in the window (the ones of the day running count in tomorrow's)"
    ]
    for entry in report.types:
        counts = (
            ", ".join(f"{count} {status}" for status, count in sorted(entry.statuses.items()) if count) or "no jobs"
        )
        lines.append(f"{entry.job_type}: {counts}; zombie rate {_share(entry.zombie_rate)}")
        if entry.successes:
            stats = entry.statistics
            lines.append(
                f"    success p50 {format_duration(stats['p50'])}, p99 {format_duration(stats['p99'])}, "
                f"max {format_duration(stats['max'])}"
            )
        if entry.enough_data:
            lines.append(
                f"    T2 {format_duration(entry.current_t2_seconds)} -> {format_duration(entry.suggested_t2_seconds)} "
                f"({entry.change}); {q} {_interval(entry)}; would kill {entry.backtest_successes_stopped} of "
                f"{entry.successes} successes"
                + (
                    f", stop {entry.backtest_stopped_sooner} overruns {format_duration(entry.backtest_seconds_saved)} sooner"
                    if entry.backtest_stopped_sooner
                    else ""
                )
            )
        for flag in entry.flags:
            lines.append(f"    ! {flag}")
    notes = _data_notes(report)
    if notes:
        lines.append(notes)
    if files is not None:
        lines.append(f"Reports: {files.markdown}, {files.csv}, {files.json}, {files.chart}")
    lines.append("Suggested configuration:")
    lines.extend("  " + line for line in policy_snippet(report).splitlines())
    return "\n".join(lines) + "\n"


# --- repeat offenders ---------------------------------------------------------------------


def offenders_markdown(found: RepeatOffenders, max_rows: int = 20) -> str:
    """The datasets finalized again and again in a window: a row per dataset and job type, the most finalized first.

    Short enough to read in a report: past ``max_rows`` rows the rest are counted, not listed.
    """
    lines = [
        f"**Repeat offenders {found.window_text()}**: {found.offenders_total} datasets finalized at least {found.threshold} times "
        f"({found.events} finalizations of {found.datasets} datasets in the window).",
        "",
    ]
    rows = found.rows()
    if rows:
        header = [
            "dataset",
            "type",
            "zombies (crashed / never beat / SIGTERM / too long)",
            "first seen",
            "last seen",
            "retry limit reached",
            "last error",
        ]
        table_rows = [
            [
                f"`{row['dataset']}`",
                f"`{row['type']}`",
                f"{row['finalizations']} (" + " / ".join(str(row[reason.value]) for reason in REASONS) + ")",
                row["first_seen"],
                row["last_seen"],
                "yes" if row["retry_limit_reached"] else "no",
                f"{row['last_error']} ({row['error_from']})",
            ]
            for row in rows[:max_rows]
        ]
        lines += _table(header, table_rows)
        hidden = len(rows) - len(table_rows)
        if hidden or found.truncated:
            lines += [
                "",
                f"Not listed: {hidden} more rows"
                + (f", {found.offenders_total - len(found.offenders)} more datasets" if found.truncated else "")
                + ".",
            ]
    if found.malformed:
        lines += [
            "",
            "Skipped events: " + ", ".join(f"{name} {count}" for name, count in sorted(found.malformed.items())) + ".",
        ]
    return "\n".join(lines).rstrip() + "\n"


# --- a chart in text, for the UI's metadata ---------------------------------------------

#: Bin edges of the text chart, in seconds: about twice apart (a log scale), each a duration read at a glance.
CHART_EDGES = (
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
    1_200,
    1_800,
    3_600,
    7_200,
    14_400,
    28_800,
    43_200,
    86_400,
    172_800,
    345_600,
    604_800,
)
CHART_BAR_WIDTH = 20
#: The Dagster UI shows a Markdown value shorter than this inline, longer ones behind a link.
INLINE_MARKDOWN_LIMIT = 1_000
_EIGHTHS = " ▏▎▍▌▋▊▉"


def _bar(count: int, largest: int, width: int) -> str:
    """``count`` as a bar of block characters, ``width`` full blocks for ``largest``; any run at least a sliver."""
    if count <= 0:
        return ""
    eighths = max(round(count / largest * width * 8), 1)
    full, rest = divmod(eighths, 8)
    return "█" * full + (_EIGHTHS[rest] if rest else "")


def _bin_of(seconds: float) -> int:
    """The index of the chart bin holding ``seconds`` (below the first edge: the first bin)."""
    return max(int(np.searchsorted(CHART_EDGES, seconds, side="right")) - 1, 0)


def duration_chart(entry: TypeReport, width: int = CHART_BAR_WIDTH) -> str:
    """One type's successful durations as a Markdown histogram in text, log-scale bins, the bins of the T2s marked.

    Short enough (under :data:`INLINE_MARKDOWN_LIMIT`) for the Dagster UI to show it in the metadata
    table itself; the bars come after the counts, so a font that draws blocks wider misaligns nothing.
    """
    stats = entry.statistics
    lines = [f"{entry.job_type}: {entry.successes} successful runs"]
    if entry.successes:
        lines[0] += f", p50 {format_duration(stats['p50'])}, p99 {format_duration(stats['p99'])}"
    if entry.stopped:
        lines.append(f"{entry.stopped} more stopped at T2, their true durations unknown")
    marks = {_bin_of(entry.current_t2_seconds): [f"current T2 {format_duration(entry.current_t2_seconds)}"]}
    if entry.enough_data:
        suggested = f"suggested T2 {format_duration(entry.suggested_t2_seconds)}" + (
            f" ({entry.change})" if entry.change != "keep" else ""
        )
        marks.setdefault(_bin_of(entry.suggested_t2_seconds), []).append(suggested)
    else:
        lines.append("not enough data for a suggestion: the current T2 stays")
    bins = [_bin_of(float(value)) for value in entry.success_durations]
    counts = np.bincount(np.asarray(bins, dtype=np.int64), minlength=len(CHART_EDGES))
    shown = [*bins, *marks]
    first, last = min(shown), max(shown)
    largest = max(int(counts.max()), 1)
    lows = [format_duration(CHART_EDGES[index]) for index in range(first, last + 1)]
    highs = [
        format_duration(CHART_EDGES[index + 1]) if index + 1 < len(CHART_EDGES) else "more"
        for index in range(first, last + 1)
    ]
    low_width, high_width = max(map(len, lows)), max(map(len, highs))
    count_width = len(str(largest))
    for index, low, high in zip(range(first, last + 1), lows, highs):
        count = int(counts[index])
        label = f"{low:>{low_width}} – {high:<{high_width}}"
        row = f"{label} {count:>{count_width}} {_bar(count, largest, width)}"
        if index in marks:
            row += ("  " if count else "") + "◀ " + ", ".join(marks[index])
        lines.append(row.rstrip())
    return "```text\n" + "\n".join(lines) + "\n```"


def duration_charts(report: DurationReport) -> dict[str, str]:
    """:func:`duration_chart` per type, keyed by type; each short enough to be shown inline."""
    charts = {}
    for entry in report.types:
        chart = duration_chart(entry)
        width = CHART_BAR_WIDTH
        while len(chart) >= INLINE_MARKDOWN_LIMIT and width > 4:
            width //= 2
            chart = duration_chart(entry, width)
        charts[entry.job_type] = chart
    return charts


# --- files -------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return _jsonable(value.item())
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


def report_json(report: DurationReport) -> dict[str, Any]:
    """The whole report as plain JSON values."""
    return _jsonable(
        {
            "window_start": report.window_start,
            "window_end": report.window_end,
            "computed_at": report.computed_at,
            "rules": report.rules.as_dict(),
            "heartbeat_timeout_seconds": report.heartbeat_timeout_seconds,
            "default_t2_seconds": report.default_t2_seconds,
            "bad_data": report.bad_data,
            "missing_days": report.missing_days,
            "days_present": report.days_present,
            "days_expected": report.days_expected,
            "source": report.source,
            "jobs_read": report.jobs_read,
            "events_read": report.events_read,
            "types": [{**record, "flags": entry.flags} for record, entry in zip(report.records(), report.types)],
            "suggested_max_duration_seconds_by_type": report.suggested_max_durations(),
            "zombie_policy_snippet": policy_snippet(report),
        }
    )


def report_stem(report: DurationReport) -> str:
    """``durations_<first day>_<last day>``, plus ``_partial-3of7`` when days are missing: a partial window never
    replaces a fuller one. A window of whole days ends at the midnight after its last day, which it does not hold."""
    end = report.window_end
    last = end - dt.timedelta(days=1) if (end.hour, end.minute, end.second, end.microsecond) == (0, 0, 0, 0) else end
    stem = f"durations_{_stamp(report.window_start)}_{_stamp(last)}"
    if not report.complete:
        stem += f"_partial-{report.days_present}of{report.days_expected}"
    return stem


def write_reports(
    report: DurationReport, directory: Path | str | None = None, sections: Sequence[str] = ()
) -> ReportFiles:
    """Write Markdown, CSV, JSON and the chart, named after the window and its completeness; return their paths.

    ``sections`` (Markdown, such as :func:`offenders_markdown`) follow the tables in the Markdown file.
    """
    directory = Path(directory) if directory is not None else config.reports_dir()
    directory.mkdir(parents=True, exist_ok=True)
    stem = report_stem(report)
    files = ReportFiles(
        csv=directory / f"{stem}.csv",
        json=directory / f"{stem}.json",
        chart=directory / f"{stem}.png",
        markdown=directory / f"{stem}.md",
    )
    report.statistics_frame().to_csv(files.csv, index=False)
    files.json.write_text(json.dumps(report_json(report), indent=2) + "\n")
    files.markdown.write_text(
        markdown_table(report)
        + "\n```yaml\n"
        + policy_snippet(report)
        + "```\n"
        + "".join("\n" + section for section in sections)
    )
    plot_durations(report, files.chart)
    return files


def _stamp(moment) -> str:
    return f"{moment:%Y-%m-%d}" if (moment.hour, moment.minute) == (0, 0) else f"{moment:%Y-%m-%dT%H%M}"


def plot_durations(report: DurationReport, path: Path | str) -> Path:
    """One panel per type: successful durations on a log axis, current T2 red, suggested T2 green."""
    from matplotlib.figure import (
        Figure,  # Agg canvas, no pyplot state: safe in any process or thread
    )

    path = Path(path)
    count = max(len(report.types), 1)
    rows = math.ceil(count / CHART_COLUMNS)
    columns = min(count, CHART_COLUMNS)
    height = 3.4 * rows + 0.8
    figure = Figure(figsize=(5.2 * columns, height))
    figure.subplots_adjust(left=0.07, right=0.98, bottom=0.6 / height, top=1 - 0.9 / height, hspace=0.6, wspace=0.25)
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    q = percentile_name(report.rules.quantile)
    for ax, entry in zip(axes, report.types):
        durations = np.clip(entry.success_durations.astype(np.float64), 0.01, None)
        marks = [entry.current_t2_seconds, entry.suggested_t2_seconds]
        low = max(min(durations.min() if durations.size else 1.0, 1.0), 0.01)
        high = max([durations.max() if durations.size else 1.0, *marks]) * 1.5
        bins = np.geomspace(low, high, 50)
        if durations.size:
            ax.hist(
                durations,
                bins=bins,
                histtype="stepfilled",
                color="#4c72b0",
                alpha=0.85,
                label=f"{durations.size} successful",
            )
        if entry.stopped_durations.size:
            ax.hist(
                np.clip(entry.stopped_durations.astype(np.float64), low, None),
                bins=bins,
                histtype="stepfilled",
                color="#c44e52",
                alpha=0.7,
                label=f"{entry.stopped_durations.size} stopped at T2",
            )
        ax.axvline(
            entry.current_t2_seconds,
            color="#c44e52",
            linestyle="--",
            linewidth=1.6,
            label=f"current T2 {format_duration(entry.current_t2_seconds)}",
        )
        if entry.enough_data:
            ax.axvline(
                entry.suggested_t2_seconds,
                color="#2ca02c",
                linewidth=2.0,
                label=f"suggested T2 {format_duration(entry.suggested_t2_seconds)}",
            )
            ax.axvline(
                entry.quantile_seconds,
                color="0.35",
                linestyle=":",
                linewidth=1.2,
                label=f"{q} {format_duration(entry.quantile_seconds)}",
            )
        title = entry.job_type + ("  (censored)" if entry.censored else "")
        if not entry.enough_data:
            title += "  (not enough data)"
        ax.set_title(title, fontsize=10)
        ax.set_xscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1) * 1.6)  # headroom: the legend sits above the bars
        ax.minorticks_off()  # each minor tick is an artist to draw, and time ticks say more
        ticks = [tick for tick in _TIME_TICKS if low <= tick <= high]
        ax.set_xticks(ticks, [_TIME_TICKS[tick] for tick in ticks])
        ax.set_xlabel("duration (log scale)")
        ax.set_ylabel("jobs")
        ax.legend(fontsize=7, loc="upper left")
    for ax in axes[len(report.types) :]:
        ax.set_visible(False)
    figure.suptitle(f"Successful job durations per type, {window_text(report)}", fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    return path
