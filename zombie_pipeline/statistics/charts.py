"""The durations of each type, and the heartbeat gaps, as pictures: a text chart for the UI's metadata, a PNG for the
report files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from zombie_pipeline.statistics.analysis import DurationReport, TypeReport
from zombie_pipeline.statistics.formatting import format_duration, window_text
from zombie_pipeline.statistics.gap_histogram import GapHistogram, upper_edge_seconds
from zombie_pipeline.statistics.heartbeat_timeout import HeartbeatTimeoutSuggestion
from zombie_pipeline.statistics.quantiles import percentile_name

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
        if entry.enough_data and entry.quantile_seconds is not None:  # censored, a type may have no success
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


#: Bin edges of the gaps' text chart, in seconds: fine around a minute, where heartbeats come; each an edge of the
#: gap histograms' buckets (whole seconds), so every bin's count is exact.
GAP_CHART_EDGES = (0, 1, 2, 5, 10, 20, 30, 45, 55, 60, 65, 75, 90, 120, 180, 240, 300, 450, 600, 900, 1_800, 3_600)


_GAP_TICKS = (1, 10, 30, 60, 120, 300, 600, 1_800, 3_600, 36_000, 86_400)


def _gap_bin(seconds: float) -> int:
    return max(int(np.searchsorted(GAP_CHART_EDGES, seconds, side="left")) - 1, 0)


def gap_chart(suggestion: HeartbeatTimeoutSuggestion, width: int = CHART_BAR_WIDTH) -> str:
    """Every observed gap in one text histogram (bins closed on the right, as the buckets), the timeouts marked."""
    gaps = GapHistogram()
    for row in suggestion.rows:
        gaps = gaps + row.tally.gaps
    counts = np.zeros(len(GAP_CHART_EDGES), dtype=np.int64)
    for key, count in gaps.counts.items():
        counts[_gap_bin(upper_edge_seconds(key))] += count
    lines = [f"{gaps.count:,} heartbeat gaps of {len(suggestion.rows)} job types and worker sizes"]
    marks: dict[int, list[str]] = {}
    named = [("current", suggestion.current_seconds), ("deployment's", suggestion.deployment_seconds)]
    if suggestion.lowering:
        named.append(("suggested", suggestion.suggested_seconds))
    for name, seconds in named:
        if seconds is not None:
            marks.setdefault(_gap_bin(seconds), []).append(f"{name} {format_duration(seconds)}")
    shown = [index for index, count in enumerate(counts) if count] + list(marks)
    first, last = min(shown), max(shown)
    largest = max(int(counts.max()), 1)
    labels = [
        f"{format_duration(GAP_CHART_EDGES[index])} – "
        + (format_duration(GAP_CHART_EDGES[index + 1]) if index + 1 < len(GAP_CHART_EDGES) else "more")
        for index in range(first, last + 1)
    ]
    label_width, count_width = max(map(len, labels)), len(f"{largest:,}")
    for index, label in zip(range(first, last + 1), labels):
        count = int(counts[index])
        line = f"{label:<{label_width}} {count:>{count_width},} {_bar(count, largest, width)}"
        if index in marks:
            line += ("  " if count else "") + "◀ " + ", ".join(marks[index])
        lines.append(line.rstrip())
    return "```text\n" + "\n".join(lines) + "\n```"


def plot_gaps(suggestion: HeartbeatTimeoutSuggestion, title: str, path: Path | str) -> Path:
    """One panel per job type and worker size: its gaps and its finished jobs' longest silences on log axes, the
    current timeout red, the suggested one green, the deployment's grey, the quantile's bound dotted."""
    from matplotlib.figure import Figure

    path = Path(path)
    count = max(len(suggestion.rows), 1)
    rows, columns = math.ceil(count / CHART_COLUMNS), min(count, CHART_COLUMNS)
    height = 3.4 * rows + 0.8
    figure = Figure(figsize=(5.2 * columns, height))
    figure.subplots_adjust(left=0.07, right=0.98, bottom=0.6 / height, top=1 - 0.9 / height, hspace=0.6, wspace=0.25)
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    q = percentile_name(suggestion.rules.quantile)
    marks = [suggestion.current_seconds, suggestion.suggested_seconds, suggestion.deployment_seconds or 1]
    for ax, row in zip(axes, suggestion.rows):
        series = [
            (row.tally.gaps, "#4c72b0", f"{row.gaps:,} gaps"),
            (row.tally.finished, "#dd8452", f"{row.tally.finished.count:,} finished jobs' longest silence"),
        ]
        shortest = min(
            [upper_edge_seconds(key) for key in (*row.tally.gaps.counts, *row.tally.finished.counts)]
            + [suggestion.interval_seconds]
        )
        low, high = max(shortest / 2, 0.1), max(row.tally.gaps.longest, row.tally.finished.longest, *marks) * 1.5
        bins = np.geomspace(low, high, 60)
        for histogram, color, label in series:
            if histogram.count:
                values = [min(upper_edge_seconds(key), histogram.longest) for key in histogram.counts]
                ax.hist(
                    values,
                    bins=bins,
                    weights=list(histogram.counts.values()),
                    histtype="stepfilled",
                    color=color,
                    alpha=0.7,
                    label=label,
                )
        ax.axvline(
            suggestion.current_seconds,
            color="#c44e52",
            linestyle="--",
            linewidth=1.6,
            label=f"current {format_duration(suggestion.current_seconds)}",
        )
        if suggestion.lowering:
            ax.axvline(
                suggestion.suggested_seconds,
                color="#2ca02c",
                linewidth=2.0,
                label=f"suggested {format_duration(suggestion.suggested_seconds)}",
            )
        if suggestion.deployment_seconds is not None:
            ax.axvline(
                suggestion.deployment_seconds,
                color="0.5",
                linestyle="-.",
                linewidth=1.2,
                label=f"deployment's {format_duration(suggestion.deployment_seconds)}",
            )
        if row.bound is not None:
            ax.axvline(
                row.bound, color="0.2", linestyle=":", linewidth=1.2, label=f"{q} bound {format_duration(row.bound)}"
            )
        ax.set_title(row.name.replace("`", "") + ("" if row.bound is not None else "  (too few gaps)"), fontsize=10)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(0.5, max(ax.get_ylim()[1], 1) * 50)  # headroom: the legend sits above the bars
        ax.minorticks_off()
        ticks = [tick for tick in _GAP_TICKS if low <= tick <= high]
        ax.set_xticks(ticks, [format_duration(tick) for tick in ticks])
        ax.set_xlabel("silence between signs of life (log scale)")
        ax.set_ylabel("gaps or jobs (log scale)")
        ax.legend(fontsize=7, loc="upper left")
    for ax in axes[len(suggestion.rows) :]:
        ax.set_visible(False)
    figure.suptitle(f"Heartbeat gaps per job type and worker size, {title}", fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    return path
